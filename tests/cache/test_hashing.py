"""Hash identity: equal keys exactly when the token prefixes (plus lookahead) are equal,
however the tokens are described, appended or asked for."""
from __future__ import annotations

import random

from librt.vecs import vec
from mypy_extensions import i64

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


def test_appending_equals_building_from_scratch():
    """Keys of a request grown run by run (outputs) equal those of the whole
    sequence described at once, and keys of the shared prefix never change."""
    from sim.cache.hashing import PrefixKeys

    rng = random.Random(5)
    for _ in range(1500):
        unit = rng.choice([1, 2, 4, 16, 64])
        la = rng.choice([0, 0, 1, 3])
        h = PrefixHasher(unit, la)
        runs = canonical_runs([(rng.randint(1, 4), rng.randint(0, 50), rng.randint(1, 80))
                               for _ in range(rng.randint(1, 5))])
        grow = PrefixKeys(list(runs), unit, la)
        before = grow.keys()
        for _ in range(rng.randint(1, 20)):
            s = rng.choice([7, 8, runs[-1][0]])
            last = runs[-1]
            st = last[1] + last[2] if s == last[0] else rng.randint(0, 100)
            n = rng.randint(1, 40)
            runs = canonical_runs(runs + [(s, st, n)])
            grow.append_run(s, st, n)
            assert grow.runs == runs
            assert grow.keys() == h.hashes(runs)
            assert grow.keys()[:len(before)] == before


def test_keys_are_asked_in_any_order_and_out_of_range_raises():
    """The run cursor is only a speed-up: random access gives the same keys,
    and indices outside [0, count) raise IndexError (as vLLM's list would)."""
    import pytest

    from sim.cache.hashing import PrefixKeys

    rng = random.Random(9)
    runs = canonical_runs([(rng.randint(1, 30), 0, rng.randint(1, 300)) for _ in range(60)])
    ref = PrefixKeys(list(runs), 16, 3).keys()
    keys = PrefixKeys(list(runs), 16, 3)
    for i in rng.sample(range(len(ref)), len(ref)):
        assert keys.key(i) == ref[i]
    for bad in (-1, len(ref)):
        with pytest.raises(IndexError):
            keys.key(bad)


def test_any_description_is_made_canonical_and_keys_at_walks_like_key():
    """PrefixKeys canonicalises what it is given (empty runs dropped, continuing
    runs merged) exactly as canonical_runs does, so a sequence split anywhere keys
    as the sequence in one piece; keys_at (the run-by-run walk) equals key(i)."""
    import pytest

    from sim.cache.hashing import PrefixKeys

    rng = random.Random(21)
    for _ in range(800):
        canon = canonical_runs([(rng.randint(1, 3), rng.randint(0, 40), rng.randint(1, 90))
                                for _ in range(rng.randint(1, 6))])
        desc = []
        for s, st, n in canon:          # re-describe each run in random pieces
            cut = 0
            while cut < n:
                m = rng.randint(0, n - cut)
                desc.append((s, st + cut, m))   # (m may be 0: an empty run)
                cut += m
        unit, la = rng.choice([1, 4, 16]), rng.choice([0, 2])
        keys = PrefixKeys(desc, unit, la)
        assert keys.runs == canon
        ref = PrefixKeys(canon, unit, la).keys()
        assert keys.keys() == ref
        units = sorted(rng.sample(range(len(ref)), rng.randint(0, len(ref)))) if ref else []
        assert keys.keys_at(units) == [ref[i] for i in units]
        with pytest.raises(IndexError):
            keys.keys_at([len(ref)])


def test_keys_fit_machine_integers_with_the_group_bits():
    """Every key lies in [0, KEY_SPACE) and a pool key (key << GROUP_BITS | group)
    stays below 2**62, the compiled build's machine-integer range."""
    from sim.cache.block_pool import GROUP_BITS
    from sim.cache.hashing import KEY_SPACE, unit_key

    assert (KEY_SPACE << GROUP_BITS) <= 2**62
    rng = random.Random(11)
    p = 0
    for _ in range(20_000):
        # (streams: literal, registered ids, and hash-id streams down to -2 - (2**53 - 1))
        s = rng.choice([LITERAL, 0, 1, 10**6, 2**40, -2 - (2**53 - 1)])
        q, n = rng.randrange(2**45), rng.randint(1, 4096)
        p = unit_key(p, s, q, n)
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
    h = PrefixHasher(1)
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


