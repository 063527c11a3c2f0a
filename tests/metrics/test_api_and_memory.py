"""The notebook API (sim/entrypoints/api.py: ``sim.run``, ``sim.load``, ``sim.sweep``), the memory
series of a run folder, and the ITL statistics with and without decode jumps."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.config.scenario import load_scenario
from sim.rundir.records import MEMORY_COLUMNS, REQUEST_COLUMNS
from sim.commands.run import simulate, write_run

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"


def test_import_sim_stays_cheap():
    code = ("import sys, sim; bad = [m for m in ('pandas', 'matplotlib', 'simpy', 'sim.commands.run', "
            "'sim.entrypoints.api', 'numpy') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stderr


def test_run_is_the_cli_path_and_load_reads_it_back(tmp_path):
    r = sim.run(TINY, set={"workload.num_requests": 12}, out=tmp_path / "run")
    assert r.path == tmp_path / "run" and (tmp_path / "run" / "report.md").is_file()
    cli = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "sim", "run", str(TINY), "--requests", "12", "--out",
                    str(cli), "-q"], check=True, cwd=ROOT)
    assert (cli / "requests.csv").read_bytes() == (tmp_path / "run" / "requests.csv").read_bytes()
    assert (cli / "memory.csv").read_bytes() == (tmp_path / "run" / "memory.csv").read_bytes()
    strip = lambda s: {k: v for k, v in s.items() if k not in ("wall_s", "sim_requests_per_s")}
    assert strip(json.loads((cli / "summary.json").read_text())) == strip(r.summary)
    back = sim.load(cli)
    assert strip(back.summary) == strip(r.summary) and back.info["name"] == "athena-tiny"
    cols = back.request_columns
    assert list(cols) == list(REQUEST_COLUMNS) and len(cols["request_id"]) == 12
    assert all(isinstance(v, int) for v in cols["output_tokens"])
    assert all(isinstance(v, float) for v in cols["ttft_s"])
    assert list(back.memory_columns) == list(MEMORY_COLUMNS)
    # sim.run is the API's function, whether or not the command's module was imported
    from sim.commands import run as run_module
    from sim.entrypoints import api
    assert sim.run is api.run and sim.sweep is api.sweep and run_module.simulate is simulate


def test_run_without_out_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = sim.run(TINY, requests=5)
    assert r.path is None and r.summary["requests"] == 5
    assert list(tmp_path.iterdir()) == []


def test_load_of_a_bad_folder_is_one_line(tmp_path):
    from sim.errors import InputError

    with pytest.raises(InputError, match="not a run folder"):
        sim.load(tmp_path / "nope")
    (tmp_path / "summary.json").write_text("[1]")
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(InputError, match=r"summary\.json: expected a JSON object"):
        sim.load(tmp_path)


def test_tables_are_typed_dataframes(tmp_path):
    pd = pytest.importorskip("pandas")
    r = sim.run(TINY, requests=8, set={"slo.ttft_ms": 500})
    df = r.requests
    assert list(df.columns) == list(REQUEST_COLUMNS) and len(df) == 8
    assert str(df["output_tokens"].dtype) == "int64" and str(df["ttft_s"].dtype) == "float64"
    assert str(df["request_id"].dtype) == "string" and str(df["slo_ok"].dtype) == "int64"
    mem = r.memory
    assert list(mem.columns) == list(MEMORY_COLUMNS) and str(mem["kv_blocks"].dtype) == "int64"
    pts = sim.sweep(ROOT / "scenarios" / "sweeps" / "flag-onoff.yaml", requests=4, workers=1)
    assert len(pts) == 16 and set(pts["status"]) == {"ok"} and pts.attrs["path"] is None
    assert isinstance(pd.DataFrame, type)


def test_memory_series_against_the_summary(tmp_path):
    sc = load_scenario(TINY)
    dep, rows, s = simulate(sc)
    out = write_run(tmp_path / "run", sc, dep, rows, s, report=True)
    r = sim.load(out)
    m = r.memory_columns
    block = s["pool_bytes"] / s["num_gpu_blocks"]
    usable = s["num_gpu_blocks"] - 1
    assert len(m["time_s"]) == min(s["steps"], len(m["time_s"])) > 10
    assert m["time_s"] == sorted(m["time_s"])
    for kv, mb, used, cached in zip(m["kv_blocks"], m["mamba_blocks"], m["in_use_blocks"],
                                    m["cached_blocks"]):
        assert 0 <= used <= kv + mb <= usable and cached == kv + mb - used
    # the per-kind peaks see every allocation; the series samples steps
    assert max(m["kv_blocks"]) * block <= s["kv_bytes_peak"]
    assert max(m["mamba_blocks"]) * block <= s["mamba_state_bytes_peak"]
    assert max(k + b for k, b in zip(m["kv_blocks"], m["mamba_blocks"])) * block == \
        s["occupied_bytes_peak"] <= s["pool_bytes"]
    assert max(m["in_use_blocks"]) * block == s["in_use_bytes_peak"]
    assert s["occupied_bytes_peak"] <= s["kv_bytes_peak"] + s["mamba_state_bytes_peak"]
    report = (out / "report.md").read_text()
    assert "All memory figures are per GPU" in report and "need not be simultaneous" in report
    assert "![How full is each GPU's cache pool over time?" in report
    assert (out / "memory.png").stat().st_size > 10_000


def test_itl_with_and_without_decode_jumps():
    # speculative decoding, decode jumps: per request rows equal (tpot, itl, chunks
    # included); the mean ITL is exact, its percentiles count a jump's steps as its mean
    sc = load_scenario(ROOT / "scenarios" / "athena.yaml", {"workload.num_requests": 60})
    fast = simulate(sc, jump=True)
    slow = simulate(sc, jump=False, fast_decode=False)
    assert fast[1] == slow[1]
    f, s = fast[2], slow[2]
    assert fast[0].sampler.itl_count == slow[0].sampler.itl_count == \
        sum(r.output_chunks - 1 for r in fast[1])
    assert f["mean_itl_ms"] == pytest.approx(s["mean_itl_ms"], rel=1e-12)
    for q in ("p50", "p90", "p99"):
        assert f[f"{q}_itl_ms"] == pytest.approx(s[f"{q}_itl_ms"], rel=2e-3)
    # a request's ITLs add up to its decode time; TPOT spreads it over tokens, not chunks
    total_ns = sum(round((r.e2e_s - r.ttft_s) * 1e9) for r in fast[1])
    assert abs(fast[0].sampler.itl_sum_ns - total_ns) <= len(fast[1])
    for r in fast[1]:
        if r.output_tokens > 1:
            assert r.tpot_ms == pytest.approx((r.e2e_s - r.ttft_s) * 1e3 / (r.output_tokens - 1))
            assert r.output_chunks < r.output_tokens        # MTP: several tokens a step
            assert math.isclose(r.itl_ms * (r.output_chunks - 1), r.tpot_ms * (r.output_tokens - 1))
