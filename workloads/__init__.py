"""Request traces for the simulator.

``build_workload(cfg, seed, base_dir)`` validates a workload config (the
``workload:`` mapping of a scenario) and returns a lazy iterator of
:class:`TraceRequest` in non-decreasing arrival order (a follow-up turn, one
with ``after``, may come right after its session's earlier turn; its
``arrival_s`` is only a lower bound).  See ``workloads/README.md``.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Union

from workloads.base import Dist, TraceRequest, WorkloadError, is_int, output_stream, show
from workloads.jsonl import JsonlConfig, parse_prompt, write_jsonl
from workloads.synthetic import MultiTurnConfig, SystemPromptConfig
from workloads.traces import AzureConfig, MooncakeConfig

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
    return KINDS[kind].from_mapping(cfg, WHERE)


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
        return config.requests(int(seed))
    return config.requests(Path(base_dir) if base_dir is not None else None)


def describe(cfg: Mapping[str, Any] | WorkloadConfig) -> str:
    """One line describing the workload, for reports."""
    config = cfg if isinstance(cfg, tuple(KINDS.values())) else load_config(cfg)
    return config.describe()