def test_stream_registry_keys_of_equals_keys_of_its_runs():
    """StreamRegistry.keys_of (segments straight to keys, as the engine builds
    requests) equals hashing the runs runs_of gives: names, hash ids, offsets,
    empty and continuing segments."""
    from sim.cache.prompt import StreamRegistry

    rng = random.Random(17)
    for _ in range(300):
        segs = []
        for _ in range(rng.randint(1, 8)):
            name = rng.choice(["S", "U", "out/r1", 0, 7, 2**40])
            segs.append((name, rng.choice([0, 0, 16, 512]), rng.choice([0, 1, 5, 64, 512])))
        if rng.random() < 0.3 and segs[-1][2]:           # a segment continuing the last
            name, off, n = segs[-1]
            segs.append((name, off + n, rng.randint(1, 40)))
        unit, la = rng.choice([1, 16, 64]), rng.choice([0, 3])
        reg_a, reg_b = StreamRegistry(), StreamRegistry()
        a = reg_a.keys_of(segs, PrefixHasher(unit, la))
        b = PrefixHasher(unit, la).keys_of(reg_b.runs_of(segs))
        assert a.runs == b.runs and a.keys() == b.keys() and a.total == b.total
        assert reg_a.ids == reg_b.ids


def test_extend_ids_equals_the_runs_of_its_ids():
    """PrefixKeys.extend_ids (a block-hash prompt's ids straight into the key columns)
    gives the keys of the runs (-2 - id, 0, block), the last cut to ``last``: on empty
    columns (its own way) and after other runs (the general way)."""
    rng = random.Random(29)
    for _ in range(300):
        block = rng.choice([1, 16, 64, 512])
        ids = [rng.choice([0, 1, 5, 7, 300, 2**40]) for _ in range(rng.randint(0, 9))]
        used = rng.randint(0, len(ids))
        last = rng.randint(1, block)
        unit, la = rng.choice([1, 16, 64]), rng.choice([0, 3])
        before = rng.choice([[], [], [(3, 0, rng.randint(1, 100))]])
        runs = before + [(-2 - h, 0, block if i < used - 1 else last)
                         for i, h in enumerate(ids[:used])]
        a = PrefixHasher(unit, la).keys_of(before)
        a.extend_ids(-2, vec[i64](ids), used, block, last)
        a.append_run(9, 0, 40)                            # a tail, then outputs
        b = PrefixHasher(unit, la).keys_of(runs + [(9, 0, 40)])
        assert a.runs == b.runs and a.keys() == b.keys() and a.total == b.total
        assert a.count == b.count and a.count_end == b.count_end


