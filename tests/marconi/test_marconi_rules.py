"""The rules where Marconi's published code reads the paper otherwise than the reference
(``sim.marconi.rules``), one by one, on hand-built traces.

Expected hits are worked out by hand from each rule's statement (the module docstring of
``sim.marconi.rules``): a toy model with one byte of KV per token and a 10-byte state."""
from __future__ import annotations

import pytest

from sim.errors import InputError
from sim.marconi import CostModel, Request, replay
from sim.marconi.costs import LayerFlops
from sim.marconi.eviction import FlopAware
from sim.marconi.rules import DEFAULT, MARCONI_CODE, Rules
from sim.marconi.tree import RadixTree

TOY = CostModel(kv_bytes_per_token=1, state_bytes=10, flops_per_token=1.0,
                attn_flops_per_context_token=0.0, name="toy")
SMALL = LayerFlops(d=2, n=3, ssm_layers=1, attn_layers=1, mlp_layers=1)


def req(prompt, output=(), rid="r"):
    return Request.from_tokens(rid, list(prompt), list(output))


def hits(trace, budget, variant, rules=DEFAULT, **kw):
    return replay([req(p) for p in trace], TOY, budget, variant, rules=rules, **kw).hit_tokens


# ----------------------------------------------------------------------------- the rules


def test_defaults_and_the_marconi_code_preset():
    assert Rules() == DEFAULT and DEFAULT.changed() == {}
    assert MARCONI_CODE.changed() == {
        "evict": "before-insert", "lru_refresh": "descended", "merge_time": "later",
        "flops": "marconi", "efficiency_bytes": "prefix", "tune_objective": "flops",
        "tune_last": 500, "tune_at": "last-insert", "partial_block": True}
    assert DEFAULT.with_pairs(["evict=before-insert", "partial-block=true", "tune_last=7"]) == \
        Rules(evict="before-insert", partial_block=True, tune_last=7)
    assert MARCONI_CODE.with_pairs(["merge_time=child"]).merge_time == "child"


@pytest.mark.parametrize("pairs, field", [
    (["evict=sometimes"], "marconi.rules.evict"),
    (["partial_block=yes"], "marconi.rules.partial_block"),
    (["tune_last=-1"], "marconi.rules.tune_last"),
    (["tune_last=many"], "marconi.rules.tune_last"),
    (["colour=red"], "marconi.rules"),
    (["evict"], "marconi.rules"),
])
def test_bad_rules_are_one_line_input_errors_naming_the_rule(pairs, field):
    with pytest.raises(InputError) as e:
        DEFAULT.with_pairs(pairs)
    assert str(e.value).startswith(field + ": ") and "\n" not in str(e.value)


def test_marconi_flops_need_the_models_layer_shapes():
    with pytest.raises(InputError, match="marconi.rules.flops"):
        hits([[1, 2]], 100, "marconi", Rules(flops="marconi"), alpha=0.5)


# ----------------------------------------------------------------------------- lru_refresh

# A = (1 2 3 4) and B = (5 6 7 8) cached; (1 2 9) leaves A after two tokens, splitting it
# into M = (1 2) and A' = (3 4) and adding C = (9): 14 + 14 + 10 + 11 = 49 bytes, one over
# the budget.  LRU evicts a leaf: A' (last used by the first request) unless the match that
# left A in the middle refreshed it, then B.  The fourth request shows which survived.
REFRESH_TRACE = [[1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 9], [1, 2, 3, 4]]


def test_lru_refresh_hit_leaves_the_edge_a_match_leaves_in_the_middle_as_it_was():
    assert hits(REFRESH_TRACE, 48, "sglang+") == (0, 0, 0, 2)


def test_lru_refresh_descended_refreshes_it():
    assert hits(REFRESH_TRACE, 48, "sglang+", Rules(lru_refresh="descended")) == (0, 0, 0, 4)


def test_lru_refresh_before_insert_same_choice_and_without_it_the_whole_edge_goes():
    # before the insertion: 28 bytes held, the estimate two states (a branch) and one token
    # of KV, 49 > 48.  Refreshed, A stays and B goes: the same hit as above.  Not refreshed,
    # A (the older) goes whole, unsplit; (1 2 9) is then a new leaf and (1 2 3 4) hits nothing.
    assert hits(REFRESH_TRACE, 48, "sglang+", Rules(evict="before-insert",
                                                     lru_refresh="descended")) == (0, 0, 0, 4)
    assert hits(REFRESH_TRACE, 48, "sglang+", Rules(evict="before-insert")) == (0, 0, 0, 0)


