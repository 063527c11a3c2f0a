"""A Mamba state search that finds nothing answers with its manager's shared empty lists
(``MambaManager._miss``, one per member) instead of building them at every lookup: safe
only while nothing writes a lookup's hit lists.  After replays that miss, hit and reuse
states (the Mooncake trace, the shared-prefix flag on), those lists are still empty; on
the pool a replay leaves, a hit never hands them out, and a miss is exactly what a
search with lists of its own finds."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.cache.mamba_manager import MambaManager, find_mamba
from sim.cache.prompt import StreamRegistry
from sim.engine.record import prompt_of
from sim.config.scenario import load_scenario
from sim.commands.run import simulate
from workloads import build_workload

ROOT = Path(__file__).resolve().parents[2]


def _replay(scenario: str, n: int):
    sc = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", {"workload.num_requests": n})
    dep, _, _ = simulate(sc)
    mambas = [m for m in dep.kv.coordinator.managers if isinstance(m, MambaManager)]
    assert mambas
    return sc, dep.kv, mambas


@pytest.mark.parametrize("scenario", ["mooncake-conversation", "athena-flag-on"])
def test_the_shared_miss_lists_stay_empty_through_a_replay(scenario):
    _, _, mambas = _replay(scenario, 300)
    assert all(m._miss == [[] for _ in m.group_ids] for m in mambas)


def test_a_miss_answers_the_shared_lists_and_a_hit_lists_of_its_own():
    sc, kv, mambas = _replay("mooncake-conversation", 400)
    m = mambas[0]
    ids, align = m.group_ids, kv.coordinator.align
    hits = misses = 0
    for tr in build_workload(sc.workload, sc.seed, sc.path.parent):
        # (hash-id prompts: their keys need no stream registry of the replay's)
        keys = StreamRegistry().keys_of(prompt_of(tr.segments), kv.hasher)
        for limit in (keys.total - 1, keys.total // 2, 3 * kv.hasher.unit):
            blocks, hit = m.find(keys, limit, ids, False, align)
            own = find_mamba(m.pool, keys, limit, ids, m.block_size, align,
                             [[] for _ in ids])
            assert (own[1], [list(b) for b in own[0]]) == (hit, [list(b) for b in blocks])
            if hit:
                hits += 1
                assert all(b is not x for b in blocks for x in m._miss)
                assert blocks[0][-1] is not kv.coordinator.pool.null_block
            else:
                misses += 1
                assert blocks is m._miss
    assert hits > 0 and misses > 0                       # (both answers met)
    assert m._miss == [[] for _ in ids]
