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

import math

from sim.cache.config import ConfigError
from sim.config.fields import _number_hint, build_section, show
from sim.config.loader import field_lines, loads_yaml, read_text
from sim.engine.scheduler import SchedulerConfig
from sim.policies import CacheSection, SpecDecode

TOP_KEYS = {"name", "description", "seed", "model", "kv_cache", "gpu", "cache", "scheduler",
            "speculative", "workload", "backend", "output"}


class ScenarioError(InputError):
    """One line: file, field, what is wrong."""


# SchedulerConfig may be compiled, which loses its annotations: its field types by hand
SCHEDULER_TYPES = {"max_num_batched_tokens": "int", "max_num_seqs": "int",
                   "long_prefill_token_threshold": "int", "num_speculative_tokens": "int",
                   "max_model_len": "int | None"}


def _section(cls, data, prefix: str, aliases: dict | None = None):
    """Build a frozen dataclass from a mapping, rejecting unknown keys and values of the
    wrong type (checked against the field annotations before construction)."""
    return build_section(cls, data, prefix, aliases,
                         SCHEDULER_TYPES if cls is SchedulerConfig else None)


def _int(prefix, name, v, lo=0, allow_none=False):
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        hint = _number_hint(v, True) if isinstance(v, str) else ""
        raise ConfigError(prefix + name, f"must be an integer >= {lo}, got {v!r}{hint}")


