"""Scenario files: a ``vllm serve`` deployment plus its traffic, typed and
validated once at load.  Field names follow vLLM's where vLLM has one.

Defaults are ``vllm serve``'s (retention 0, EAGLE by lookahead block hashes),
unlike case files, which default to the manager as vLLM's unit tests build it.
"""
from __future__ import annotations

from sim.config.errors import InputError

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from sim.cache.config import ConfigError
from sim.engine.scheduler import SchedulerConfig
from sim.policies import CacheSection, SpecDecode

TOP_KEYS = {"name", "description", "seed", "model", "kv_cache", "gpu", "cache", "scheduler",
            "speculative", "workload", "backend", "output"}


class ScenarioError(InputError):
    """One line: file, field, what is wrong."""


def _section(cls, data, prefix: str, aliases: dict | None = None):
    """Build a frozen dataclass from a mapping, rejecting unknown keys."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(prefix.rstrip("."), "expected a mapping")
    names = {f.name for f in fields(cls)}
    kw = {}
    for k, v in data.items():
        name = (aliases or {}).get(k, k)
        if name not in names:
            raise ConfigError(prefix + k, f"unknown key (known: {', '.join(sorted(names))})")
        kw[name] = v
    return cls(**kw)


def _int(prefix, name, v, lo=0, allow_none=False):
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(prefix + name, f"must be an integer >= {lo}, got {v!r}")


def _num(prefix, name, v, lo=0.0, hi=None, allow_none=False):
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(prefix + name, f"must be a number {rng}, got {v!r}")


@dataclass(frozen=True)
class KVCacheSection:
    """How vLLM lays out the KV cache for the model (see ``sim model NAME``)."""

    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    kernel_block_size: int = 16
    block_size: int | None = None            # override the derived attention/Mamba block
    num_gpu_blocks_override: int | None = None

    def validate(self, p="kv_cache."):
        _int(p, "tensor_parallel_size", self.tensor_parallel_size, 1)
        _int(p, "kernel_block_size", self.kernel_block_size, 1)
        _int(p, "block_size", self.block_size, 1, allow_none=True)
        _int(p, "num_gpu_blocks_override", self.num_gpu_blocks_override, 2, allow_none=True)


@dataclass(frozen=True)
class GPUSection:
    type: str = "H200"
    count: int = 1
    gpu_memory_utilization: float = 0.9

    def validate(self, p="gpu."):
        _int(p, "count", self.count, 1)
        _num(p, "gpu_memory_utilization", self.gpu_memory_utilization, 0.01, 1.0)


@dataclass(frozen=True)
class SpeculativeSection:
    method: str | None = None                # eagle | eagle3 | mtp
    num_speculative_tokens: int = 0
    mean_accepted_tokens: float = 0.0        # drafts accepted per decode step
    num_mtp_modules: int = 1                 # >1 with k>1: multi-module MTP (vLLM's rule)

    def validate(self, p="speculative."):
        if self.method not in (None, "eagle", "eagle3", "mtp"):
            raise ConfigError(p + "method", f"must be eagle, eagle3 or mtp, got {self.method!r}")
        _int(p, "num_speculative_tokens", self.num_speculative_tokens, 0)
        _num(p, "mean_accepted_tokens", self.mean_accepted_tokens, 0.0,
             float(self.num_speculative_tokens))
        _int(p, "num_mtp_modules", self.num_mtp_modules, 1)
        if self.method and self.num_speculative_tokens == 0:
            raise ConfigError(p + "num_speculative_tokens", f"must be >= 1 with method {self.method}")

    def spec_decode(self) -> SpecDecode:
        multi = (self.method == "mtp" and min(self.num_mtp_modules, self.num_speculative_tokens) > 1)
        return SpecDecode(self.method, self.num_speculative_tokens if self.method else 0, multi)


@dataclass(frozen=True)
class BackendSection:
    kind: str = "analytical"      # analytical | torch
    mfu: float = 0.5              # achieved fraction of peak FLOP/s
    mbu: float = 0.7              # achieved fraction of HBM bandwidth
    overhead_s: float = 0.004     # fixed per-step cost (scheduling, launch)
    profile: str | None = None    # calibration profile (YAML) overriding the three above
    # torch backend: the model's layer stack, optionally scaled down for CPU runs
    layers: int | None = None     # first N layers of the pattern (default: all)
    width_div: int = 1            # divide widths and head counts by this
    dtype: str = "float32"        # float32 | bfloat16 (the SSM state stays float32)
    device: str = "auto"          # auto (cuda when present) | cpu | cuda
    verify: bool = False          # compare every resumed prefill with a from-scratch one

    def validate(self, p="backend."):
        if self.kind not in ("analytical", "torch"):
            raise ConfigError(p + "kind", f"unknown backend {self.kind!r} (available: analytical, torch)")
        _int(p, "layers", self.layers, 1, allow_none=True)
        _int(p, "width_div", self.width_div, 1)
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(p + "dtype", f"must be float32 or bfloat16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(p + "device", f"must be auto, cpu or cuda, got {self.device!r}")
        if not isinstance(self.verify, bool):
            raise ConfigError(p + "verify", f"must be true or false, got {self.verify!r}")
        _num(p, "mfu", self.mfu, 1e-6, 1.0)
        _num(p, "mbu", self.mbu, 1e-6, 1.0)
        _num(p, "overhead_s", self.overhead_s, 0.0)


@dataclass(frozen=True)
class Scenario:
    path: Path
    name: str
    description: str
    seed: int
    model: Any                  # sim.models.ModelSpec
    kv_cache: KVCacheSection
    gpu: GPUSection
    cache: CacheSection
    scheduler: SchedulerConfig
    speculative: SpeculativeSection
    workload: dict
    backend: BackendSection
    output: str | None = None
    raw: dict = field(default_factory=dict, repr=False)


def load_scenario(path: str | Path, overrides: dict | None = None) -> Scenario:
    """Load and validate; raises ``ScenarioError`` with ``file: field: problem``."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ScenarioError(f"{path}:{line} not valid YAML: {getattr(e, 'problem', e)}") from None
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return scenario_from_mapping(data, p)
    except ConfigError as e:
        raise ScenarioError(f"{path}: {e}") from None


