"""The connector's count, per chunk of the first group, of the hash-grid positions holding
a partial-tail key (``tail_chunks0``), which lets a lookup's walk down the grid skip a chunk
without any at once: after any sequence of partial-tail keys stored and evicted it is what
the per-position counts (``tail_pos``) say."""
from __future__ import annotations

import random
from pathlib import Path

from sim.config.scenario import load_scenario
from sim.engine.replica import build_deployment

ROOT = Path(__file__).resolve().parents[2]


def test_chunk_counts_follow_the_position_counts():
    # (the Mooncake scenario: 1,088-token blocks over a 64-token hash unit: partial tails on)
    sc = load_scenario(ROOT / "scenarios" / "mooncake-conversation.yaml",
                       {"kv_offloading.size_gb": 4})
    conn = build_deployment(sc).offload
    assert conn is not None and conn.partial
    u = conn.unit
    tpc = conn.groups[0].tpc
    rng = random.Random(5)
    held: dict[int, int] = {}
    skipped = 0
    for _ in range(4000):
        t = rng.randrange(1, 6 * tpc // u) * u
        if t % tpc == 0:
            continue
        if held.get(t, 0) > 0 and rng.random() < 0.5:
            conn._tail_add(0, t, -1)
            held[t] -= 1
        else:
            conn._tail_add(0, t, 1)
            held[t] = held.get(t, 0) + 1
        tp = list(conn.tail_pos[0])
        tc = list(conn.tail_chunks0)
        want = [0] * max(len(tc), (len(tp) * u) // tpc + 1)
        for i, c in enumerate(tp):
            if c > 0:
                want[i * u // tpc] += 1
        assert tc + [0] * (len(want) - len(tc)) == want
        skipped += sum(1 for c in want if c == 0)
    assert skipped > 0          # (chunks without any tail key: the walk skips them)