def _num(prefix, name, v, lo=0.0, hi=None, allow_none=False):
    if v is None and allow_none:
        return
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo
            or (hi is not None and v > hi)):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        hint = _number_hint(v, False) if isinstance(v, str) else ""
        raise ConfigError(prefix + name, f"must be a finite number {rng}, got {v!r}{hint}")


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
        if self.block_size is not None and self.block_size % self.kernel_block_size:
            k, b = self.kernel_block_size, self.block_size
            lo, hi = (b // k) * k, (b // k + 1) * k
            near = f"{lo} or {hi}" if lo else f"{hi}"
            raise ConfigError(p + "block_size", f"{b} is not a multiple of kernel_block_size {k} "
                              f"(vLLM builds the attention block from whole kernel blocks); use a "
                              f"multiple of {k}, e.g. {near}, or leave it unset to let vLLM derive it")

    def check_layout(self, model, spec: "SpeculativeSection", p="kv_cache.") -> None:
        """Derive the KV layout now (cheap), so a dtype, TP or block size the model cannot
        take fails before anything runs, naming the field."""
        from sim.models import derive_layout

        try:
            derive_layout(
                model, tp=self.tensor_parallel_size,
                num_speculative_tokens=spec.num_speculative_tokens if spec.method else 0,
                mamba_cache_dtype=self.mamba_cache_dtype,
                mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
                kv_cache_dtype=self.kv_cache_dtype, kernel_block_size=self.kernel_block_size,
                block_size=self.block_size,
                speculative_method=("mtp" if spec.method == "mtp"
                                    else ("eagle" if spec.method else "auto")))
        except ValueError as e:
            head, sep, rest = str(e).partition(": ")
            names = {"tp": p + "tensor_parallel_size", "speculative_method": "speculative.method",
                     "num_speculative_tokens": "speculative.num_speculative_tokens"}
            if sep and head in names:
                raise ConfigError(names[head], rest) from None
            if sep and head in {f.name for f in fields(self)}:
                raise ConfigError(p + head, rest) from None
            raise ConfigError(p.rstrip("."), str(e)) from None


@dataclass(frozen=True)
class GPUSection:
    type: str = "H200"
    count: int = 1
    gpu_memory_utilization: float = 0.9

    def validate(self, p="gpu."):
        from sim.gpus import get_gpu, gpu_names

        try:
            get_gpu(self.type)
        except KeyError:
            raise ConfigError(p + "type", f"unknown GPU {self.type!r} (known: "
                              f"{', '.join(gpu_names())})") from None
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


def load_scenario(path: str | Path, overrides: dict | None = None,
                  set_label: str = "--set") -> Scenario:
    """Load and validate; raises ``ScenarioError`` with ``file: field: problem``."""
    p = Path(path)
    text = read_text(p, ScenarioError)
    data = loads_yaml(text, str(path), ScenarioError)
    try:
        if overrides:
            if data is None:
                data = {}
            if not isinstance(data, dict):
                raise ConfigError("top level", f"expected a mapping of sections, got {show(data)}")
            data = apply_overrides(data, overrides)
        return scenario_from_mapping(data, p)
    except ConfigError as e:
        raise ScenarioError(_where(path, text, e.field_name, overrides, set_label) + str(e)) \
            from None


def _where(path, text: str, field_name: str, overrides: dict | None, label: str) -> str:
    """``file:line: `` for a field written in the file, ``file: --set `` for one set on
    the command line (or inside a section set there; ``label`` names where)."""
    for dotted in overrides or {}:
        if field_name == dotted or field_name.startswith(dotted + "."):
            return f"{path}: {label} " if label else f"{path}: "
    lines = field_lines(text)
    parts = field_name.split(".")
    while parts:
        line = lines.get(".".join(parts))
        if line is not None:
            return f"{path}:{line}: "
        parts.pop()
    return f"{path}: "


def apply_overrides(data: dict, overrides: dict) -> dict:
    """Set dotted paths (``cache.prefix_match_unit``) in a copy of ``data``."""
    import copy

    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        cur = out
        if not isinstance(dotted, str) or not dotted or any(not p for p in dotted.split(".")):
            raise ConfigError(str(dotted), "not a dotted field path (like cache.prefix_match_unit)")
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(dotted, f"{'.'.join(parts[:i + 1])} is {show(nxt)}, not a "
                                  f"section with fields")
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
            raise ConfigError(str(k), f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = data.get("name")
    if name is None:
        name = path.stem
    elif isinstance(name, bool) or not isinstance(name, (str, int)) or not str(name).strip():
        raise ConfigError("name", f"must be a non-empty string, got {show(name)}")
    desc = data.get("description", "")
    if desc is not None and not isinstance(desc, str):
        raise ConfigError("description", f"must be a string, got {show(desc)}")
    seed = data.get("seed", 0)
    _int("", "seed", seed, 0)
    if "model" not in data:
        raise ConfigError("model", "missing (a catalogue name, see `sim model --list`, or a mapping)")
    m = data["model"]
    try:
        model = models.get_model(m) if isinstance(m, str) else models.model_from_mapping(m)
    except KeyError as e:
        raise ConfigError("model", str(e.args[0]) if e.args else str(e)) from None
    except (ValueError, TypeError) as e:
        msg = str(e).removeprefix("model: ")
        head, sep, rest = msg.partition(": ")
        if sep and head.isidentifier() and isinstance(m, dict):
            raise ConfigError(f"model.{head}", rest) from None
        raise ConfigError("model", msg) from None
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
    sched_in = data.get("scheduler") or {}
    if not isinstance(sched_in, dict):
        raise ConfigError("scheduler", f"expected a mapping of fields, got {show(sched_in)}")
    sched_in = dict(sched_in)
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
    kv.check_layout(model, spec)
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
        msg = str(e)
        head, sep, rest = msg.partition(": ")
        if sep and (head == "workload" or head.startswith("workload.")) and " " not in head:
            raise ConfigError(head, rest) from None
        raise ConfigError("workload", msg) from None
    out = data.get("output")
    if out is not None and not isinstance(out, str):
        raise ConfigError("output", "must be a folder path")
    return Scenario(path=path, name=str(name), description=desc or "",
                    seed=seed, model=model, kv_cache=kv, gpu=gpu, cache=cache, scheduler=sched,
                    speculative=spec, workload=wl, backend=backend, output=out, raw=data)
