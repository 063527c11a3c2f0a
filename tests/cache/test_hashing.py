"""Hash identity: equal hashes exactly when the token prefixes (plus lookahead) are equal,
however the tokens are described, extended or memoised."""
from __future__ import annotations

import random

from sim.cache.hashing import LITERAL, PrefixHasher, canonical_runs


def test_same_tokens_same_hashes_whatever_the_segmentation():
    h = PrefixHasher(4)
    whole = h.hashes([(1, 0, 40)])
    split = h.hashes([(1, 0, 13), (1, 13, 27)])
    assert whole == split and len(whole) == 10


def test_lookahead_hash_covers_the_next_tokens():
    h = PrefixHasher(4, lookahead=1)
    a = h.hashes([(1, 0, 8), (2, 0, 5)])
    b = h.hashes([(1, 0, 8), (3, 0, 5)])
    # unit 0 covers tokens 0..4: equal; unit 1 covers 0..8 (token 8 differs)
    assert a[0] == b[0] and a[1] != b[1]
    assert len(h.hashes([(1, 0, 8)])) == 1  # the second unit needs token 8 to exist


def test_literal_tokens_are_their_own_stream():
    h = PrefixHasher(2)
    assert h.hashes([(LITERAL, 5, 1), (LITERAL, 6, 1)]) == h.hashes([(LITERAL, 5, 2)])
    assert h.hashes([(LITERAL, 5, 2)]) != h.hashes([(1, 5, 2)])


def test_extend_equals_recompute_and_memo_is_invisible():
    rng = random.Random(5)
    for _ in range(1500):
        unit = rng.choice([1, 2, 4, 16, 64])
        la = rng.choice([0, 0, 1, 3])
        grow, fresh = PrefixHasher(unit, la), PrefixHasher(unit, la, memo_limit=0)
        runs = canonical_runs([(rng.randint(1, 4), rng.randint(0, 50), rng.randint(1, 80))
                               for _ in range(rng.randint(1, 5))])
        hashes = grow.hashes(runs)
        for _ in range(rng.randint(1, 20)):
            s = rng.choice([7, 8, runs[-1][0]])
            last = runs[-1]
            st = last[1] + last[2] if s == last[0] else rng.randint(0, 100)
            runs = canonical_runs(runs + [(s, st, rng.randint(1, 40))])
            grow.extend(runs, hashes)
            assert hashes == fresh.hashes(runs)