def test_count_follows_the_total_through_appends():
    """PrefixKeys.count (units emitted) after any mix of appends (continuing the last
    run, a new run, zero tokens onto the last run) is max((total - lookahead) // unit, 0),
    as keys built from the same runs at once give; append_run recomputes it only at
    ``count_end``."""
    rng = random.Random(31)
    for _ in range(200):
        unit, la = rng.choice([1, 4, 16, 64]), rng.choice([0, 1, 3, 70])
        keys = PrefixHasher(unit, la).keys_of([])
        pos: dict[int, int] = {}
        for _ in range(rng.randint(1, 40)):
            stream = rng.choice([1, 1, 1, 2, 3])
            n = rng.choice([0, 1, 1, 2, 4, 5, 63, 64, 65, 200])
            start = pos.get(stream, 0) if rng.random() < 0.9 else rng.randint(0, 500)
            runs = keys.runs
            if n == 0 and not (runs and runs[-1][0] == stream
                               and runs[-1][1] + runs[-1][2] == start):
                n = 1      # (an engine never appends an empty run of its own)
            keys.append_run(stream, start, n)
            pos[stream] = start + n
            assert keys.count == max((keys.total - la) // unit, 0)
            fresh = PrefixHasher(unit, la).keys_of(keys.runs)
            assert (fresh.total, fresh.count) == (keys.total, keys.count)
        assert keys.keys() == fresh.keys()


def test_memo_block_keys_read_back_as_the_keys_they_are():
    """The block-end keys the CPU tier's connector keeps on a request's keys
    (``memo_block_keys``) are what ``key``, ``block_keys`` and a fresh walk give, and
    grow with the hashes; a second scale is computed anew, never kept in their place."""
    from sim.cache.hashing import PrefixKeys

    rng = random.Random(33)
    for _ in range(300):
        runs = [(rng.randint(1, 3), rng.randint(0, 40), rng.randint(1, 120))
                for _ in range(rng.randint(1, 5))]
        unit, la = rng.choice([1, 4, 16]), rng.choice([0, 2])
        scale = rng.randint(1, 5)
        ref = PrefixKeys(runs, unit, la).keys()
        keys = PrefixKeys(runs, unit, la)
        nb = keys.count // scale
        first = rng.randint(0, nb)
        got = keys.memo_block_keys(first, scale)
        assert list(got) == [ref[(j + 1) * scale - 1] for j in range(first)]
        got = keys.memo_block_keys(nb, scale)          # (grown, not recomputed)
        assert list(got) == [ref[(j + 1) * scale - 1] for j in range(nb)]
        assert keys.memo_scale == scale and len(keys.memo) == nb
        assert [keys.key(i) for i in range(keys.count)] == ref
        a = rng.randint(0, nb)
        b = rng.randint(a, nb)
        assert list(keys.block_keys(a, b, scale)) == [ref[(j + 1) * scale - 1]
                                                      for j in range(a, b)]
        other = scale + 1
        no = keys.count // other
        assert list(keys.memo_block_keys(no, other)) == [ref[(j + 1) * other - 1]
                                                         for j in range(no)]
        assert keys.memo_scale == scale and len(keys.memo) == nb


def test_lookups_read_the_memo_as_they_hash():
    """The GPU cache's walks (``find_full``, ``find_mamba``) give the same hit with the
    CPU tier's block keys kept on the request as without them."""
    from sim.cache.block_pool import BlockPool
    from sim.cache.hashing import PrefixKeys
    from sim.cache.mamba_manager import find_mamba
    from sim.cache.managers import find_full

    rng = random.Random(5)
    unit, bs = 4, 16
    for _ in range(200):
        pool = BlockPool(64, hash_block_size=unit)
        runs = [(1, 0, rng.randint(20, 160))]
        cached = PrefixKeys(runs, unit, 0)
        # cache a random prefix of its blocks (both groups) and some inner units
        nb = cached.count * unit // bs
        k = rng.randint(0, nb)
        blocks = pool.get_new_blocks(2 * k) if k else []
        for g in range(2):
            pool.cache_full_range(cached.block_keys(0, k, bs // unit),
                                  blocks[g * k:(g + 1) * k], 0, bs, g)
        probe = PrefixKeys(runs + [(2, 0, rng.randint(0, 40))], unit, 0)
        plain = (find_full(pool, probe, probe.count * unit, [0], bs, False, bs),
                 find_mamba(pool, probe, probe.count * unit, [1], bs, bs, [[]]),
                 find_mamba(pool, probe, probe.count * unit, [1], bs, unit, [[]]))
        memo = PrefixKeys(probe.runs, unit, 0)
        memo.memo_block_keys(rng.randint(0, memo.count // (bs // unit)), bs // unit)
        kept = (find_full(pool, memo, memo.count * unit, [0], bs, False, bs),
                find_mamba(pool, memo, memo.count * unit, [1], bs, bs, [[]]),
                find_mamba(pool, memo, memo.count * unit, [1], bs, unit, [[]]))
        for (pl, ph), (kl, kh) in zip(plain, kept):
            assert ph == kh
            assert [[b.block_id for b in x] for x in pl] == [[b.block_id for b in x]
                                                            for x in kl]
