"""KeyMap's one-probe writes against plain models: put (insert-or-overwrite, the eviction
log's write), swap and bump (counts), take_first (a mirror dropping one copy of a key):
colliding keys, overwrites, growth past the load limit, and removals in between so
writes land in slots that backward-shift deletion refilled."""
from __future__ import annotations

import random

from sim.cache.key_map import KeyMap


def test_put_equals_a_dict_assignment():
    rng = random.Random(11)
    for trial in range(30):
        km = KeyMap(rng.choice([1, 4, 16]))
        model: dict[int, int] = {}
        universe = [(rng.randint(0, 60) << 5) | rng.randint(0, 6) for _ in range(200)]
        for step in range(800):
            k = rng.choice(universe)
            if rng.random() < 0.2 and k in model:
                assert km.remove(k, model.pop(k))
            else:
                v = rng.randint(0, 10_000)
                km.put(k, v)
                model[k] = v
            if step % 100 == 0:
                assert km.items() == {key: [val] for key, val in model.items()}
        assert len(km) == len(model)
        for k in universe:
            assert km.first(k) == model.get(k, -1)
            assert km.only(k) == model.get(k, -1)


def test_swap_and_bump_equal_a_dict_of_counts():
    """``swap`` (put, returning the old value) and ``bump`` (add, inserting a positive
    delta, dropping the key at 0) against a dict, with colliding keys and growth."""
    import pytest

    rng = random.Random(5)
    for trial in range(30):
        km = KeyMap(rng.choice([1, 4, 16]))
        model: dict[int, int] = {}
        universe = [(rng.randint(0, 60) << 5) | rng.randint(0, 6) for _ in range(200)]
        for step in range(1000):
            k = rng.choice(universe)
            r = rng.random()
            if r < 0.3:
                v = rng.randint(1, 10_000)
                assert km.swap(k, v) == model.get(k, -1)
                model[k] = v
            elif r < 0.6 or k not in model:
                d = rng.randint(1, 5)
                model[k] = model.get(k, 0) + d
                assert km.bump(k, d) == model[k]
            else:
                d = -rng.randint(1, model[k])
                model[k] += d
                assert km.bump(k, d) == model[k]
                if model[k] == 0:
                    del model[k]
            if step % 100 == 0:
                assert km.items() == {key: [val] for key, val in model.items()}
        assert len(km) == len(model)
        absent = next(k for k in universe + [1 << 40] if k not in model)
        with pytest.raises(KeyError):
            km.bump(absent, -1)
        assert km.bump(absent, 0 + 1) == 1 and km.only(absent) == 1


def test_take_first_equals_first_then_remove():
    """``take_first`` unmaps the block ``first`` names, as ``first`` + ``remove`` do,
    keys held by several blocks included (their order kept)."""
    rng = random.Random(3)
    for trial in range(30):
        km = KeyMap(rng.choice([1, 4, 16]))
        model: dict[int, list[int]] = {}
        universe = [(rng.randint(0, 60) << 5) | rng.randint(0, 6) for _ in range(150)]
        next_id = 1
        for step in range(1000):
            k = rng.choice(universe)
            if rng.random() < 0.55:
                assert km.add(k, next_id)
                model.setdefault(k, []).append(next_id)
                next_id += 1
            else:
                want = model[k].pop(0) if model.get(k) else -1
                if k in model and not model[k]:
                    del model[k]
                assert km.take_first(k) == want
            if step % 100 == 0:
                assert km.items() == model
        assert len(km) == len(model)
        for k in universe:
            assert km.first(k) == (model[k][0] if k in model else -1)
