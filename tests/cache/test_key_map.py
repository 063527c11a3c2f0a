"""KeyMap (the open-addressing prefix-cache map) against a plain dict model:
random adds and removes, shared keys, growth, and the backward-shift deletion
that must keep every key reachable."""
from __future__ import annotations

import random

from sim.cache.key_map import MULTI, KeyMap


def _check(km: KeyMap, model: dict[int, list[int]], probe: list[int]) -> None:
    assert km.items() == model and len(km) == len(model)
    for k in probe:
        ids = model.get(k)
        assert km.has(k) == (ids is not None)
        assert km.first(k) == (ids[0] if ids else -1)
        assert km.only(k) == (-1 if not ids else ids[0] if len(ids) == 1 else MULTI)
        for b in range(6):
            assert km.maps(k, b) == (ids is not None and b in ids)


def test_keymap_equals_a_dict_of_insertion_ordered_ids():
    rng = random.Random(3)
    for trial in range(40):
        km = KeyMap(rng.choice([1, 4, 16]))
        model: dict[int, list[int]] = {}
        # few distinct home slots (keys sharing the high bits differ in the group
        # bits only) so probe runs collide, wrap and get shifted back on removal
        universe = [(rng.randint(0, 40) << 5) | rng.randint(0, 6) for _ in range(120)]
        for step in range(600):
            k = rng.choice(universe)
            b = rng.randint(0, 5)
            if rng.random() < 0.55:
                added = km.add(k, b)
                assert added == (b not in model.get(k, []))
                if added:
                    model.setdefault(k, []).append(b)
            else:
                removed = km.remove(k, b)
                assert removed == (b in model.get(k, []))
                if removed:
                    model[k].remove(b)
                    if not model[k]:
                        del model[k]
            if rng.random() < 0.5 and km.only(k) not in (-1, MULTI):
                nb = rng.randint(0, 5)
                if nb not in model[k]:
                    km.repoint(k, nb)
                    model[k] = [nb]
            if step % 50 == 0:
                _check(km, model, universe[:40])
        _check(km, model, universe)
        for k in list(model):          # drain: every key still reachable, map ends empty
            for b in list(model[k]):
                assert km.remove(k, b)
            del model[k]
        _check(km, model, universe)
