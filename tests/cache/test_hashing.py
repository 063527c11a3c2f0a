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


def test_keys_fit_machine_integers_with_the_group_bits():
    """Every key lies in [0, KEY_SPACE) and a pool key (key << GROUP_BITS | group)
    stays below 2**62, the compiled build's machine-integer range."""
    from sim.cache.block_pool import GROUP_BITS
    from sim.cache.hashing import KEY_SPACE, MULTI, unit_key, unit_key_multi

    assert (KEY_SPACE << GROUP_BITS) <= 2**62
    rng = random.Random(11)
    p = 0
    for _ in range(20_000):
        s, q, n = rng.choice([LITERAL, 0, 1, 10**6, 2**40]), rng.randrange(2**45), rng.randint(1, 4096)
        p = unit_key(p, s, q, n) if rng.random() < 0.9 else unit_key_multi(p, [MULTI, s, q, n, 3, 0, 1])
        assert 0 <= p < KEY_SPACE


def test_a_step_is_a_bijection_of_the_state():
    """For fixed unit contents two different parents never give the same key, so two
    different prefixes stay different however long the shared continuation."""
    from sim.cache.hashing import KEY_SPACE, unit_key

    rng = random.Random(3)
    parents = {rng.randrange(KEY_SPACE) for _ in range(100_000)} | set(range(1000))
    for s, q, n in [(1, 0, 64), (LITERAL, 50_000, 1), (7, 123_456, 4096)]:
        assert len({unit_key(p, s, q, n) for p in parents}) == len(parents)


def test_no_collisions_among_structured_units():
    """Chains over many streams and prompts that differ in one token: every
    distinct prefix gets a distinct key (625,250 of them)."""
    h = PrefixHasher(1, memo_limit=0)
    keys: set[int] = set()
    total = 0
    for stream in range(500):                      # 500 streams x 1,000 one-token units
        ks = h.hashes([(stream, 0, 1000)])
        keys.update(ks)
        total += len(ks)
    for i in range(500):                           # 500 prompts differing in token i
        ks = h.hashes([(1, 0, i), (LITERAL, 7, 1), (1, i + 1, 499 - i)])
        keys.update(ks[i:])                        # (units before i are stream 1's)
        total += len(ks) - i
    assert total == len(keys) == 500_000 + sum(500 - i for i in range(500))