# ----------------------------------------------------------------------------- evict


def test_evict_after_insert_protects_the_path_before_insert_frees_by_the_estimate():
    # (1 2 3 4) holds 14 of 20 bytes; (1 2 3 4 5) hits 4.  After the insertion (25 bytes) the
    # path is protected until nothing else is left: the new leaf (5) goes, (1 2 3 4) stays.
    # Before it: the estimate is one state and one token (11), 14 + 11 > 20, and the only
    # candidate, (1 2 3 4), goes; the insertion then caches (1 2 3 4 5) whole.
    trace = [[1, 2, 3, 4], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6]]
    assert hits(trace, 20, "sglang+") == (0, 4, 4)
    assert hits(trace, 20, "sglang+", Rules(evict="before-insert")) == (0, 4, 5)


@pytest.mark.parametrize("evict, left", [
    ("after-insert", {(1, 2, 3, 4), (5, 6)}),       # the first in slot order: (9)
    ("before-insert", {(5, 6), (9,)}),              # the first depth first: (1 2 3 4)
])
def test_exact_ties_in_the_flop_aware_score(evict, left):
    # three leaves below the root, cached in the order (1 2 3 4), (5 6), (9); (9) reuses the
    # slot (7 8) freed, so slot order puts it first.  All equally old: every score ties.
    t = RadixTree(TOY, 10**6, FlopAware(), Rules(evict=evict))
    for p in ([7, 8], [1, 2, 3, 4], [5, 6]):
        t.serve(req(p))
    t._evict(next(n for n in t.nodes() if n.runs[0][0] == 7))
    t.serve(req([9]))
    t.slots.last[:] = 3.0
    if evict == "before-insert":
        t.evict_bytes(1)
    else:
        t.budget = t.used - 1
        t.evict_to_budget([])
    assert {tuple(r[0] for r in p) for p in t.cached_prefixes()} == left


# ----------------------------------------------------------------------------- merge_time


@pytest.mark.parametrize("rule, expected", [("child", 3.0), ("later", 5.0)])
def test_merge_time_of_a_node_merged_into_its_child(rule, expected):
    t = RadixTree(TOY, 10**6, FlopAware(), Rules(merge_time=rule))
    t.serve(req([1, 2, 3, 4]))
    t.serve(req([1, 2, 5, 6]))                  # M = (1 2) with children (3 4) and (5 6)
    by = {tuple(r[0] for r in n.runs): n for n in t.nodes()}
    m, a, b = by[(1, 2)], by[(3, 4)], by[(5, 6)]
    t._evict(b)
    t.slots.last[m.slot], t.slots.last[a.slot] = 5.0, 3.0
    t._evict(m)                                 # (3 4) absorbs (1 2)
    assert a.runs == [(1, 0, 1), (2, 0, 1), (3, 0, 1), (4, 0, 1)] and a.parent is t.root
    assert t.slots.last[a.slot] == expected


# ----------------------------------------------------------------------------- flops, efficiency


def test_layer_flops_count_as_the_code_does():
    # d = 2, n = 3: Mamba 12*l*4 + 16*l*2*3 + 10*l*2 = 164 l; attention 32 l + 8 l^2; MLP 64 l
    assert (SMALL.mamba(3), SMALL.attn(3), SMALL.mlp(3)) == (492, 168, 192)
    assert SMALL.hit_saving(3) == 492 + 168 + 192
    # over a parent at 2 tokens, a node at 5: Mamba of its 3 tokens, attention 360 - 96, and
    # the MLP term as the code computes it: MLP of 5 tokens less the parent's *attention*
    assert SMALL.node_saving(2, 5) == 492 + (360 - 96) + (320 - 96)


def test_layer_flops_from_the_catalogue():
    from sim.models import get_model
    f = LayerFlops.from_spec(get_model("nemotron-h-8b"))
    spec = get_model("nemotron-h-8b")
    assert (f.d, f.n, f.ssm_layers, f.attn_layers) == (spec.hidden, spec.d_state,
                                                      spec.num_mamba_layers,
                                                      spec.num_attention_layers)
    assert CostModel.from_model("nemotron-h-8b").layers == f


