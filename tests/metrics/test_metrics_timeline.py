"""TPOT, ITL, end-to-end latency, queueing, throughput and goodput on a hand-checked
timeline.

The backend is replaced by a step time fixed by hand (10 ms + 1 ms per request in the
step), so every instant below is computed on paper:

    A arrives at 0 (prompt 8, 5 output tokens); B at 25 ms (prompt 8, 3 tokens)
    step 1  [ 0, 11]  A prefill            A token 1 at 11
    step 2  [11, 22]  A decode             A token 2 at 22
    step 3  [22, 33]  A decode             A token 3 at 33      (B arrives at 25, waits)
    step 4  [33, 45]  A decode + B prefill A token 4, B token 1 at 45
    step 5  [45, 57]  A decode + B decode  A token 5 (done), B token 2 at 57
    step 6  [57, 68]  B decode             B token 3 (done) at 68

A: queue 0, TTFT 11, e2e 57, TPOT (57-11)/4 = 11.5, gaps 11 11 12 12.
B: queue 8, TTFT 20, e2e 43, TPOT (43-20)/2 = 11.5, gaps 12 11.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import sim.commands.run as run_mod
import sim.engine.replica as replica_mod
from sim.config.scenario import load_scenario
from sim.commands.run import simulate, write_run

BASE = {
    "name": "timeline",
    "model": "nemotron-h-8b",
    "kv_cache": {"tensor_parallel_size": 1, "num_gpu_blocks_override": 400},
    "cache": {"policy": "vllm", "hash_block_size": 16},
    "scheduler": {"max_num_batched_tokens": 4096, "max_num_seqs": 8},
}
REQUESTS = [{"id": "A", "arrival_s": 0.0, "prompt": "A:8", "output_tokens": 5},
            {"id": "B", "arrival_s": 0.025, "prompt": "B:8", "output_tokens": 3}]


class HandCost:
    """10 ms per step plus 1 ms per request in it (both the per-step and the jump form):
    a backend (``backends.base.StepBackend``)."""

    jumps = True

    def step_time(self, plan):
        return 0.010 + 0.001 * len(plan.items)

    def time_from_sums(self, n, T, C, tC, TT):
        return 0.010 + 0.001 * n


def _scenario(tmp_path: Path, slo: dict | None = None) -> Path:
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    data = dict(BASE, workload={"kind": "jsonl", "path": "trace.jsonl"})
    if slo is not None:
        data["slo"] = slo
    p = tmp_path / "timeline.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.fixture
def hand_cost(monkeypatch):
    real = replica_mod.cost_model

    def fake(sc, layout, gpu):
        real(sc, layout, gpu)          # (still validated as usual)
        return HandCost()
    monkeypatch.setattr(replica_mod, "cost_model", fake)


@pytest.mark.parametrize("jump", [True, False])
def test_per_request_metrics(tmp_path, hand_cost, jump):
    dep, rows, s = simulate(load_scenario(_scenario(tmp_path)), jump=jump)
    a, b = rows
    assert (a.queue_s, a.ttft_s, a.e2e_s) == pytest.approx((0.0, 0.011, 0.057), abs=1e-12)
    assert (b.queue_s, b.ttft_s, b.e2e_s) == pytest.approx((0.008, 0.020, 0.043), abs=1e-12)
    assert (a.tpot_ms, b.tpot_ms) == pytest.approx((11.5, 11.5), abs=1e-9)
    assert (a.itl_ms, b.itl_ms) == pytest.approx((11.5, 11.5), abs=1e-9)
    assert (a.output_chunks, b.output_chunks) == (5, 3)
    assert (a.slo_ok, b.slo_ok) == ("", "")          # no slo: section


@pytest.mark.parametrize("jump", [True, False])
def test_summary_latencies_and_rates(tmp_path, hand_cost, jump):
    dep, rows, s = simulate(load_scenario(_scenario(tmp_path)), jump=jump)
    ttft = [11.0, 20.0]
    gaps = [11.0, 11.0, 12.0, 12.0, 12.0, 11.0]
    want = {
        "mean_ttft_ms": 15.5, "p50_ttft_ms": 15.5, "p90_ttft_ms": 19.1, "p99_ttft_ms": 19.91,
        "mean_tpot_ms": 11.5, "p50_tpot_ms": 11.5, "p90_tpot_ms": 11.5, "p99_tpot_ms": 11.5,
        "mean_itl_ms": 11.5, "p50_itl_ms": 11.5, "p90_itl_ms": 12.0, "p99_itl_ms": 12.0,
        "mean_e2el_ms": 50.0, "p50_e2el_ms": 50.0, "p90_e2el_ms": 55.6, "p99_e2el_ms": 56.86,
        "mean_queue_time_ms": 4.0, "p50_queue_time_ms": 4.0, "p90_queue_time_ms": 7.2,
        "p99_queue_time_ms": 7.92,
        "request_throughput": 2 / 0.068, "output_throughput": 8 / 0.068,
        "total_token_throughput": 24 / 0.068, "arrival_rate": 1 / 0.025,
    }
    # (the hand values agree with numpy's linear percentiles of the lists above)
    assert np.percentile(ttft, 90) == pytest.approx(19.1)
    assert np.percentile(gaps, [50, 90]) == pytest.approx([11.5, 12.0])
    for k, v in want.items():
        assert s[k] == pytest.approx(v, rel=1e-9, abs=1e-9), k
    assert s["slo_attainment"] is None and s["request_goodput"] is None
    assert dep.sampler.itl_count == 6 and dep.sampler.itl_sum_ns == 69_000_000


def test_goodput_counts_requests_meeting_every_slo(tmp_path, hand_cost):
    # TTFT 15 ms: A (11) meets it, B (20) does not
    dep, rows, s = simulate(load_scenario(_scenario(tmp_path, {"ttft_ms": 15})))
    assert [r.slo_ok for r in rows] == [1, 0]
    assert s["slo_attainment"] == 0.5
    assert s["request_goodput"] == pytest.approx(1 / 0.068)
    # a bound equal to the value is met (vLLM: slo >= value); TPOT is 11.5 ms for both
    _, rows, s = simulate(load_scenario(_scenario(tmp_path, {"tpot_ms": 11.5, "e2e_ms": 57})))
    assert [r.slo_ok for r in rows] == [1, 1] and s["slo_attainment"] == 1.0
    _, rows, s = simulate(load_scenario(_scenario(tmp_path, {"e2e_ms": 50})))
    assert [r.slo_ok for r in rows] == [0, 1]
    assert s["request_goodput"] == pytest.approx(1 / 0.068)


def test_written_and_read_back(tmp_path, hand_cost):
    from sim.rundir.records import read_request_records

    sc = load_scenario(_scenario(tmp_path, {"ttft_ms": 15}))
    dep, rows, s = simulate(sc)
    out = write_run(tmp_path / "run", sc, dep, rows, s, report=False)
    text = (out / "requests.csv").read_text().splitlines()
    assert ",rejected,tpot_ms,itl_ms,output_chunks,slo_ok" in text[0]
    assert ",,11.500000,11.500000,5,1," in text[1]   # (miss attribution's columns follow)
    back = read_request_records(out / "requests.csv")    # (6 decimals: seconds to the us)
    assert [(r.tpot_ms, r.itl_ms, r.output_chunks, r.slo_ok) for r in back] == \
        [(11.5, 11.5, 5, 1), (11.5, 11.5, 3, 0)]
    assert [r.ttft_s for r in back] == [0.011, 0.020]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["p90_itl_ms"] == 12.0 and summary["slo_attainment"] == 0.5


def test_a_run_folder_without_the_new_columns_reads_back(tmp_path, hand_cost):
    from sim.rundir.records import read_request_records

    sc = load_scenario(_scenario(tmp_path))
    dep, rows, s = simulate(sc)
    out = write_run(tmp_path / "run", sc, dep, rows, s, report=False)
    lines = (out / "requests.csv").read_text().splitlines()
    old = [",".join(line.split(",")[:16]) for line in lines]   # up to `rejected`
    (out / "requests.csv").write_text("\n".join(old) + "\n")
    back = read_request_records(out / "requests.csv")
    assert [r.ttft_s for r in back] == [0.011, 0.020]
    assert all(r.tpot_ms == "" and r.output_chunks == "" for r in back)
