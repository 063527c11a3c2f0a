"""Scenario files: a ``vllm serve`` deployment plus its traffic, typed and
validated once at load.  Field names follow vLLM's where vLLM has one.

Defaults are ``vllm serve``'s (retention 0, EAGLE by lookahead block hashes),
unlike case files, which default to the manager as vLLM's unit tests build it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.cache.config import canonical_key, canonical_path
from sim.config.backend import BackendSection
from sim.config.cache import CacheSection
from sim.errors import ConfigError, InputError
from sim.config.fields import build_section, check_int, control_problem, show
from sim.config.gpu import GPUSection
from sim.config.kv_cache import KVCacheSection
from sim.config.kv_events import KVEventsSection
from sim.config.loader import field_lines, loads_yaml, read_text
from sim.config.scheduler import SchedulerConfig, build_scheduler
from sim.config.slo import SLOSection
from sim.config.speculative import SpeculativeSection

TOP_KEYS = {"name", "description", "seed", "model", "kv_cache", "gpu", "cache", "scheduler",
            "speculative", "workload", "backend", "output", "slo", "kv_events", "attribution",
            "cluster", "kv_offloading"}


class ScenarioError(InputError):
    """One line: file, field, what is wrong."""


@dataclass(frozen=True)
class Scenario:
    path: Path
    name: str
    description: str
    seed: int
    model: Any                  # sim.models.spec.ModelSpec
    kv_cache: KVCacheSection
    gpu: GPUSection
    cache: CacheSection
    scheduler: SchedulerConfig
    speculative: SpeculativeSection
    workload: dict
    backend: BackendSection
    output: str | None = None
    slo: SLOSection = field(default_factory=SLOSection)
    kv_events: KVEventsSection = field(default_factory=KVEventsSection)
    # miss attribution (requests.csv *_tokens classes, summary miss_*): false turns it off
    attribution: bool = True
    # a fleet of replicas behind a router (sim/cluster/config.py); None: one replica
    cluster: Any = None
    # the CPU tier (sim/config/kv_offloading.py): None when off (absent or size_gb 0)
    kv_offloading: Any = None
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


def scenario_message(scenario, e: Exception, overrides: dict | None) -> str:
    """The one line of a scenario's input error: a ``ConfigError`` found once the layout
    is built (no file in it yet) gets ``load_scenario``'s ``file:line:`` / ``file: --set``
    prefix; a ``ScenarioError`` already names its file."""
    if isinstance(e, ConfigError):
        return f"{where(scenario, e.field_name, overrides)}{e}"
    return str(e)


def where(path, field_name: str, overrides: dict | None = None, label: str = "--set") -> str:
    """The ``file:line: `` / ``file: --set `` prefix of a field's error found after loading
    (building the deployment checks what only the whole layout can), as ``load_scenario``
    prefixes one found while loading."""
    try:
        text = read_text(path)
    except InputError:
        text = ""
    return _where(path, text, field_name, overrides, label)


def _where(path, text: str, field_name: str, overrides: dict | None, label: str) -> str:
    """``file:line: `` for a field written in the file, ``file: --set `` for one set on
    the command line (or inside a section set there; ``label`` names where)."""
    field_name = canonical_path(field_name)
    set_here = f"{path}: {label} " if label else f"{path}: "
    sets = [canonical_path(str(d)) for d in overrides or {}]
    for dotted in sets:
        if field_name == dotted or field_name.startswith(dotted + "."):
            return set_here
    lines = {canonical_path(k): v for k, v in field_lines(text).items()}
    # a section the file does not have, created by a field set under it (--set nosuch.x=1)
    if field_name not in lines and any(d.startswith(field_name + ".") for d in sets):
        return set_here
    parts = field_name.split(".")
    while parts:
        line = lines.get(".".join(parts))
        if line is not None:
            return f"{path}:{line}: "
        parts.pop()
    return f"{path}: "


def apply_overrides(data: dict, overrides: dict) -> dict:
    """Set dotted paths (``cache.hash_block_size``) in a copy of ``data``."""
    import copy

    out = copy.deepcopy(data)
    for dotted, value in overrides.items():
        cur = out
        if not isinstance(dotted, str) or not dotted or any(not p for p in dotted.split(".")):
            raise ConfigError(str(dotted), "not a dotted field path (like cache.hash_block_size)")
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            nxt = cur.get(part)
            if nxt is None:
                nxt = cur[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(dotted, f"{'.'.join(parts[:i + 1])} is {show(nxt)}, not a "
                                  f"section with fields")
            cur = nxt
        leaf = canonical_key(parts[-1])
        for k in [k for k in cur if isinstance(k, str) and k != parts[-1]
                  and canonical_key(k) == leaf]:
            del cur[k]              # the file spelled the field by another name (ALIASES)
        cur[parts[-1]] = value
    return out


def scenario_from_mapping(data, path: Path) -> Scenario:
    from sim.models.catalogue import get_model, model_from_mapping
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
    elif control_problem(str(name)):
        raise ConfigError("name", control_problem(str(name)))
    elif str(name) in (".", "..") or "/" in str(name) or "\\" in str(name):
        # the name is the run folder's name under runs/; a path belongs in output: / --out
        raise ConfigError("name", f"must be a plain folder name (no '/', not '.' or '..'), got "
                          f"{show(name)}; to write elsewhere use output: or --out")
    desc = data.get("description", "")
    if desc is not None and not isinstance(desc, str):
        raise ConfigError("description", f"must be a string, got {show(desc)}")
    if desc and control_problem(desc, allow="\n\t"):
        raise ConfigError("description", control_problem(desc, allow="\n\t"))
    seed = data.get("seed", 0)
    check_int("", "seed", seed, 0)
    if "model" not in data:
        raise ConfigError("model", "missing (a catalogue name, see `sim model --list`, or a mapping)")
    m = data["model"]
    try:
        model = get_model(m) if isinstance(m, str) else model_from_mapping(m)
    except KeyError as e:
        raise ConfigError("model", str(e.args[0]) if e.args else str(e)) from None
    except (ValueError, TypeError) as e:
        msg = str(e).removeprefix("model: ")
        head, sep, rest = msg.partition(": ")
        if sep and head.isidentifier() and isinstance(m, dict):
            raise ConfigError(f"model.{head}", rest) from None
        raise ConfigError("model", msg) from None
    kv = build_section(KVCacheSection, data.get("kv_cache"), "kv_cache.")
    kv.validate()
    g = data.get("gpu", {})
    if isinstance(g, str):
        g = {"type": g}
    gpu = build_section(GPUSection, g, "gpu.")
    gpu.validate()
    if gpu.count % kv.tensor_parallel_size:
        raise ConfigError("gpu.count", f"{gpu.count} GPUs cannot hold tensor_parallel_size "
                          f"{kv.tensor_parallel_size} x whole pipeline stages")
    stages = gpu.count // kv.tensor_parallel_size
    if stages > model.num_layers:
        # (vLLM splits the layers over the pipeline stages, at least one a stage)
        raise ConfigError("gpu.count", f"{gpu.count:,} GPUs at tensor_parallel_size "
                          f"{kv.tensor_parallel_size} are {stages:,} pipeline stages, more "
                          f"than the model's {model.num_layers} layers (vLLM gives every "
                          f"stage at least one layer)")
    cache = CacheSection.from_mapping(data.get("cache") or {})
    sched_in = data.get("scheduler") or {}
    if not isinstance(sched_in, dict):
        raise ConfigError("scheduler", f"expected a mapping of fields, got {show(sched_in)}")
    sched_in = dict(sched_in)
    chunked = sched_in.pop("enable_chunked_prefill", True)
    if chunked is not True:
        raise ConfigError("scheduler.enable_chunked_prefill",
                          "must be true: mamba_cache_mode align requires chunked prefill")
    sched = build_scheduler(sched_in, "scheduler.", "scenario")
    if sched.num_speculative_tokens:
        raise ConfigError("scheduler.num_speculative_tokens", "set it under speculative:")
    spec = build_section(SpeculativeSection, data.get("speculative"), "speculative.")
    spec.validate()
    kv.check_layout(model, spec, gpu_type=gpu.type)
    sched = replace(sched, num_speculative_tokens=spec.num_speculative_tokens if spec.method else 0)
    backend = build_section(BackendSection, data.get("backend"), "backend.")
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
    slo = build_section(SLOSection, data.get("slo"), "slo.")
    slo.validate()
    attribution = data.get("attribution", True)
    if not isinstance(attribution, bool):
        raise ConfigError("attribution", f"must be true or false, got {show(attribution)}")
    from sim.cluster.config import parse_cluster

    cluster = parse_cluster(data.get("cluster"))
    from sim.config.kv_offloading import KVOffloadingSection

    offload = KVOffloadingSection.from_value(data.get("kv_offloading"))
    return Scenario(path=path, name=str(name), description=desc or "",
                    seed=seed, model=model, kv_cache=kv, gpu=gpu, cache=cache, scheduler=sched,
                    speculative=spec, workload=wl, backend=backend, output=out, slo=slo,
                    kv_events=KVEventsSection.from_value(data.get("kv_events")),
                    attribution=attribution, cluster=cluster,
                    kv_offloading=offload if offload.enabled else None, raw=data)
