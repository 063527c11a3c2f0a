"""``sim marconi SCENARIO``: a scenario's traffic through Marconi's own cache model
(``sim.marconi.replay``), sized by the pool the scenario provisions, written as a folder
that reads like a run folder wherever that makes sense without timing.

Why a command of its own and not a ``cache.policy`` name: every entry of the cache-policy
registry (``sim/cache/policies``) builds a ``KVCacheManager`` that vLLM's scheduler drives
step by step; the reference is a different system -- a token-level radix tree replayed one
request at a time, in arrival order, with no scheduler, no engine and no clock.  As a policy
name it would be the one entry that ``build`` cannot serve, and ``sim run`` would need a
second code path that skips the engine and leaves every latency field empty.  A separate
command keeps the registry's contract whole and says plainly what it is.

What it writes (``--out``, atomically):

* ``requests.csv`` -- ``sim.rundir.records.REQUEST_COLUMNS``, one row per request in replay order:
  ``request_id, session, arrival_s`` (the workload's; for a follow-up turn a lower bound),
  ``prompt_tokens``, ``hit_tokens`` (the reference's hit), ``output_tokens``; every other
  column (timing, preemptions, the reconciliation and miss classes) is ``""``, as
  ``sim.rundir.records`` allows for a request with no measurement;
* ``summary.json`` -- the hit fields under ``sim.rundir.records``' names (``requests, prompt_tokens,
  hit_tokens, token_hit_rate, request_hit_rate, pool_bytes, evictions``) plus the
  reference's own (``variant``, ``budget_bytes``, ``states_admitted``, ``bytes_held``,
  ``flops_saved_fraction``, ``alpha``, ``alpha_tuned_after``); ``policy`` is
  ``marconi-reference`` and ``timing`` is ``null``: no TTFT, no throughput;
* ``report.md`` -- those numbers, headed as the reference model without timing.

The budget is the scenario's pool, ``num_gpu_blocks x block bytes`` (``pool_bytes`` of a
``sim run`` of the same scenario), unless a budget is given (``--budget``: then
``budget_bytes`` is that and ``pool_bytes`` still the pool); the costs are the scenario's
layout (its dtypes and tensor parallelism) and its model's layer shapes (for the rule
``flops: marconi``).  Requests are replayed in arrival order (``arrival_order``; a trace's
line order, as ``bench/marconi_reference.py`` replays Mooncake).

``rules`` (``sim.marconi.rules``; ``--rule``, ``--marconi-code``): set away from the default,
they are written to ``summary.json`` (``rules``: name -> value, the changed ones) and to
``report.md``; at the default neither file mentions them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.rundir import requests_csv
from sim.marconi.costs import CostModel, LayerFlops
from sim.marconi.replay import Result, replay
from sim.marconi.rules import DEFAULT, Rules
from sim.rundir.records import REQUEST_COLUMNS, RequestRecord

POLICY = "marconi-reference"
VARIANT_NAMES = {"vllm+": "vLLM+ (a state every 32-token block, LRU)",
                 "sglang+": "SGLang+ (Marconi's admission, LRU on leaves)",
                 "marconi": "Marconi (its admission, FLOP-aware eviction)"}


@dataclass(frozen=True)
class ReferenceRun:
    """One scenario through the reference: its records (replay order), summary and result."""

    records: list[RequestRecord]
    summary: dict[str, Any]
    result: Result


def scenario_pool(sc) -> tuple[int, CostModel]:
    """The scenario's provisioned pool in bytes per GPU and its costs, from the deployment
    ``sim run`` builds (same layout, same budget; no request runs)."""
    from sim.engine.replica import build_deployment

    dep = build_deployment(sc)
    lay = dep.layout
    base = sc.model.flops_per_token(0)
    costs = CostModel(kv_bytes_per_token=lay.attn_bytes_per_token,
                      state_bytes=lay.mamba_bytes_per_seq, flops_per_token=base,
                      attn_flops_per_context_token=sc.model.flops_per_token(1) - base,
                      name=sc.model.name, layers=LayerFlops.from_spec(sc.model))
    return dep.num_blocks * dep.block_bytes, costs


def arrival_order(requests) -> list:
    """The workload's requests by ``arrival_s`` (stable: equal times keep the workload's
    order).  A trace is in arrival order already; a multi-turn workload is generated session
    by session, and a follow-up turn's ``arrival_s`` is a lower bound (its think time after
    the previous turn's arrival, the service time left out, as no clock runs here)."""
    return sorted(requests, key=lambda t: t.arrival_s)


