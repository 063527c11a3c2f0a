"""Request traces for the simulator.

``build_workload(cfg, seed, base_dir)`` validates a workload config (the
``workload:`` mapping of a scenario) and returns a lazy iterator of
:class:`TraceRequest` in non-decreasing arrival order (a follow-up turn, one
with ``after``, may come right after its session's earlier turn; its
``arrival_s`` is only a lower bound).  See ``workloads/README.md``.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any, Union

from workloads.base import Dist, TraceRequest, WorkloadError, is_int, output_stream, show
from workloads.jsonl import JsonlConfig, parse_prompt, write_jsonl
from workloads.synthetic import MultiTurnConfig, SystemPromptConfig
from workloads.traces import AzureConfig, MooncakeConfig, resolve

__all__ = [
    "AzureConfig", "Dist", "JsonlConfig", "KINDS", "MooncakeConfig", "MultiTurnConfig",
    "SystemPromptConfig", "TraceRequest", "WorkloadConfig", "WorkloadError", "build_workload",
    "describe", "load_config", "output_stream", "parse_prompt", "write_jsonl",
]

WorkloadConfig = Union[SystemPromptConfig, MultiTurnConfig, MooncakeConfig, AzureConfig, JsonlConfig]

#: ``kind`` → config class (each has ``from_mapping`` and ``describe``).
KINDS: dict[str, type] = {c.KIND: c for c in (
    SystemPromptConfig, MultiTurnConfig, MooncakeConfig, AzureConfig, JsonlConfig)}

WHERE = "workload"

#: The one table of old field names still accepted (deprecated, README "Deprecated names"):
#: old name -> the name it now has, for every kind.  ``num_requests`` is the one name for
#: how many requests a workload issues (the traces' first N records, system_prompt's
#: requests, multi_turn's requests in all).
RENAMED: dict[str, str] = {"limit": "num_requests"}


def canonical_names(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``cfg`` with every old name of :data:`RENAMED` under its new one.  An old name set
    to null counts as absent (so ``--requests`` can clear it); both names set is an error."""
    out = dict(cfg)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        value = out.pop(old)
        if value is None:
            continue
        if out.get(new) is not None:
            raise WorkloadError(f"{WHERE}.{old}: the old name of {WHERE}.{new}, which is set "
                                f"too; give only {new}")
        out[new] = value
    return out


def load_config(cfg: Mapping[str, Any]) -> WorkloadConfig:
    """Validate a workload mapping and return its typed config.  Raises
    :class:`WorkloadError` naming the field as ``workload.<field>``."""
    if not isinstance(cfg, Mapping):
        raise WorkloadError(f"{WHERE}: expected a mapping with a 'kind', got {show(cfg)}")
    kind = cfg.get("kind")
    if kind is None:
        raise WorkloadError(f"{WHERE}.kind: missing (one of {', '.join(KINDS)})")
    if kind not in KINDS:
        raise WorkloadError(f"{WHERE}.kind: must be one of {', '.join(KINDS)}, got {show(kind)}")
    config = KINDS[kind].from_mapping(canonical_names(cfg), WHERE)
    for key in ("num_requests", "num_sessions", "limit"):
        if getattr(config, key, None) == 0:
            raise WorkloadError(f"{WHERE}.{key}: 0 makes the workload empty (give at least 1)")
    return config


def build_workload(cfg: Mapping[str, Any], seed: int, base_dir: Path | str | None = None
                   ) -> Iterator[TraceRequest]:
    """Validate ``cfg`` up front (and check that a trace file exists), then return a
    lazy generator of requests.  Relative trace paths resolve against ``base_dir``
    (default: the current directory).  Synthetic kinds are deterministic given ``seed``;
    trace kinds ignore it.  Errors in a trace line surface while iterating, as a
    :class:`WorkloadError` ``"<path>:<lineno>: <what>"``."""
    config = load_config(cfg)
    if not is_int(seed):
        raise WorkloadError(f"seed: expected an integer, got {show(seed)}")
    if isinstance(config, (SystemPromptConfig, MultiTurnConfig)):
        return _nonempty(config.requests(int(seed)),
                         f"{WHERE}.duration_s: no request arrives within it: the workload is empty")
    where = str(resolve(config.path, Path(base_dir) if base_dir is not None else None))
    return _nonempty(config.requests(Path(base_dir) if base_dir is not None else None),
                     f"{where}: the trace holds no requests (an empty file, blank lines only or a "
                     f"header only)")


def _nonempty(reqs: Iterator[TraceRequest], message: str) -> Iterator[TraceRequest]:
    """The requests of ``reqs``, lazily; a workload that yields none is a
    ``WorkloadError`` (a run of no requests has no TTFT, no hit rate: nothing to
    report).  Only the first request passes through a generator here: the rest come
    straight from ``reqs`` (``chain``), with no frame of ours per request."""
    it = iter(reqs)

    def first() -> Iterator[TraceRequest]:
        for r in it:
            yield r
            return
        raise WorkloadError(message)

    return chain(first(), it)


def describe(cfg: Mapping[str, Any] | WorkloadConfig) -> str:
    """One line describing the workload, for reports."""
    config = cfg if isinstance(cfg, tuple(KINDS.values())) else load_config(cfg)
    return config.describe()
