"""Marconi's own cache model (sim/marconi): admission at branch points and sequence ends,
eviction order of LRU ("SGLang+") and FLOP-aware utility on hand-built trees, the vLLM+
baseline, hits checked against what the tree holds on random traces, alpha's bootstrap,
and the paper's qualitative result (FLOP-aware ahead of LRU, both ahead of vLLM+, on
conversations with one-off branches under tight memory).

Expected values are worked out by hand from the paper's rules (Pan et al., MLSys 2025)."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from sim.errors import InputError
from sim.marconi import CostModel, Request, replay
from sim.marconi.demo_trace import branches_trace
from sim.marconi.eviction import FlopAware, LruLeaves
from sim.marconi.runs import Seq, as_request, canonical, join, split
from sim.marconi.tree import RadixTree
from sim.marconi.vllm_plus import BlockTree

# one byte of KV per token, a 10-byte state, one FLOP per token: FLOPs saved = tokens
TOY = CostModel(kv_bytes_per_token=1, state_bytes=10, flops_per_token=1.0,
                attn_flops_per_context_token=0.0, name="toy")
BIG = 10**12


def req(prompt, output=(), rid="r"):
    return Request.from_tokens(rid, list(prompt), list(output))


def seq(*ids):
    return Seq([(t, 0, 1) for t in ids])


def prefixes(cache) -> set[tuple]:
    return {tuple(r[0] for r in p) for p in cache.cached_prefixes()}


# ----------------------------------------------------------------------------- runs


def test_runs_merge_split_and_match_at_token_level():
    assert canonical([("a", 0, 3), ("a", 3, 2), ("b", 0, 0), ("a", 9, 1)]) == [("a", 0, 5), ("a", 9, 1)]
    assert join([("a", 0, 2)], [("a", 2, 3), ("b", 0, 1)]) == [("a", 0, 5), ("b", 0, 1)]
    assert split([("a", 0, 5), ("b", 0, 2)], 3) == ([("a", 0, 3)], [("a", 3, 2), ("b", 0, 2)])
    assert split([("a", 0, 5), ("b", 0, 2)], 5) == ([("a", 0, 5)], [("b", 0, 2)])
    s = Seq([("a", 0, 4), ("b", 0, 2)])
    # the edge a[0:3] a[3:5]: four tokens of a match, then b[0] != a[4]
    assert s.match([("a", 0, 3), ("a", 3, 2)], 0, 0) == (4, 1, 0)
    assert s.match([("a", 1, 2)], 0, 0) == (0, 0, 0)      # a[1] is not a[0]
    assert s.advance(0, 1, 4) == (1, 1) and s.runs(0, 3, 2) == [("a", 3, 1), ("b", 0, 1)]


# ----------------------------------------------------------------------------- admission


def test_first_request_admits_one_state_at_the_end_of_prompt_and_output():
    t = RadixTree(TOY, BIG, FlopAware())
    assert t.serve(req([1, 2, 3, 4], [5, 6])) == 0
    assert prefixes(t) == {(1, 2, 3, 4, 5, 6)}
    assert t.states_admitted == 1 and t.used == 10 + 6 == t.held_bytes()


def test_branch_point_gets_a_state_when_a_prompt_leaves_an_edge_and_hits_from_the_third_request():
    t = RadixTree(TOY, BIG, FlopAware())
    t.serve(req([1, 2, 3, 4], [5]))
    # leaves the cached edge after 3 tokens: no state there yet, so no hit ...
    assert t.serve(req([1, 2, 3, 7], [8])) == 0
    # ... but the state at the branch point is admitted (speculative insertion)
    assert prefixes(t) == {(1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 3, 7, 8)}
    assert t.states_admitted == 3
    assert t.used == 3 * 10 + 7          # KV of every distinct token, three states
    assert t.serve(req([1, 2, 3, 9], [10])) == 3
    assert t.states_admitted == 4        # leaving at a node end needs no new branch state


def test_next_turn_reuses_the_state_after_the_last_decoded_token():
    t = RadixTree(TOY, BIG, LruLeaves())
    t.serve(req([1, 2, 3], [4, 5]))
    assert t.serve(req([1, 2, 3, 4, 5, 6], [7])) == 5
    assert prefixes(t) == {(1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6, 7)} and t.states_admitted == 2


def test_a_prompt_ending_inside_an_edge_is_a_branch_point_at_its_end():
    t = RadixTree(TOY, BIG, FlopAware())
    t.serve(req([1, 2, 3, 4, 5], [6]))
    assert t.serve(req([1, 2, 3], [9])) == 0
    assert (1, 2, 3) in prefixes(t)
    assert t.serve(req([1, 2, 3], [10])) == 3        # a whole-prompt hit counts whole


def test_outputs_matching_the_tree_split_where_the_sequence_leaves_it():
    t = RadixTree(TOY, BIG, FlopAware())
    t.serve(req([1, 2], [3, 4, 5]))
    assert t.serve(req([1, 2], [3, 4, 9])) == 0
    assert prefixes(t) == {(1, 2, 3, 4), (1, 2, 3, 4, 5), (1, 2, 3, 4, 9)}


# ----------------------------------------------------------------------------- eviction


def _three_leaves(policy):
    """P=(1,2,3) branching into A=(4,5) and B=(7,8), plus C=(20,21,22); then a hit on A."""
    t = RadixTree(TOY, BIG, policy)
    t.serve(req([1, 2, 3, 4], [5]))
    t.serve(req([1, 2, 3, 7], [8]))
    t.serve(req([20, 21], [22]))
    assert t.lookup(seq(1, 2, 3, 4, 5, 0)) == 5
    return t


def _shrink(t, by):
    t.budget = t.used - by
    t.evict_to_budget([])


def test_lru_evicts_least_recent_leaves_and_keeps_inner_nodes_until_they_are_leaves():
    t = _three_leaves(LruLeaves())
    assert t.used == 2 * 13 + 2 * 12
    _shrink(t, 1)              # B: the least recently used leaf
    assert prefixes(t) == {(1, 2, 3), (1, 2, 3, 4, 5), (20, 21, 22)} and t.evictions == 1
    _shrink(t, 1)              # C (the hit on A refreshed A and its parent P)
    assert prefixes(t) == {(1, 2, 3), (1, 2, 3, 4, 5)}
    _shrink(t, 1)              # A; P, single-child all along, is never a candidate before
    assert prefixes(t) == {(1, 2, 3)}
    assert t.used == 13 == t.held_bytes()


def test_flop_aware_with_alpha_zero_is_lru_over_nodes_with_at_most_one_child():
    t = _three_leaves(FlopAware(0.0))
    _shrink(t, 1)              # B, the oldest candidate (P has two children)
    assert prefixes(t) == {(1, 2, 3), (1, 2, 3, 4, 5), (20, 21, 22)}
    used = t.used
    _shrink(t, 1)              # P: the hit on A did not refresh it (only the node hit is)
    assert t.used == used - 10                       # its state goes, its KV stays ...
    assert prefixes(t) == {(1, 2, 3, 4, 5), (20, 21, 22)}
    assert t.lookup(seq(1, 2, 3, 9)) == 0            # ... so (1,2,3) is no hit any more
    assert t.lookup(seq(1, 2, 3, 4, 5, 9)) == 5      # but A's prefix still is
    assert t.used == t.held_bytes()


@pytest.mark.parametrize("alpha, survivor", [(0.0, "short"), (0.5, "short"), (2.0, "long")])
def test_flop_efficiency_outweighs_recency_as_alpha_grows(alpha, survivor):
    # long: 40 tokens, older, 40 FLOPs per 50 bytes; short: 2 tokens, newer, 2 per 12.
    # normalized: long has recency 0 and efficiency 1, short recency 1 and efficiency 0, so
    # S(long) = alpha, S(short) = 1: the long one goes while alpha < 1
    t = RadixTree(TOY, BIG, FlopAware(alpha))
    t.serve(req(range(100, 140)))
    t.serve(req([200, 201]))
    _shrink(t, 1)
    kept = {"long": tuple(range(100, 140)), "short": (200, 201)}[survivor]
    assert prefixes(t) == {kept}


def test_lru_ignores_flop_efficiency():
    t = RadixTree(TOY, BIG, LruLeaves())
    t.serve(req(range(100, 140)))
    t.serve(req([200, 201]))
    _shrink(t, 1)
    assert prefixes(t) == {(200, 201)}


def test_the_running_request_path_is_evicted_last_and_an_oversized_request_leaves_nothing():
    t = RadixTree(TOY, 30, FlopAware())
    t.serve(req([1, 2, 3, 4, 5]))                       # 15 bytes
    t.serve(req([9, 8, 7, 6, 5, 4, 3]))                 # 17 more: the older entry goes
    assert prefixes(t) == {(9, 8, 7, 6, 5, 4, 3)}
    t.serve(req(range(50, 80)))                         # 40 bytes alone: over the budget
    assert prefixes(t) == set() and t.used == 0


# ----------------------------------------------------------------------------- vLLM+


def test_vllm_plus_caches_whole_blocks_each_with_a_state_and_hits_whole_blocks():
    b = BlockTree(TOY, BIG, block_size=2)
    assert b.serve(req([1, 2, 3, 4, 5], [6])) == 0
    assert b.states_admitted == 3 and b.used == 3 * 12
    assert b.serve(req([1, 2, 3, 4, 9], [9])) == 4      # blocks (1,2)(3,4); (5,6) != (9,9)
    assert b.serve(req([1, 2, 3])) == 2                 # (3,) is not a whole block
    assert prefixes(b) == {(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 9, 9)}


def test_vllm_plus_matches_blocks_by_content_however_the_runs_were_written():
    b = BlockTree(TOY, BIG, block_size=2)
    b.serve(Request("a", (("s", 0, 3), ("s", 3, 3))))           # s[0:6], written in two runs
    assert b.serve(Request("b", (("s", 0, 2), ("t", 0, 4)))) == 2
    assert b.serve(Request("c", (("s", 0, 6),))) == 6            # block s[2:4] spans the seam


def test_vllm_plus_evicts_the_least_recent_leaf_tail_block_first():
    b = BlockTree(TOY, BIG, block_size=2)
    b.serve(req([1, 2, 3, 4, 5], [6]))
    b.serve(req([7, 8, 9]))                             # (7,8) is newer
    b.budget = b.used - 1
    b.evict_to_budget([])
    assert prefixes(b) == {(1, 2), (1, 2, 3, 4), (7, 8)} and b.evictions == 1
    b.budget = b.used - 13                              # two more blocks: the older leaf's
    b.evict_to_budget([])                               # (3,4) then (1,2), before (7,8)
    assert prefixes(b) == {(7, 8)} and b.evictions == 3


# ----------------------------------------------------------------------------- properties


def _random_trace(rng: random.Random, n: int) -> list[Request]:
    out: list[Request] = []
    seqs: list[list[int]] = []
    for k in range(n):
        if seqs and rng.random() < 0.7:
            base = rng.choice(seqs)
            prompt = base[: rng.randint(0, len(base))]
        else:
            prompt = []
        prompt = prompt + [rng.randint(0, 3) for _ in range(rng.randint(1, 8))]
        output = [rng.randint(0, 3) for _ in range(rng.randint(0, 4))]
        out.append(req(prompt, output, f"r{k}"))
        seqs.append(prompt + output)
    return out


def _check_structure(cache) -> None:
    alive = {cache.root.slot}
    for node in cache.nodes():
        alive.add(node.slot)
        assert node.parent.children[node.key] is node
        assert node.depth == node.parent.depth + node.length
        assert node.length == sum(r[2] for r in node.runs) > 0
        assert cache.slots.kids[node.slot] == len(node.children)
    assert set(int(s) for s in cache.slots.alive.nonzero()[0]) == alive


@pytest.mark.parametrize("variant", ["vllm+", "sglang+", "marconi"])
def test_a_hit_is_exactly_the_longest_cached_prefix_and_memory_stays_in_budget(variant):
    rng = random.Random(7)
    for trial in range(60):
        budget = rng.choice([0, 12, 30, 60, 120, 400, BIG])
        if variant == "vllm+":
            cache = BlockTree(TOY, budget, block_size=rng.choice([1, 2, 3]))
        elif variant == "sglang+":
            cache = RadixTree(TOY, budget, LruLeaves())
        else:
            cache = RadixTree(TOY, budget, FlopAware(rng.choice([0.0, 0.3, 1.0, 2.0])))
        for r in _random_trace(rng, 40):
            prompt = tuple(t[0] for t in r.prompt)
            held = [p for p in prefixes(cache) if prompt[: len(p)] == p]
            hit = cache.serve(r)
            assert hit == max(map(len, held), default=0) <= len(prompt)
            if variant == "vllm+":
                assert hit % cache.block == 0
            assert cache.used == cache.held_bytes() <= budget
            _check_structure(cache)


# ----------------------------------------------------------------------------- replay


@dataclass
class _TraceRequest:          # the fields of workloads.base.TraceRequest a replay reads
    request_id: str
    segments: list
    output_tokens: int


def test_replay_reads_workload_requests_and_a_later_prompt_quoting_an_answer_hits_it():
    a = _TraceRequest("a", [(7, 0, 512), (8, 0, 100)], 20)
    b = _TraceRequest("b", [(7, 0, 512), (8, 0, 100), ("out/a", 0, 20), ("u/b", 0, 5)], 3)
    res = replay([a, b], TOY, BIG, "sglang+")
    assert res.hit_tokens == (0, 632) and res.prompt_tokens == (612, 637)
    assert res.request_ids == ("a", "b") and res.token_hit_rate == 632 / (612 + 637)
    assert as_request(a, 0).output == (("out/a", 0, 20),)


def test_flops_saved_sum_the_models_per_token_flops():
    cm = CostModel.from_model("nemotron-h-8b")
    from sim.models import get_model
    spec = get_model("nemotron-h-8b")
    assert cm.prefill_flops(3, 9) == pytest.approx(sum(spec.flops_per_token(t) for t in range(3, 9)))
    res = replay([req([1, 2, 3], [4]), req([1, 2, 3, 4, 5])], cm, BIG, "marconi")
    assert res.hit_tokens == (0, 4)
    assert res.flops_saved == pytest.approx(sum(spec.flops_per_token(t) for t in range(4)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_result_flop_aware_beats_lru_which_beats_vllm_plus_under_tight_memory(seed):
    trace = branches_trace(seed)
    cm = CostModel.from_model("nemotron-h-8b")
    rate = {v: replay(trace, cm, 4 * 2**30, v).token_hit_rate for v in ("vllm+", "sglang+", "marconi")}
    assert rate["marconi"] > rate["sglang+"] + 0.1
    assert rate["sglang+"] > rate["vllm+"] + 0.2


def test_alpha_is_tuned_on_a_bootstrap_window_of_five_times_the_requests_before_eviction():
    trace = branches_trace(0)
    cm = CostModel.from_model("nemotron-h-8b")
    budget = 4 * 2**30
    # before the first eviction every cache holds the same: find where it would overflow
    free = RadixTree(cm, BIG, FlopAware())
    n0 = next(k + 1 for k, r in enumerate(trace) if (free.serve(r), free.used)[1] > budget)
    res = replay(trace, cm, budget, "marconi")
    assert res.alpha_tuned_after == 5 * n0
    assert sorted(res.alpha_rates) == [k / 10 for k in range(21)]
    best = max(res.alpha_rates.values())
    assert res.alpha == min(a for a, r in res.alpha_rates.items() if r == best) > 0
    # the window's rate for the chosen alpha is that of replaying the window with it fixed
    window = replay(trace[: 5 * n0], cm, budget, "marconi", alpha=res.alpha)
    assert window.token_hit_rate == pytest.approx(res.alpha_rates[res.alpha])
    # until then alpha was 0: the first requests are served as with alpha 0 throughout
    zero = replay(trace, cm, budget, "marconi", alpha=0.0)
    assert res.hit_tokens[: 5 * n0] == zero.hit_tokens[: 5 * n0]


def test_a_trace_shorter_than_its_window_keeps_alpha_zero():
    res = replay(branches_trace(0)[:40], CostModel.from_model("nemotron-h-8b"), 2 * 2**30, "marconi")
    assert res.alpha == 0.0 and res.alpha_tuned_after is None and res.evictions > 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(variant="lru"), "marconi.variant"),
    (dict(variant="sglang+", alpha=1.0), "marconi.alpha"),
    (dict(variant="marconi", alpha=-1), "marconi.alpha"),
    (dict(variant="marconi", budget_bytes=-5), "marconi.budget_bytes"),
    (dict(variant="vllm+", block_size=0), "marconi.block_size"),
    (dict(variant="marconi", bootstrap_multiplier=0), "marconi.bootstrap_multiplier"),
])
def test_bad_arguments_are_one_line_input_errors_naming_the_field(kwargs, field):
    args = dict(requests=[req([1])], model=TOY, budget_bytes=100, variant="marconi")
    args.update(kwargs)
    with pytest.raises(InputError) as e:
        replay(**args)
    assert str(e.value).startswith(field + ": ") and "\n" not in str(e.value)