def run_reference(sc, variant: str, alpha: float | None = None, rules: Rules = DEFAULT,
                  budget_bytes: int | None = None) -> ReferenceRun:
    """Replay ``sc``'s workload through ``variant`` of the reference under ``rules``, sized by
    its pool (or by ``budget_bytes`` when given)."""
    from workloads import build_workload

    budget, costs = scenario_pool(sc)
    traces = arrival_order(build_workload(sc.workload, sc.seed, sc.path.parent))
    res = replay(traces, costs, budget if budget_bytes is None else budget_bytes, variant, alpha,
                 rules=rules)
    records = [RequestRecord(
        request_id=str(t.request_id), session=t.session or "", arrival_s=float(t.arrival_s),
        prompt_tokens=p, hit_tokens=h, attention_hit_tokens="", lost_tokens="", junction="",
        recomputed_tokens="", queue_s="", ttft_s="", e2e_s="", output_tokens=int(t.output_tokens),
        preemptions="", mamba_states_written="")
        for t, p, h in zip(traces, res.prompt_tokens, res.hit_tokens)]
    summary = {
        "scenario": sc.name, "model": sc.model.name, "policy": POLICY, "variant": variant,
        "timing": None,
        "requests": res.num_requests, "prompt_tokens": sum(res.prompt_tokens),
        "hit_tokens": sum(res.hit_tokens), "token_hit_rate": res.token_hit_rate,
        "request_hit_rate": res.request_hit_rate,
        "output_tokens": sum(r.output_tokens for r in records),
        "pool_bytes": budget, "budget_bytes": res.budget_bytes, "bytes_held": res.bytes_held,
        "evictions": res.evictions, "states_admitted": res.states_admitted,
        "flops_saved_fraction": res.flops_saved_fraction,
        "alpha": res.alpha, "alpha_tuned_after": res.alpha_tuned_after,
        "kv_bytes_per_token": costs.kv_bytes_per_token, "state_bytes": costs.state_bytes,
    }
    if rules.changed():
        summary["rules"] = rules.changed()
    return ReferenceRun(records, summary, res)


def report_text(run: ReferenceRun) -> str:
    s = run.summary
    alpha = "-"
    if s["alpha"] is not None:
        alpha = (f"{s['alpha']:.1f} (tuned after {s['alpha_tuned_after']:,} requests)"
                 if s["alpha_tuned_after"] else f"{s['alpha']:.1f} (not tuned)")
    return "\n".join([
        f"# {s['scenario']}: Marconi's reference cache model (no timing)",
        "",
        "This is **not** a `sim run`: the scenario's requests were replayed one at a time, in",
        "arrival order, through the token-level radix tree of Marconi's paper (`sim/marconi`),",
        "with no scheduler and no clock. There is no TTFT, no throughput and no queueing here;",
        "only the cache's hits. `requests.csv` leaves the timing columns empty.",
        "",
        "| | |", "|---|---|",
        f"| model | {s['model']} |",
        f"| variant | {VARIANT_NAMES[s['variant']]} |",
        budget_row(s),
        f"| requests | {s['requests']:,} |",
        f"| prompt tokens | {s['prompt_tokens']:,} |",
        f"| hit tokens | {s['hit_tokens']:,} |",
        f"| token hit rate | {s['token_hit_rate']:.2%} |",
        f"| request hit rate | {s['request_hit_rate']:.2%} |",
        f"| prefill FLOPs saved | {s['flops_saved_fraction']:.2%} |",
        f"| SSM states admitted | {s['states_admitted']:,} |",
        f"| evictions | {s['evictions']:,} |",
        f"| alpha | {alpha} |",
        *([f"| rules away from the default | {rules_text(s['rules'])} |"] if "rules" in s else []),
        "",
    ])


def budget_row(s: dict[str, Any]) -> str:
    gib = 2 ** 30
    b = s["budget_bytes"]
    if b == s["pool_bytes"]:
        return f"| budget (the scenario's pool per GPU) | {b:,} B ({b / gib:.2f} GiB) |"
    return (f"| budget (given; the scenario's pool is {s['pool_bytes']:,} B) | {b:,} B "
            f"({b / gib:.2f} GiB) |")


def rules_text(rules: dict[str, Any]) -> str:
    """``name=value`` of each rule set away from the default."""
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in rules.items())


def write_reference(folder: Path, run: ReferenceRun) -> Path:
    """``requests.csv``, ``summary.json`` and ``report.md`` into ``folder``, atomically."""
    from sim.rundir.atomic import atomic_folder

    with atomic_folder(folder, kind="run") as tmp:
        with open(tmp / "requests.csv", "w", newline="") as f:
            # (sim run's writer: csv.writer's bytes of each value's requests.csv text)
            requests_csv.write_rows(f, list(REQUEST_COLUMNS), run.records,
                                    ["o"] * len(REQUEST_COLUMNS))
        with open(tmp / "summary.json", "w") as f:
            json.dump(run.summary, f, indent=1, allow_nan=False)
            f.write("\n")
        (tmp / "report.md").write_text(report_text(run))
    return Path(folder)
