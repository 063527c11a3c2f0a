"""The Mamba groups' committed states waiting for the KV connector
(``sim/cache/mamba_manager.Handoffs``): kept in commit order, a freed request's dropped with
the others' order kept, and the buffers reused once taken (``n`` back to 0) without an old
entry showing through."""
from __future__ import annotations

from sim.cache.block_pool import Block
from sim.cache.mamba_manager import Handoffs


def entries(h: Handoffs) -> list[tuple[str, int, int]]:
    return [(h.rids[j], h.blocks[j].block_id, h.ends[j]) for j in range(h.n)]


def test_order_drop_and_reuse():
    b = [Block(i) for i in range(6)]
    h = Handoffs()
    for rid, blk, end in (("a", 1, 16), ("b", 2, 32), ("a", 3, 48), ("c", 4, 64)):
        h.add(rid, b[blk], end)
    assert entries(h) == [("a", 1, 16), ("b", 2, 32), ("a", 3, 48), ("c", 4, 64)]
    h.drop_request("a")
    assert entries(h) == [("b", 2, 32), ("c", 4, 64)]
    h.drop_request("zz")                       # not there: nothing changes
    assert entries(h) == [("b", 2, 32), ("c", 4, 64)]
    h.n = 0                                    # taken (clear_offload_handoffs)
    h.add("d", b[5], 80)
    assert entries(h) == [("d", 5, 80)]
    for k in range(5):                         # past the buffers' old length
        h.add(f"e{k}", b[k], 96 + 16 * k)
    assert h.n == 6 and entries(h)[-1] == ("e4", 4, 160)
