"""The ``kv_events`` section of a scenario: vLLM's ``--kv-events-config``.

``kv_events: true`` is ``{enable_kv_cache_events: true}``.  The run then writes the KV
cache events vLLM 0.33.0 would publish (``kv_events.jsonl`` in the run folder, one batch
per engine step; ``sim/rundir/kv_events.py``).  ``report_mode`` is the ``kv_cache_report_mode``
every request asks for (vLLM's default ``incremental``; ``full`` re-announces prefix-cache
hits), ``fix_emit`` publishes the corrected stream instead of vLLM's (no keys the pool
never held, no ``IndexError``), ``msgpack`` also writes ``kv_events.msgpack``: the frames
vLLM's ZMQ publisher sends (needs the ``msgpack`` package), on ``topic``.  ``token_ids:
false`` leaves the events' token lists empty (they are most of the stream).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import ConfigError
from sim.config.fields import build_section, show


@dataclass(frozen=True)
class KVEventsSection:
    enable_kv_cache_events: bool = False
    report_mode: str | None = None
    fix_emit: bool = False
    msgpack: bool = False
    topic: str = ""
    token_ids: bool = True

    @classmethod
    def from_value(cls, value: Any, prefix: str = "kv_events.") -> "KVEventsSection":
        """A mapping of fields, or ``true`` / ``false`` / null for the switch alone."""
        if value is None or isinstance(value, bool):
            return cls(enable_kv_cache_events=bool(value))
        if not isinstance(value, dict):
            raise ConfigError(prefix.rstrip("."), f"expected true, false or a mapping of "
                              f"fields, got {show(value)}")
        sec = build_section(cls, value, prefix)
        sec.validate(prefix)
        return sec

    def validate(self, prefix: str = "kv_events.") -> None:
        if self.report_mode not in (None, "full", "incremental"):
            raise ConfigError(prefix + "report_mode",
                              f"must be full, incremental or null, got {show(self.report_mode)}")
        if self.msgpack:
            try:
                import msgpack  # noqa: F401
            except ImportError:
                raise ConfigError(prefix + "msgpack", "the msgpack package is not installed "
                                  "(pip install msgpack), or set it false") from None
