"""SlotHeap (the CPU tier's LRU heap of slots) against a plain model: pushes, pops,
removals from any position and re-pushes of a slot under a new key, in random order;
the least (key, slot) always comes out first and ``has`` tells who is in."""
from __future__ import annotations

import random

from sim.cache.key_map import SlotHeap


def test_slot_heap_equals_a_sorted_model():
    rng = random.Random(5)
    for trial in range(40):
        h = SlotHeap()
        model: dict[int, int] = {}          # slot -> key
        nslots = rng.choice([1, 3, 20, 200])
        for step in range(1500):
            op = rng.random()
            s = rng.randrange(nslots)
            if op < 0.45:
                if s in model:
                    h.remove(s)
                key = rng.randrange(10_000) * 1000 + s       # (keys unique, as LRU ranks)
                h.push(key, s)
                model[s] = key
            elif op < 0.7 and s in model:
                h.remove(s)
                del model[s]
            elif op < 0.9 and model:
                want = min((k, t) for t, k in model.items())
                assert h.first() == want[0]
                assert h.pop() == want
                del model[want[1]]
            elif op < 0.95:
                h.clear()
                model.clear()
            assert len(h) == len(model)
            for t in range(nslots):
                assert h.has(t) == (t in model)
        out = [h.pop() for _ in range(len(h))]
        assert out == sorted((k, t) for t, k in model.items())
        assert not any(h.has(t) for t in range(nslots))


def test_pair_heap_pops_like_heapq():
    """PairHeap (the CPU tier's job completions) shares SlotHeap's sift loops: its pops
    come out as heapq's, duplicates and equal keys included."""
    import heapq

    from sim.cache.key_map import PairHeap

    rng = random.Random(8)
    for trial in range(30):
        h = PairHeap()
        model: list[tuple[int, int]] = []
        for step in range(800):
            if rng.random() < 0.6 or not model:
                k, v = rng.randrange(50), rng.randrange(5)
                h.push(k, v)
                heapq.heappush(model, (k, v))
            else:
                k, v = h.pop()
                assert k == model[0][0]
                model.remove((k, v))       # (equal keys: any of them, in heap order)
                heapq.heapify(model)
            assert len(h) == len(model)
