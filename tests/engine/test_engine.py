"""The replay engine against hand-computed timelines, and against `sim case`.

Scenarios are written into tmp_path with a JSONL workload so every arrival and
prompt is explicit.  Step times are recomputed here from first principles (the
roofline stated in backends/analytical.py), not by calling the backend.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.config.scenario import load_scenario
from sim.rundir.records import REQUEST_COLUMNS
from sim.commands.run import simulate, write_run

BASE = {
    "name": "tiny",
    "seed": 3,
    "model": "nemotron-h-8b",
    "kv_cache": {"tensor_parallel_size": 1, "num_gpu_blocks_override": 400},
    "gpu": {"type": "H200"},
    "cache": {"policy": "vllm", "hash_block_size": 16, "prefix_cache_retention_interval": 0},
    "scheduler": {"max_num_batched_tokens": 4096, "max_num_seqs": 8},
    "backend": {"kind": "analytical", "mfu": 0.5, "mbu": 0.7, "overhead_s": 0.004},
}


def scenario(tmp_path: Path, requests: list[dict], **over) -> Path:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in requests))
    data = json.loads(json.dumps(BASE))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    data["workload"] = {"kind": "jsonl", "path": "trace.jsonl"}
    p = tmp_path / "scenario.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def by_id(rows):
    return {r.request_id: r._asdict() for r in rows}


def roofline_ns(cost, items: list[tuple[int, int]]) -> int:
    """One step of (new tokens, cached context) items, from the documented formula."""
    flops = 0.0
    mem = cost.weight_bytes
    for t, c in items:
        flops += t * cost.dense_flops_per_token + t * cost.ssd_flops_per_token * cost.mamba_layers
        flops += 4.0 * cost.attn_layers * cost.attn_width * (t * c + t * (t + 1) / 2)
        mem += (c + 2 * t) * cost.kv_bytes_per_token + 2.0 * cost.state_bytes_per_seq
    compute = flops / (cost.peak_flops * cost.mfu)
    memory = mem / (cost.hbm_bytes_per_s * cost.mbu)
    return max(1, round((cost.overhead_s + max(compute, memory)) * 1e9))


def test_lone_request_ttft_is_its_prefill_time(tmp_path):
    # 1,000 tokens, block 1,040, unit 16: the split stops at the prompt checkpoint
    # floor(999 / 16) * 16 = 992, then the last 8 tokens; TTFT = both chunks.
    sc = load_scenario(scenario(tmp_path, [
        {"id": "a", "arrival_s": 1.0, "prompt": "S:1000", "output_tokens": 1}]))
    dep, rows, s = simulate(sc)
    r = by_id(rows)["a"]
    cost = dep.cost
    want = roofline_ns(cost, [(992, 0)]) + roofline_ns(cost, [(8, 992)])
    assert dep.layout.block_size == 1040
    assert round(r["ttft_s"] * 1e9) == want
    assert r["queue_s"] == 0.0 and r["hit_tokens"] == 0
    assert r["e2e_s"] == r["ttft_s"]  # one output token: done at the first token


def test_second_request_queues_behind_the_first(tmp_path):
    # max_num_seqs 1: b waits until a has finished all 3 tokens.
    sc = load_scenario(scenario(tmp_path, [
        {"id": "a", "arrival_s": 0.0, "prompt": "A:500", "output_tokens": 3},
        {"id": "b", "arrival_s": 0.0, "prompt": "B:300", "output_tokens": 1}],
        scheduler={"max_num_seqs": 1}))
    dep, rows, _ = simulate(sc)
    a, b = by_id(rows)["a"], by_id(rows)["b"]
    cost = dep.cost
    # a: chunks [496, 500] (checkpoint floor(499/16)*16 = 496), then 2 decode steps.
    a_prefill = roofline_ns(cost, [(496, 0)]) + roofline_ns(cost, [(4, 496)])
    a_total = a_prefill + roofline_ns(cost, [(1, 500)]) + roofline_ns(cost, [(1, 501)])
    assert round(a["ttft_s"] * 1e9) == a_prefill
    assert round(a["e2e_s"] * 1e9) == a_total
    assert round(b["queue_s"] * 1e9) == a_total
    b_prefill = roofline_ns(cost, [(288, 0)]) + roofline_ns(cost, [(12, 288)])
    assert round(b["ttft_s"] * 1e9) == a_total + b_prefill


def test_preemption_recomputes_the_newest_request(tmp_path):
    # A pool of 21 blocks (6 Mamba + 1 attention group): the smallest that passes vLLM's
    # per-request accounting for 1,120 slots (2 attention + 6 x (2 + 1 internal prefill
    # checkpoint) = 20 usable blocks); both 1,000-token prompts are admitted, and long
    # decodes cross a block boundary and need one more attention block.
    sc = load_scenario(scenario(tmp_path, [
        {"id": "a", "arrival_s": 0.0, "prompt": "A:1000", "output_tokens": 120},
        {"id": "b", "arrival_s": 0.0, "prompt": "B:1000", "output_tokens": 120}],
        kv_cache={"num_gpu_blocks_override": 21}))
    dep, rows, s = simulate(sc)
    a, b = by_id(rows)["a"], by_id(rows)["b"]
    assert dep.groups == ("mamba",) * 6 + ("full",)      # vLLM's order: Mamba layers come first
    assert s["preemptions"] >= 1
    assert a["preemptions"] == 0 and b["preemptions"] >= 1   # the newest is preempted
    assert b["recomputed_tokens"] > 0
    assert a["output_tokens"] == 120 and b["output_tokens"] == 120
    assert b["e2e_s"] > a["e2e_s"]


def test_run_hits_equal_case_hits_when_requests_do_not_overlap(tmp_path):
    from sim.cache.case import run_case_data

    prompts = ["S:1500 U1:200", "S:1500 U2:900", "S:1500 U1:200 X:40", "S:700 Q:9",
               "S:1500 U2:900 Y:2100", "S:1500 U2:900 Y:2100 Z:3"]
    reqs = [{"id": f"r{i}", "arrival_s": 100.0 * i, "prompt": p, "output_tokens": 1}
            for i, p in enumerate(prompts)]
    for spec in ({"method": "eagle", "num_speculative_tokens": 2, "mean_accepted_tokens": 1.0},
                 {}):
        for flag in (False, True):
            for lookahead_off in (False, True):
                sc = load_scenario(scenario(
                    tmp_path, reqs, speculative=spec,
                    cache={"enable_mamba_shared_prefix_checkpoint": flag,
                           "disable_lookahead_block_hashes": lookahead_off}))
                dep, rows, _ = simulate(sc)
                cfg = dep.kv.cfg
                case = {"config": {f: getattr(cfg, f) for f in cfg.field_names()},
                        "requests": [{"id": r["id"], "prompt": r["prompt"]} for r in reqs]}
                case["config"]["groups"] = list(cfg.groups)
                case["config"]["max_num_batched_tokens"] = 4096
                want = {r["id"]: (r["hit"], r["junction"]) for r in run_case_data(case)}
                got = {k: (v["hit_tokens"], v["junction"]) for k, v in by_id(rows).items()}
                assert got == want, (spec, flag, lookahead_off)
                assert any(h for h, _ in want.values())


def test_jumps_and_fast_decode_change_nothing(tmp_path):
    reqs = [{"id": f"r{i}", "arrival_s": 0.37 * i, "prompt": f"S:{600 + 37 * i} U{i}:{50 + i}",
             "output_tokens": 40 + 13 * i} for i in range(12)]
    sc = load_scenario(scenario(tmp_path, reqs, speculative={
        "method": "eagle", "num_speculative_tokens": 3, "mean_accepted_tokens": 1.7}))
    fast = simulate(sc, jump=True, fast_decode=True)
    slow = simulate(sc, jump=False, fast_decode=False)
    assert fast[1] == slow[1]
    assert fast[2]["steps"] == slow[2]["steps"]


def test_same_seed_same_bytes(tmp_path):
    sc = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "athena.yaml",
                       {"workload.num_requests": 150})
    outs = []
    for i in range(2):
        dep, rows, s = simulate(sc)
        d = write_run(tmp_path / f"run{i}", sc, dep, rows, s, report=False)
        summary = json.loads((d / "summary.json").read_text())
        summary.pop("wall_s"), summary.pop("sim_requests_per_s")
        outs.append(((d / "requests.csv").read_bytes(), summary))
    assert outs[0] == outs[1]


def test_max_model_len_rejects_long_prompts_and_caps_outputs(tmp_path):
    # vLLM's input checks refuse a prompt of max_model_len tokens or more (no room for one
    # output token); generation stops when prompt + outputs reach max_model_len.
    reqs = [{"id": "fits", "arrival_s": 0.0, "prompt": "A:900", "output_tokens": 50},
            {"id": "capped", "arrival_s": 0.1, "prompt": "B:990", "output_tokens": 50},
            {"id": "equal", "arrival_s": 0.2, "prompt": "C:1000", "output_tokens": 5},
            {"id": "longer", "arrival_s": 0.3, "prompt": "D:1500", "output_tokens": 5}]
    spec = {"method": "eagle", "num_speculative_tokens": 3, "mean_accepted_tokens": 2.0}
    sc = load_scenario(scenario(tmp_path, reqs, scheduler={"max_model_len": 1000},
                                speculative=spec))
    dep, rows, s = simulate(sc)
    got = by_id(rows)
    assert sorted(got) == ["capped", "fits"]
    assert s["rejected_requests"] == 2 and s["requests"] == 2
    assert got["fits"]["output_tokens"] == 50
    assert got["capped"]["output_tokens"] == 10          # 1000 - 990
    # jumps stop before positions reach max_model_len: stepping agrees
    slow = simulate(sc, jump=False, fast_decode=False)
    assert rows == slow[1]
    # unset: no limit
    free = simulate(load_scenario(scenario(tmp_path, reqs, speculative=spec)))
    assert free[2]["rejected_requests"] == 0
    assert by_id(free[1])["longer"]["output_tokens"] == 5


def test_max_model_len_is_validated(tmp_path):
    from sim.config.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="scheduler.max_model_len: must be an integer >= 2"):
        load_scenario(scenario(tmp_path, [], scheduler={"max_model_len": 1}))
    with pytest.raises(ScenarioError, match="long_prefill_token_threshold: 600 cannot be"):
        load_scenario(scenario(tmp_path, [], scheduler={"max_model_len": 512,
                                                         "long_prefill_token_threshold": 600}))


def test_a_follow_up_turn_arrives_its_think_time_after_the_previous_turn_finishes(tmp_path):
    # closed loop: the follow-up record comes right after its first turn in the trace,
    # before that turn has even started; it must still wait for it to finish
    reqs = [{"id": "a", "arrival_s": 0.25, "prompt": "S:2000", "output_tokens": 300,
             "session": "s"},
            {"id": "b", "prompt": "S:2000 U:50", "output_tokens": 10, "session": "s",
             "after": "a", "think_s": 0.5},
            {"id": "c", "arrival_s": 0.3, "prompt": "X:500", "output_tokens": 5}]
    dep, rows, s = simulate(load_scenario(scenario(tmp_path, reqs)))
    got = by_id(rows)
    a_done = got["a"]["arrival_s"] + got["a"]["e2e_s"]
    assert a_done > 0.25 + 0.5          # (so arriving 0.5 s after a's arrival would be early)
    assert got["b"]["arrival_s"] == pytest.approx(a_done + 0.5, abs=2e-9)


def test_a_follow_up_of_a_rejected_turn_still_arrives(tmp_path):
    reqs = [{"id": "a", "arrival_s": 0.0, "prompt": "S:3000", "output_tokens": 5,
             "session": "s"},
            {"id": "b", "prompt": "T:100", "output_tokens": 5, "session": "s",
             "after": "a", "think_s": 1.5}]
    dep, rows, s = simulate(load_scenario(scenario(tmp_path, reqs,
                                                   scheduler={"max_model_len": 2048})))
    assert s["rejected_requests"] == 1
    assert [r.request_id for r in rows] == ["b"]
    assert by_id(rows)["b"]["arrival_s"] == pytest.approx(1.5, abs=2e-9)


def test_the_report_says_how_many_requests_were_rejected(tmp_path):
    reqs = [{"id": "a", "arrival_s": 0.0, "prompt": "S:3000", "output_tokens": 5},
            {"id": "b", "arrival_s": 0.1, "prompt": "T:100", "output_tokens": 5}]
    sc = load_scenario(scenario(tmp_path, reqs, scheduler={"max_model_len": 2048}))
    dep, rows, s = simulate(sc)
    out = write_run(tmp_path / "run", sc, dep, rows, s)
    assert "| requests | 1 served, 1 rejected (requests.csv `rejected`) |" in \
        (out / "report.md").read_text()
    # the refused request has its row, marked, with no measurements; the served one none
    lines = (out / "requests.csv").read_text().splitlines()
    assert ",mamba_states_written,rejected,tpot_ms,itl_ms,output_chunks,slo_ok" in lines[0]
    after = len(REQUEST_COLUMNS) - REQUEST_COLUMNS.index("rejected") - 1   # (empty columns)
    assert lines[1] == "a,,0.000000,3000" + "," * 11 + ",exceeds_max_model_len" + "," * after
    assert lines[2].startswith("b,,0.100000,100,") and ",," in lines[2]   # served: rejected ""
    assert len(lines[2].split(",")) == len(REQUEST_COLUMNS)


def test_ns_rounds_exactly_as_round():
    """The engine's seconds -> integer ns conversion equals round(x * 1e9) on
    random, half-way, integral and huge values."""
    import random

    from sim.engine.engine import ns

    rng = random.Random(2)
    xs = [rng.random() * 10 ** rng.randint(-9, 5) for _ in range(20_000)]
    xs += [(k + 0.5) / 1e9 for k in range(2_000)]          # ties (where representable)
    xs += [k / 1e9 for k in range(2_000)] + [0.0, 1e-12, 2.5e-9, 3.5e-9, 1e7, 2.0**60 / 1e9]
    # either side of the machine-integer range (4e18 ns), and below zero
    xs += [3.999999999e9, 4.0e9, 4.0e9 + 4096, 1e11, 2.0**70, -0.0, -1e-12, -2.5e-9, -3.5e-9, -7.25]
    for x in xs:
        got = ns(x)
        assert got == round(x * 1e9) and type(got) is int, x
    assert sum(1 for k in range(2_000) if ((k + 0.5) / 1e9) * 1e9 == k + 0.5) > 100  # ties hit


class _Protocol:
    """The analytical model behind the plain backend protocol, as any other backend is
    called; ``jumps=False``: every step becomes a plan (``log`` keeps what each said)."""

    def __init__(self, cost, jumps: bool = True, log: list | None = None):
        self.cost = cost
        self.jumps = jumps
        self.log = log
        self.plan_ids: set[int] = set()

    def step_time(self, plan) -> float:
        self.plan_ids.add(id(plan))
        if self.log is not None:
            self.log.append((plan.index, list(plan.finished), [
                (it.request_id, it.is_prefill, it.padded, it.spec_tokens, it.accepted,
                 it.kept, it.finishes, it.first_prefill, it.context, it.num_tokens,
                 it.tokens.num_tokens) for it in plan.items]))
        return self.cost.step_time(plan)

    def time_from_sums(self, n, T, C, TC, TT) -> float:
        assert self.jumps
        return self.cost.time_from_sums(n, T, C, TC, TT)


def test_cost_model_called_natively_gives_the_same_run(monkeypatch):
    """The engine times the analytical model by its compiled twin (sim/engine/step_cost.py)
    when the backend is the cost model, and calls the plain model through the backend
    protocol otherwise: the runs are identical (athena-tiny: chunked prefill, jumps, MTP)."""
    from sim.commands import run as R
    from sim.engine import replica   # (where a replica's engine and backend are built)

    sc = load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "athena-tiny.yaml")
    made = []
    orig = replica.Engine

    def spy(sched, backend, *a, **k):
        made.append(orig(sched, backend, *a, **k))
        return made[-1]

    def generic(sched, backend, *a, **k):
        made.append(orig(sched, _Protocol(backend), *a, **k))
        return made[-1]

    monkeypatch.setattr(replica, "Engine", spy)
    _, fast, s1 = R.simulate(sc)
    monkeypatch.setattr(replica, "Engine", generic)
    _, slow, s2 = R.simulate(sc)
    assert made[0].cost is not None and made[1].cost is None and made[1].jump
    assert fast == slow and len(fast) >= 40 and s1["steps"] == s2["steps"]


def _planned_run(monkeypatch, sc):
    """``sc`` run with every step handed to a logging backend (no jumps)."""
    from sim.commands import run as R
    from sim.engine import replica   # (where a replica's engine and backend are built)

    log: list = []
    backends = []

    def build(scen, dep, plant=None):
        backends.append(_Protocol(dep.cost, jumps=False, log=log))
        return backends[-1]

    with monkeypatch.context() as m:
        m.setattr(replica, "build_backend", build)
        _, rows, summary = R.simulate(sc)
    return sc, rows, summary, log, backends[0]


def _plan_case(tmp_path, case: str):
    if case == "padded":   # b's 2,064-token hit leaves one token: padded to 1 + K
        return load_scenario(scenario(tmp_path, [
            {"id": "a", "arrival_s": 0.0, "prompt": "S:2080", "output_tokens": 2},
            {"id": "b", "arrival_s": 1.0, "prompt": "S:2065", "output_tokens": 4},
            {"id": "c", "arrival_s": 1.0, "prompt": "Q:50", "output_tokens": 40}],
            speculative={"method": "eagle", "num_speculative_tokens": 3,
                         "mean_accepted_tokens": 1.5}))
    K, mean = {"tiny-k1": (1, 0.6), "tiny-k3": (3, 1.8)}[case]
    return load_scenario(Path(__file__).resolve().parents[2] / "scenarios" / "athena-tiny.yaml",
                         {"speculative.num_speculative_tokens": K,
                          "speculative.mean_accepted_tokens": mean})


@pytest.mark.parametrize("case", ["tiny-k1", "tiny-k3", "padded"])
def test_the_step_plan_says_what_each_step_does_to_each_request(monkeypatch, tmp_path, case):
    """What the plan hands a backend, checked against the scripted acceptance pattern and
    the requests' outputs: step s accepts floor((s + 1) m) - floor(s m) drafts (at most
    the drafts the item verifies; none of a padded one); each request's sampled tokens
    (a decode step's ``kept``, one per last prefill chunk) add up to its output tokens; it
    finishes in exactly one item, its last; its id reaches the next plan's ``finished``;
    ``first_prefill`` marks its items up to the first token; one plan object throughout."""
    from fractions import Fraction

    sc = _plan_case(tmp_path, case)
    K, mean = sc.speculative.num_speculative_tokens, sc.speculative.mean_accepted_tokens
    sc, rows, summary, log, backend = _planned_run(monkeypatch, sc)
    _, plain_rows, plain = simulate(sc)   # the same run, with jumps and the native calls
    assert rows == plain_rows and summary["steps"] == plain["steps"] == len(log)
    assert len(backend.plan_ids) == 1
    frac = Fraction(mean).limit_denominator(1000)
    pattern = [int((s + 1) * frac) - int(s * frac) for s in range(len(log) + 1)]
    assert [index for index, _, _ in log] == list(range(len(log)))   # (no empty steps here)
    sampled: dict[str, int] = {}
    finished_at: dict[str, int] = {}
    first_token: dict[str, int] = {}
    decodes = padded = 0
    for step, (index, done, items) in enumerate(log):
        for rid in done:
            assert finished_at[rid] < step
        for (rid, prefill, pad, spec, acc, kept, fin, first, ctx, n, total) in items:
            assert rid not in finished_at
            if prefill:
                assert acc == 0 and kept == n and spec == 0
                got = 1 if ctx + n >= total else 0
            else:
                if pad:
                    padded += 1
                    assert acc == 0 and spec == K and n == 1 + K
                else:
                    decodes += 1
                    assert acc == min(spec, pattern[index])
                got = kept
                assert kept == min(1 + acc, next(r.output_tokens for r in rows
                                                 if r.request_id == rid) - sampled.get(rid, 0))
            assert first == (rid not in first_token)
            if got and rid not in first_token:
                first_token[rid] = step
            sampled[rid] = sampled.get(rid, 0) + got
            if fin:
                finished_at[rid] = step
    outputs = {r.request_id: r.output_tokens for r in rows}
    assert sampled == outputs and set(finished_at) == set(outputs)
    delivered = [rid for _, done, _ in log for rid in done]
    assert len(delivered) == len(set(delivered))
    assert set(delivered) <= set(outputs) and len(delivered) >= len(outputs) - 3
    assert decodes > 10 and (K == 1 or any(pattern[i] > 1 for i in range(len(log))))
    assert padded == (1 if case == "padded" else 0)