@pytest.mark.parametrize("flops, bytes_, expected", [
    ("catalogue", "edge", 2 / 12),              # 2 tokens saved over the parent, 10 + 2 bytes
    ("catalogue", "prefix", 2 / 14),            # ... over the state and the prefix's 4 tokens
    ("marconi", "edge", (328 + 160 + 160) / 12),
    ("marconi", "prefix", (328 + 160 + 160) / 14),
])
def test_flop_efficiency_of_a_node(flops, bytes_, expected):
    # (3 4) below (1 2): Mamba(2) = 328; attention(4) - attention(2) = 256 - 96; MLP(4) less
    # the parent's attention, 256 - 96
    costs = CostModel(kv_bytes_per_token=1, state_bytes=10, flops_per_token=1.0,
                      attn_flops_per_context_token=0.0, layers=SMALL)
    t = RadixTree(costs, 10**6, FlopAware(), Rules(flops=flops, efficiency_bytes=bytes_))
    t.serve(req([1, 2, 3, 4]))
    t.serve(req([1, 2, 9]))
    node = next(n for n in t.nodes() if n.runs[0][0] == 3)
    assert t.slots.eff[node.slot] == pytest.approx(expected, rel=1e-15)


# ----------------------------------------------------------------------------- tuning


def _branches():
    from sim.marconi.demo_trace import branches_trace
    return branches_trace(0), CostModel.from_model("nemotron-h-8b"), 4 * 2**30


def test_tune_objective_and_last_score_the_windows_last_requests():
    trace, costs, budget = _branches()
    rules = Rules(tune_objective="flops", flops="marconi", tune_last=50)
    res = replay(trace, costs, budget, "marconi", rules=rules)
    n = res.alpha_tuned_after
    assert n and n > 50
    for alpha in (0.0, 0.5, 2.0):
        fixed = replay(trace[:n], costs, budget, "marconi", alpha=alpha, rules=rules)
        assert res.alpha_rates[alpha] == sum(costs.layers.hit_saving(h)
                                             for h in fixed.hit_tokens[-50:])
    best = max(res.alpha_rates.values())
    assert res.alpha == min(a for a, s in res.alpha_rates.items() if s == best)


def test_tune_at_last_insert_evicts_with_the_new_alpha_inside_the_windows_last_request():
    trace, costs, budget = _branches()
    after = replay(trace, costs, budget, "marconi")
    inside = replay(trace, costs, budget, "marconi", rules=Rules(tune_at="last-insert"))
    n = inside.alpha_tuned_after
    assert n == after.alpha_tuned_after and inside.alpha == after.alpha > 0
    # by hand: alpha 0 up to the window's last request, whose eviction (after its lookup,
    # so its hit is still alpha 0's) runs with the tuned alpha
    policy = FlopAware(0.0)
    tree = RadixTree(costs, budget, policy)
    from sim.marconi.runs import as_request
    reqs = [as_request(r, k) for k, r in enumerate(trace)]
    expect = [tree.serve(r) for r in reqs[: n - 1]]

    def adopt():
        policy.alpha = inside.alpha
    expect.append(tree.serve(reqs[n - 1], adopt))
    expect += [tree.serve(r) for r in reqs[n:]]
    assert list(inside.hit_tokens) == expect
    assert inside.hit_tokens[:n] == after.hit_tokens[:n]


# ----------------------------------------------------------------------------- vLLM+


def test_partial_block_caches_the_last_partial_block_and_fills_it():
    # block 4: (1..6) caches (1 2 3 4) and, with partial blocks, (5 6); (1..7) hits it and
    # fills it to (5 6 7); (1..8) then hits 7
    trace = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert hits(trace, 10**6, "vllm+", block_size=4) == (0, 4, 4)
    assert hits(trace, 10**6, "vllm+", Rules(partial_block=True), block_size=4) == (0, 6, 7)


def test_partial_block_a_lookup_takes_the_first_partial_block_cached():
    # below (1 2 3 4): the block (5 6 7 8), then (5) and (5 6) -- each a new partial block, as
    # the whole block matches more of it than the partial one before; (1..6 9) holds both
    # partial blocks and hits the first cached, (5)
    trace = [[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 9]]
    assert hits(trace, 10**6, "vllm+", Rules(partial_block=True), block_size=4) == (0, 4, 5, 5)


def test_vllm_plus_before_insert_estimate_counts_the_root_as_a_block():
    # block 4, 14 bytes a block, budget 40: (1..8) holds 28.  (9..16): after the insertion
    # (56) both old blocks go; before it the estimate is one block short (8 tokens less the
    # root's "block": 14 bytes), 28 + 14 > 40 frees one block, (5..8), and (1..4) stays
    trace = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16], [1, 2, 3, 4, 99]]
    assert hits(trace, 40, "vllm+", block_size=4) == (0, 0, 0)
    assert hits(trace, 40, "vllm+", Rules(evict="before-insert"), block_size=4) == (0, 0, 4)
