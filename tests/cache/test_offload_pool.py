"""The CPU tier's host pool (``sim/cache/offload_pool.py``) against vLLM 0.33.0's own
``CPUOffloadingManager``: a store / load / finish sequence (the offload oracle's cases b3 and
c1, 8 chunks) replayed call for call; the evictions vLLM's LRU and ARC policies made there
(replayed on vLLM's real classes) are the expected values."""
from __future__ import annotations

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.offload_pool import HIT, HIT_PENDING, MISS, AccessState, HostPool

# one prefix key per (owner, position): a key's groups share it, as vLLM's block hash
_HASH = {}


def key(owner: str, pos: int, group: int) -> int:
    h = _HASH.setdefault((owner, pos), 1000 + len(_HASH))
    return (h << GROUP_BITS) | group


def v(keys) -> vec[i64]:
    """Keys as the pool takes them (a vec: no int object a key)."""
    return vec[i64](keys)


def lists(got):
    """``prepare_store``'s answer with lists for vecs."""
    return None if got is None else (list(got[0]), list(got[1]))


def name(k: int) -> str:
    h, g = k >> GROUP_BITS, k & ((1 << GROUP_BITS) - 1)
    owner, pos = next(o for o, v in _HASH.items() if v == h)
    return f"{'am'[g]}{pos}{'' if owner == 'p' else owner}"


def replay(policy: str) -> list[tuple[str, list[str] | None, list[str] | None]]:
    pool = HostPool(8, policy)
    ctx = {r: AccessState() for r in "pfcd"}
    out = []

    def K(r, owner, pos, g):
        k = key(owner, pos, g)
        ctx[r].set_pos(k >> GROUP_BITS, pos)
        return k

    def store(r, keys, label):
        got = pool.prepare_store(v(keys), ctx[r])
        out.append((label, None if got is None else [name(k) for k in got[0]],
                    None if got is None else [name(k) for k in got[1]]))
        return got

    o1 = store("p", [K("p", "p", 96, 1)], "s0 p boundary")
    o2 = store("p", [K("p", "p", x, 0) for x in range(16, 97, 16)], "s0 p sweep")
    pool.complete_store(o1[0])
    pool.complete_store(o2[0])
    o3 = store("f", [K("f", "f", 144, 1)], "s3 f boundary")
    store("f", [K("f", "f", x, 0) for x in range(16, 145, 16)], "s3 f sweep")
    pool.request_finished(ctx["p"])
    pool.complete_store(o3[0])
    for s in (4, 5, 6):
        store("f", [K("f", "f", x, 0) for x in range(16, 145, 16)], f"s{s} f sweep")
    pool.request_finished(ctx["f"])
    lk = [K("c", "p", x, 0) for x in range(16, 97, 16)] + [K("c", "p", 96, 1)]
    pool.prepare_load(v(lk), ctx["c"])
    pool.complete_load(v(lk))
    o4 = store("c", [K("c", "c", 112, 1)], "s11 c boundary")
    o5 = store("c", [K("c", "c", 112, 0)], "s11 c sweep")
    pool.complete_store(o4[0])
    pool.complete_store(o5[0])
    pool.request_finished(ctx["c"])
    store("d", [K("d", "d", 112, 1)], "s16 d boundary")
    store("d", [K("d", "p", x, 0) for x in range(16, 97, 16)] + [K("d", "d", 112, 0)],
          "s16 d sweep")
    return out


FAILED = (None, None)
# vLLM 0.33.0's CPUOffloadingManager on the same calls (stored, evicted)
VLLM = {
    "lru": [(["m96"], []), (["a16", "a32", "a48", "a64", "a80", "a96"], []), (["m144f"], []),
            FAILED, FAILED, FAILED, FAILED, (["m112c"], ["m144f"]), (["a112c"], ["a96"]),
            (["m112d"], ["m112c"]), (["a96", "a112d"], ["a112c", "m96"])],
    "arc": [(["m96"], []), (["a16", "a32", "a48", "a64", "a80", "a96"], []), (["m144f"], []),
            FAILED, FAILED, FAILED, FAILED, (["m112c"], ["m96"]), (["a112c"], ["a96"]),
            (["m112d"], ["m144f"]), (["a96", "a112d"], ["m112c", "a112c"])],
}


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_evictions_are_vllms(policy):
    got = replay(policy)
    assert [(s, e) for _, s, e in got] == VLLM[policy]


def test_lookup_and_pins():
    pool = HostPool(2, "lru")
    st = AccessState()
    a, b, c = key("x", 16, 0), key("x", 32, 0), key("x", 48, 0)
    for k, p in ((a, 16), (b, 32), (c, 48)):
        st.set_pos(k >> GROUP_BITS, p)
    assert pool.lookup(a) == MISS
    assert lists(pool.prepare_store(v([a, b]), st)) == ([a, b], [])
    assert pool.lookup(a) == HIT_PENDING            # written, not yet readable
    assert pool.prepare_store(v([c]), st) is None    # nothing evictable: the call fails
    assert pool.failed == 1 and pool.used == 2
    pool.complete_store(v([a, b]))
    assert pool.lookup(a) == HIT
    pool.prepare_load(v([a]), st)                     # pinned while it loads
    assert lists(pool.prepare_store(v([c]), AccessState())) == ([c], [b])
    assert pool.lookup(b) == MISS and pool.evicted == 1 and pool.peak == 2


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_offer_reads_only_its_first_n_keys(policy):
    """``offer(keys, ends, st, n)`` (the connector's buffers, kept between calls, hold
    older keys past ``n``) offers, observes and protects only the first ``n``: the
    resident key past them is evicted as if it were not there."""
    pool = HostPool(2, policy)
    st = AccessState()
    a, b, c = key("n", 16, 0), key("n", 32, 0), key("n", 48, 0)
    assert pool.offer(v([a, b]), v([16, 32]), st)
    pool.complete_store(v([a, b]))
    # c offered alone from a buffer that still holds a and b past it
    assert pool.offer(v([c, a, b]), v([48, 16, 32]), AccessState(), 1)
    assert list(pool.offered) == [c]
    assert len(pool.evicted_now) == 1 and pool.evicted_now[0] in (a, b)
    assert pool.evicted_pos[0] == (16 if pool.evicted_now[0] == a else 32)
    # both a and b were offered, so protected, when the whole buffer is read: no room
    pool2 = HostPool(2, policy)
    assert pool2.offer(v([a, b]), v([16, 32]), st)
    pool2.complete_store(v([a, b]))
    assert not pool2.offer(v([c, a, b]), v([48, 16, 32]), AccessState())


def test_a_key_offered_twice_in_one_call_takes_one_slot():
    pool = HostPool(4, "lru")
    a, b = key("t", 16, 0), key("t", 32, 0)
    assert pool.offer(v([a, b, a]), v([16, 32, 16]), AccessState())
    assert pool.used == 2 and pool.lookup(a) == HIT_PENDING
    pool.complete_store(v([a, b]))
    assert pool.lookup(a) == HIT and pool.lookup(b) == HIT
