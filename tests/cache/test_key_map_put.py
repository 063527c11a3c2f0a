"""KeyMap.put (one-probe insert-or-overwrite, the eviction log's write) against a dict:
colliding keys, overwrites, growth past the load limit, and removals in between so
puts land in slots that backward-shift deletion refilled."""
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
