"""``sim compare``: one scenario with a boolean field off and on, same seed, paired
per request (hit, TTFT) with a table of summary deltas."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

import csv
from pathlib import Path

from sim.rundir.atomic import atomic_folder
from sim.errors import ConfigError


def resolve_flag(scenario_path: Path, flag: str) -> str:
    """A bare field name (``enable_mamba_shared_prefix_checkpoint``) or a dotted path, which
    must name a boolean field of a scenario section (checked here, up front)."""
    dotted = flag if "." in flag else _find_flag(scenario_path, flag)
    _check_boolean(dotted, flag)
    return dotted


def _sections() -> dict:
    from sim.config.backend import BackendSection
    from sim.config.cache import CacheSection
    from sim.config.gpu import GPUSection
    from sim.config.kv_cache import KVCacheSection
    from sim.config.scheduler import SchedulerConfig
    from sim.config.speculative import SpeculativeSection

    return {"cache": CacheSection, "speculative": SpeculativeSection, "kv_cache": KVCacheSection,
            "backend": BackendSection, "gpu": GPUSection, "scheduler": SchedulerConfig}


def _find_flag(scenario_path: Path, flag: str) -> str:
    from sim.errors import InputError
    from sim.config.loader import load_file
    from sim.config.scenario import ScenarioError

    try:
        data = load_file(scenario_path, ScenarioError, fmt="yaml") or {}
    except InputError:
        data = {}               # load_scenario reports the file's own problem
    if isinstance(data, dict):
        for section in ("cache", "scheduler", "speculative", "kv_cache", "backend", "gpu"):
            if isinstance(data.get(section), dict) and flag in data[section]:
                return f"{section}.{flag}"
    from sim.config.cache import CacheSection

    if flag in CacheSection.__dataclass_fields__:
        return f"cache.{flag}"
    raise ConfigError(f"--flag {flag}", "no such field in the scenario (give a dotted path like "
                      "cache.FIELD)")


def _check_boolean(dotted: str, flag: str) -> None:
    from sim.cache.config import canonical_key
    from sim.config.fields import field_kinds

    parts = dotted.split(".")
    sections = _sections()
    if len(parts) != 2 or parts[0] not in sections or not all(parts):
        raise ConfigError(f"--flag {flag}", f"not a field of a scenario section (give SECTION."
                          f"FIELD with SECTION one of {', '.join(sorted(sections))})")
    section, name = parts
    kinds = field_kinds(sections[section], canonical_key(name))
    if kinds is None:
        raise ConfigError(f"--flag {flag}", f"{section} has no field {show(name)}")
    if kinds != {"bool"}:
        raise ConfigError(f"--flag {flag}", f"{dotted} is not a boolean field ({' or '.join(sorted(kinds))}); "
                          f"compare runs a true/false field off and on")


def compare(scenario_path: Path, flag: str, out: Path, sets: dict | None = None,
            command: list[str] | None = None) -> dict:
    from sim.commands.run import simulate, write_run
    from sim.config.scenario import load_scenario

    dotted = resolve_flag(scenario_path, flag)
    runs = {}
    for value in (False, True):
        over = dict(sets or {})
        over[dotted] = value
        sc = load_scenario(scenario_path, over)
        cur = sc.raw
        for part in dotted.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        runs[value] = (sc, *simulate(sc))
    with atomic_folder(out, kind="compare") as tmp:
        for value, name in ((False, "off"), (True, "on")):
            sc, dep, rows, summary = runs[value]
            write_run(tmp / name, sc, dep, rows, summary, report=True, command=command)
        off_rows = {r.request_id: r for r in runs[False][2]}     # (in arrival order)
        on_rows = {r.request_id: r for r in runs[True][2]}
        with open(tmp / "paired.csv", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["request_id", "prompt_tokens", "hit_off", "hit_on", "hit_delta",
                        "lost_off", "lost_on", "ttft_off_s", "ttft_on_s", "ttft_delta_s"])
            for rid, a in off_rows.items():
                b = on_rows.get(rid)
                if b is None:
                    continue
                w.writerow([rid, a.prompt_tokens, a.hit_tokens, b.hit_tokens,
                            b.hit_tokens - a.hit_tokens, a.lost_tokens, b.lost_tokens,
                            f"{a.ttft_s:.6f}", f"{b.ttft_s:.6f}", f"{b.ttft_s - a.ttft_s:.6f}"])
        s0, s1 = runs[False][3], runs[True][3]
        keys = ["token_hit_rate", "request_hit_rate", "lost_token_rate", "ttft_mean_s",
                "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s",
                "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions"]
        with open(tmp / "summary_deltas.csv", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["metric", "off", "on", "delta", "relative"])
            for k in keys:
                a, b = s0[k], s1[k]
                rel = (b - a) / a if a else float("nan")
                w.writerow([k, f"{a:.6g}", f"{b:.6g}", f"{b - a:.6g}", f"{rel:.4g}"])
        improved = sum(1 for rid, a in off_rows.items()
                       if rid in on_rows and on_rows[rid].hit_tokens > a.hit_tokens)
        worse = sum(1 for rid, a in off_rows.items()
                    if rid in on_rows and on_rows[rid].hit_tokens < a.hit_tokens)
        from reports.compare_report import write_compare_report

        write_compare_report(tmp, dotted)   # compare.md, from the folder just written

    return {"flag": dotted, "off": s0, "on": s1, "improved": improved, "worse": worse}
