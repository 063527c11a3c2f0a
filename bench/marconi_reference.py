"""Marconi's own cache model (``sim/marconi``) on two traces, every variant at a few budgets:

    python bench/marconi_reference.py

1. the Mooncake FAST'25 conversation trace (12,031 requests, 145 M prompt tokens) on
   Nemotron-H-8B (KV 16 KiB per token, one SSM checkpoint 97.4 MiB);
2. the synthetic conversations + one-off branches trace (``sim.marconi.demo_trace``, seed 0),
   the shape under which the paper reports FLOP-aware eviction ahead of LRU.

Each row: token hit rate, requests with a hit, prefill FLOPs saved, SSM states admitted,
evictions (nodes; vLLM+: blocks), Marconi's alpha (``@N``: tuned after N requests; ``-``:
never tuned, the trace ended within the bootstrap window) and the wall time.  Replays are
deterministic: the numbers are the same on every run (wall times aside).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.marconi import VARIANTS, CostModel, replay  # noqa: E402
from sim.marconi.demo_trace import branches_trace  # noqa: E402
from sim.marconi.runs import as_request  # noqa: E402
from workloads.traces import MooncakeConfig  # noqa: E402

GIB = 2**30
MOONCAKE = ROOT / "data/traces/mooncake_fast25/conversation_trace.jsonl"
MOONCAKE_BUDGETS_GIB = (16, 32, 64, 128, 256)
BRANCHES_BUDGETS_GIB = (2, 4, 8, 16)
MODEL = "nemotron-h-8b"


def table(title: str, requests: list, costs: CostModel, budgets_gib: tuple[int, ...]) -> None:
    print(f"\n{title}")
    print(f"{'budget':>8}  {'variant':<8} {'token hit':>9} {'req hit':>8} {'FLOPs saved':>11} "
          f"{'states':>9} {'evictions':>9} {'alpha':>10} {'wall':>6}")
    for gib in budgets_gib:
        for variant in VARIANTS:
            t0 = time.perf_counter()
            r = replay(requests, costs, gib * GIB, variant)
            wall = time.perf_counter() - t0
            alpha = ""
            if r.alpha is not None:
                alpha = f"{r.alpha:.1f}@{r.alpha_tuned_after}" if r.alpha_tuned_after else "0.0@-"
            print(f"{gib:>5}GiB  {variant:<8} {r.token_hit_rate:>9.2%} {r.request_hit_rate:>8.1%} "
                  f"{r.flops_saved_fraction:>11.2%} {r.states_admitted:>9,} {r.evictions:>9,} "
                  f"{alpha:>10} {wall:>5.1f}s", flush=True)


def main() -> None:
    costs = CostModel.from_model(MODEL)
    print(f"model {MODEL}: KV {costs.kv_bytes_per_token:,} B/token, state {costs.state_bytes:,} B, "
          f"{costs.flops_per_token:.3g} FLOPs/token + {costs.attn_flops_per_context_token:,.0f} "
          f"per context token")
    mooncake = [as_request(r, k) for k, r in enumerate(MooncakeConfig(str(MOONCAKE)).requests())]
    table(f"Mooncake conversation trace ({len(mooncake):,} requests, "
          f"{sum(r.prompt_tokens for r in mooncake):,} prompt tokens)",
          mooncake, costs, MOONCAKE_BUDGETS_GIB)
    branches = branches_trace(0)
    table(f"conversations + one-off branches (demo_trace seed 0: {len(branches):,} requests, "
          f"{sum(r.prompt_tokens for r in branches):,} prompt tokens)",
          branches, costs, BRANCHES_BUDGETS_GIB)


if __name__ == "__main__":
    main()
