"""``sim marconi SCENARIO``: a scenario through Marconi's reference model, sized by its pool.

The route's numbers are checked against ``sim.marconi.replay`` called directly on the same
requests (the workload generator), costs (the catalogue model) and budget (the override's
blocks x the layout's pool block bytes), the way ``bench/marconi_reference.py`` calls it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.entrypoints.cli import main
from sim.marconi import CostModel, replay
from sim.models import derive_layout, get_model
from sim.rundir.records import REQUEST_COLUMNS, read_request_records
from workloads import build_workload

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios/multi-turn.yaml"
N, BLOCKS = 60, 120
ARGS = [str(SCENARIO), "--requests", str(N), "--set", f"kv_cache.num_gpu_blocks_override={BLOCKS}"]
TIMING = ("queue_s", "ttft_s", "e2e_s", "tpot_ms", "itl_ms", "output_chunks", "preemptions")


def _sim(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def _direct(variant: str):
    """The same replay through the sim/marconi API, inputs rebuilt without the route."""
    from sim.config.scenario import load_scenario

    sc = load_scenario(SCENARIO, {"workload.num_requests": N})
    spec = get_model(sc.model.name)
    # the scenario's layout, spelled out: TP 2, float32 Mamba state, MTP k=5 (its layer's
    # KV and state live in the pool too)
    layout = dict(tp=2, mamba_cache_dtype="float32", mamba_ssm_cache_dtype="float32",
                  speculative_method="mtp", num_speculative_tokens=5)
    budget = BLOCKS * derive_layout(spec, **layout).pool_block_bytes
    # arrival order: a multi-turn workload is generated session by session
    reqs = sorted(build_workload(sc.workload, sc.seed, SCENARIO.parent), key=lambda t: t.arrival_s)
    return budget, replay(reqs, CostModel.from_model(spec, **layout), budget, variant)


@pytest.mark.parametrize("variant", ["marconi", "sglang+", "vllm+"])
def test_route_equals_the_reference_api(tmp_path, variant, capsys):
    out = tmp_path / "ref"
    assert _sim(["marconi", *ARGS, "--variant", variant, "--out", str(out)]) == 0
    budget, res = _direct(variant)
    s = json.loads((out / "summary.json").read_text())
    assert s["policy"] == "marconi-reference" and s["variant"] == variant
    assert s["timing"] is None
    assert s["pool_bytes"] == budget == s["budget_bytes"]
    assert s["requests"] == N == res.num_requests
    assert s["hit_tokens"] == sum(res.hit_tokens)
    assert s["prompt_tokens"] == sum(res.prompt_tokens)
    assert s["token_hit_rate"] == res.token_hit_rate
    assert s["evictions"] == res.evictions and s["states_admitted"] == res.states_admitted
    rows = read_request_records(out / "requests.csv")
    assert [r.request_id for r in rows] == list(res.request_ids)
    assert [r.hit_tokens for r in rows] == list(res.hit_tokens)
    assert all(getattr(r, c) == "" for r in rows for c in TIMING)
    report = (out / "report.md").read_text()
    assert "reference cache model (no timing)" in report and "no TTFT" in report
    assert f"{N} requests  reference {variant}" in capsys.readouterr().out


def test_memory_binds_and_variants_differ(tmp_path):
    """At 120 blocks the cache evicts, and the paper's vLLM+ (a state per block) keeps
    far fewer hits than Marconi's admission, as in the paper's comparisons."""
    hits = {}
    for v in ("vllm+", "sglang+"):
        out = tmp_path / v.rstrip("+")
        assert _sim(["marconi", *ARGS, "--variant", v, "--out", str(out), "-q"]) == 0
        s = json.loads((out / "summary.json").read_text())
        assert s["evictions"] > 0
        hits[v] = s["hit_tokens"]
    assert hits["vllm+"] < hits["sglang+"]


def test_byte_identical(tmp_path):
    for d in ("a", "b"):
        assert _sim(["marconi", *ARGS, "--out", str(tmp_path / d), "-q"]) == 0
    for f in ("requests.csv", "summary.json", "report.md"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    with open(tmp_path / "a" / "requests.csv", newline="") as f:
        assert tuple(next(csv.reader(f))) == REQUEST_COLUMNS


@pytest.mark.parametrize("extra, message", [
    (["--variant", "lru"], "Invalid value for '--variant'"),
    (["--alpha", "-1"], "--alpha: must be a number >= 0"),
    (["--variant", "vllm+", "--alpha", "1"], "--alpha: only the marconi variant has an alpha"),
    (["--set", "kv_cache.num_gpu_blocks_override=-5"], "num_gpu_blocks_override"),
])
def test_bad_values_exit_2_one_line(tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    assert _sim(["marconi", str(SCENARIO), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err
    assert not out.exists()
