"""The analytical backend's step time: the engine's compiled twin (sim/engine/step_cost.py,
``StepCost`` and a decode jump's ``DecodeTimes``) gives the very float the plain model
(``backends.analytical.CostModel``, its reference) gives, on many random models, batches
and sums, roofline and fitted alike."""
from __future__ import annotations

import random

from backends.analytical import CostModel
from sim.cache.hashing import PrefixHasher
from sim.cache.request import CacheRequest
from sim.engine.step_cost import StepCost
from sim.engine.step_plan import StepItem


def _model(rng: random.Random) -> CostModel:
    """A random model: magnitudes of real ones and far from them, sometimes integers
    where the config allows them, a fitted profile's coefficients half the time."""
    def mag(lo: int, hi: int) -> float:
        x = rng.uniform(1.0, 10.0) * 10.0 ** rng.randint(lo, hi)
        return float(round(x)) if rng.random() < 0.2 else x

    fitted = {}
    if rng.random() < 0.5:
        fitted = {"per_item_s": mag(-7, -4), "per_token_s": mag(-9, -6),
                  "per_pair_s": mag(-14, -11), "per_chunk_s": rng.choice([0.0, mag(-7, -5)]),
                  "chunk_tokens": rng.choice([0, 0, 64, 256])}
    return CostModel(dense_flops_per_token=mag(8, 11), attn_layers=rng.randint(0, 40),
                     attn_width=rng.choice([0, 128, 4096, 8192]),
                     kv_bytes_per_token=mag(3, 6), mamba_layers=rng.randint(0, 60),
                     ssd_flops_per_token=mag(4, 7), state_bytes_per_seq=mag(5, 8),
                     weight_bytes=mag(9, 11), peak_flops=mag(13, 15),
                     hbm_bytes_per_s=mag(11, 13), mfu=rng.choice([0.5, 1, rng.random() + 0.01]),
                     mbu=rng.choice([0.7, rng.random() + 0.01]),
                     overhead_s=rng.choice([0, 0.004, rng.random() * 0.01]), **fitted)


def test_the_compiled_twin_times_every_step_as_the_model_does():
    rng = random.Random(47)
    tokens = CacheRequest("r", [(1, 0, 16)], PrefixHasher(16))
    for _ in range(400):
        m = _model(rng)
        twin = StepCost(m)
        for _ in range(10):
            items = [StepItem(tokens, 2, num_tokens=rng.choice([1, 2, 4, rng.randint(1, 8192)]),
                              context=rng.choice([0, rng.randint(0, 200_000)]))
                     for _ in range(rng.choice([0, 1, 3, rng.randint(1, 256)]))]
            assert twin.items_time(items) == m.items_time(items)
            n = rng.randint(1, 256)
            T, C = n * rng.randint(1, 5), rng.randint(0, 10 ** 7)
            TC, TT = rng.randint(0, 10 ** 9), T * rng.randint(2, 9)
            assert twin.time_from_sums(n, T, C, TC, TT) == m.time_from_sums(n, T, C, TC, TT)
            NC = rng.randint(0, 3 * n)
            assert (twin.time_from_sums(n, T, C, TC, TT, NC)
                    == m.time_from_sums(n, T, C, TC, TT, NC))


def test_a_decode_jump_times_each_step_as_the_model_does():
    """``DecodeTimes.at(C)`` is ``time_from_sums(n, T, C, t C, TT)`` of the batch."""
    rng = random.Random(53)
    for _ in range(300):
        m = _model(rng)
        twin = StepCost(m)
        n, t = rng.randint(1, 256), rng.choice([1, 2, 4])
        times = twin.decode_times(n, t)
        T, TT = n * t, n * t * (t + 1)
        for _ in range(20):
            C = rng.randint(0, 10 ** 8)
            assert times.at(C) == m.time_from_sums(n, T, C, t * C, TT)