def apply_overrides(data: dict, overrides: dict) -> dict:
    """Set dotted paths (``cache.prefix_match_unit``) in a copy of ``data``."""
    import copy

    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        cur = out
        parts = dotted.split(".")
        for part in parts[:-1]:
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(dotted, f"{part} is not a section")
            cur = nxt
        cur[parts[-1]] = value
    return out


def scenario_from_mapping(data, path: Path) -> Scenario:
    from sim import models
    from workloads import WorkloadError, load_config

    if not isinstance(data, dict):
        raise ConfigError("top level", "expected a mapping")
    for k in data:
        if k not in TOP_KEYS:
            raise ConfigError(k, f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = data.get("name") or path.stem
    seed = data.get("seed", 0)
    _int("", "seed", seed, 0)
    if "model" not in data:
        raise ConfigError("model", "missing (a catalogue name, see `sim model --list`, or a mapping)")
    m = data["model"]
    try:
        model = models.get_model(m) if isinstance(m, str) else models.model_from_mapping(m)
    except KeyError as e:
        raise ConfigError("model", str(e.args[0]) if e.args else str(e)) from None
    except ValueError as e:
        raise ConfigError("model", str(e)) from None
    kv = _section(KVCacheSection, data.get("kv_cache"), "kv_cache.")
    kv.validate()
    g = data.get("gpu", {})
    if isinstance(g, str):
        g = {"type": g}
    gpu = _section(GPUSection, g, "gpu.")
    gpu.validate()
    if gpu.count % kv.tensor_parallel_size:
        raise ConfigError("gpu.count", f"{gpu.count} GPUs cannot hold tensor_parallel_size "
                          f"{kv.tensor_parallel_size} x whole pipeline stages")
    cache = CacheSection.from_mapping(data.get("cache") or {})
    sched_in = dict(data.get("scheduler") or {})
    chunked = sched_in.pop("enable_chunked_prefill", True)
    if chunked is not True:
        raise ConfigError("scheduler.enable_chunked_prefill",
                          "must be true: mamba_cache_mode align requires chunked prefill")
    sched = _section(SchedulerConfig, sched_in, "scheduler.")
    _int("scheduler.", "max_num_batched_tokens", sched.max_num_batched_tokens, 1)
    _int("scheduler.", "max_num_seqs", sched.max_num_seqs, 1)
    _int("scheduler.", "long_prefill_token_threshold", sched.long_prefill_token_threshold, 0)
    _int("scheduler.", "max_model_len", sched.max_model_len, 2, allow_none=True)
    if sched.max_model_len is not None and sched.long_prefill_token_threshold > sched.max_model_len:
        raise ConfigError("scheduler.long_prefill_token_threshold",
                          f"{sched.long_prefill_token_threshold} cannot be greater than "
                          f"max_model_len {sched.max_model_len} (vLLM rejects this)")
    if sched.max_num_batched_tokens < sched.max_num_seqs:
        raise ConfigError("scheduler.max_num_batched_tokens",
                          f"{sched.max_num_batched_tokens} is smaller than max_num_seqs "
                          f"{sched.max_num_seqs} (vLLM rejects this)")
    if sched.num_speculative_tokens:
        raise ConfigError("scheduler.num_speculative_tokens", "set it under speculative:")
    spec = _section(SpeculativeSection, data.get("speculative"), "speculative.")
    spec.validate()
    from dataclasses import replace

    sched = replace(sched, num_speculative_tokens=spec.num_speculative_tokens if spec.method else 0)
    backend = _section(BackendSection, data.get("backend"), "backend.")
    backend.validate()
    wl = data.get("workload")
    if not isinstance(wl, dict):
        raise ConfigError("workload", "missing or not a mapping (needs kind: ...)")
    try:
        load_config(wl)
    except WorkloadError as e:
        raise ConfigError("workload", str(e).removeprefix("workload.").removeprefix("workload: ")) \
            from None
    out = data.get("output")
    if out is not None and not isinstance(out, str):
        raise ConfigError("output", "must be a folder path")
    return Scenario(path=path, name=str(name), description=str(data.get("description", "")),
                    seed=seed, model=model, kv_cache=kv, gpu=gpu, cache=cache, scheduler=sched,
                    speculative=spec, workload=wl, backend=backend, output=out, raw=data)
