"""bench/gpu_check.py runs whole on a CPU (``--device cpu --quick``): every output file, the
planted fault failing in both dtypes, a profile with provenance that loads as a backend
profile; and the pieces it is made of (the kernel grid, the per-kind fit, ``sim calibrate
--from-grid``, the held-out prefills)."""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

import yaml  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from sim.entrypoints.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """One scaled-down CPU run of the whole check, a second (wide) model included."""
    out = tmp_path_factory.mktemp("gpu_check")
    before = sorted(p.name for p in (ROOT / "profiles").iterdir())
    rc = gpu_check.main(["--device", "cpu", "--quick", "--out", str(out),
                         "--wide", "nemotron-h-8b:4:32:float32"])
    after = sorted(p.name for p in (ROOT / "profiles").iterdir())
    return rc, out, before, after


def test_the_cpu_check_passes_and_writes_every_file(check):
    rc, out, before, after = check
    assert rc == 0, (out / "summary.md").read_text()
    names = {p.name for p in out.iterdir()}
    for name in ("env.json", "env.txt", "summary.json", "summary.md",
                 "verify-fp32.log", "verify-bf16.log", "verify-fp32-planted.log",
                 "verify-bf16-planted.log", "grid-tiny-hybrid.json", "grid-tiny-hybrid.csv",
                 "kernels-tiny-hybrid.csv", "cpu-tiny-hybrid.yaml", "calibrate-tiny-hybrid.log",
                 "heldout-tiny-hybrid.csv", "ttft-tiny-hybrid.csv",
                 "cpu-nemotron-h-8b-l4-w32-fp32.yaml", "heldout-nemotron-h-8b-l4-w32-fp32.csv",
                 "kernels-nemotron-h-8b-l4-w32-fp32.csv"):
        assert name in names, name
        assert (out / name).stat().st_size > 0, name
    for d in ("verify-fp32", "verify-bf16"):
        assert (out / d / "verify.csv").is_file()
    assert before == after            # on a CPU the profile goes to the output folder only
    env = json.loads((out / "env.json").read_text())
    assert env["device"] == "cpu" and env["device_name"] and env["torch"] and env["date"]
    assert env["threads"] == 1


def test_honest_verifies_pass_and_the_planted_fault_fails_in_both_dtypes(check):
    _, out, _, _ = check
    v = json.loads((out / "summary.json").read_text())["verify"]
    for d in ("fp32", "bf16"):
        assert v[d]["exit"] == 0 and v[d]["worst_abs_err"] < (1e-4 if d == "fp32" else 0.25)
        assert v[f"{d}_planted"]["exit"] == 1 and v[f"{d}_planted"]["worst_abs_err"] > 1.0
        log = (out / f"verify-{d}-planted.log").read_text()
        assert "--plant state_off_by_one" in log and "FAIL" in log and "(exit 1)" in log
        assert "OK: every resumed prefill" in (out / f"verify-{d}.log").read_text()


def test_the_kernel_grid_times_every_kernel(check):
    from backends.torch_backend.timing import KERNELS

    _, out, _, _ = check
    rows = list(csv.DictReader(open(out / "kernels-tiny-hybrid.csv")))
    assert {r["kernel"] for r in rows} == set(KERNELS)
    assert all(float(r["median_s"]) > 0 and r["timer"] == "perf_counter" for r in rows)
    cached = [r for r in rows if r["kernel"] == "attention_prefill_cached"]
    assert cached and all(int(r["cached"]) > 0 for r in cached)
    assert all(int(r["bytes"]) > 0 for r in rows if r["kernel"].endswith(("save", "restore",
                                                                          "copy")))


def test_the_profile_has_provenance_and_loads_as_a_backend_profile(check):
    from sim.engine.replica import load_profile

    _, out, _, _ = check
    path = out / "cpu-tiny-hybrid.yaml"
    text = path.read_text()
    assert text.startswith("# made by: sim calibrate --from-grid ")
    prof = yaml.safe_load(text)
    p = prof["provenance"]
    assert p["date"] and p["device_name"] and p["torch"] and p["timer"] == "perf_counter"
    assert p["statistic"] == "median" and p["repeats"] >= 1
    assert "vLLM" in prof["implementation"] and "Triton" in prof["implementation"]
    assert set(prof["per_kind"]) >= {"mamba", "attention", "mlp", "other", "composed"}
    assert prof["per_kind"]["mamba"]["blocks"] == 4 and prof["per_kind"]["attention"]["blocks"] == 2
    assert prof["state_copies"]["save_s"] > 0
    assert prof["fit"]["state_save_in_per_item_s"] == prof["state_copies"]["save_s"]
    assert prof["held_out"]["n"] == 4 and prof["held_out"]["budget"] == 256
    fitted, _ = load_profile(path, (0.5, 0.7, 0.004))
    assert fitted["per_item_s"] > 0 and fitted["chunk_tokens"] == 128
    s = json.loads((out / "summary.json").read_text())
    t = s["models"]["tiny-hybrid"]["scenario_ttft"]
    assert t["requests"] == 6 and t["median_rel_err"] >= 0
    assert s["ok"] is True and set(s["phases_s"]) >= {"verify", "environment"}


def _grid(per_kind: dict, chunk: int = 64, save: float = 1e-5) -> dict:
    """A synthetic measured grid whose kinds follow known coefficients exactly."""
    import dataclasses

    from backends.torch_backend.config import TorchModelConfig
    from sim.commands.calibrate import GRID_FORMAT, design

    cfg = TorchModelConfig(pattern="M-M*", chunk_size=chunk)
    pts = []
    for t in (1, 8, 64, 100, 256):
        for c in (0, 128, 512):
            x = design([(t, c, 0.0)], chunk)[0]
            row = {"new_tokens": t, "cached": c}
            for k, coef in per_kind.items():
                row[k] = float(x @ coef)
            row["total"] = sum(row[k] for k in per_kind) + 2e-4     # 0.2 ms outside the blocks
            pts.append(row)
    return {"format": GRID_FORMAT, "model": dataclasses.asdict(cfg), "device": "cpu",
            "environment": {"date": "2026-01-01T00:00:00Z", "device_name": "test cpu",
                            "torch": "x", "threads": 1, "host": {"machine": "x86_64"}},
            "grid": {"new": [1, 8, 64, 100, 256], "cached": [0, 128, 512]},
            "repeats": 1, "warmup": 0, "points": pts,
            "kernels": [{"kernel": "state_save", "tokens": 0, "cached": 0, "median_s": save,
                         "bytes": 1000}]}


KNOWN = {"mamba": [1e-3, 2e-6, 0.0, 5e-4], "attention": [4e-4, 1e-6, 3e-9, 0.0],
         "mlp": [1e-4, 3e-6, 0.0, 0.0], "other": [5e-5, 1e-7, 0.0, 0.0]}


def test_the_per_kind_fit_recovers_each_layer_kind():
    import numpy as np

    from sim.commands.calibrate import TERMS, fit_profile

    prof = fit_profile(_grid({k: np.array(v) for k, v in KNOWN.items()}), method="per-kind")
    pk = prof["per_kind"]
    for kind, coef in KNOWN.items():
        for name, v in pk[kind]["coefficients"].items():
            assert v == pytest.approx(coef[TERMS.index(name)], rel=1e-6, abs=1e-15), (kind, name)
    assert pk["mamba"]["per_layer"]["per_item_s"] == pytest.approx(1e-3 / 2)   # two M blocks
    assert pk["rest"]["coefficients"]["per_item_s"] == pytest.approx(2e-4, rel=1e-6)
    assert pk["composed"]["fit_max_rel_err"] < 1e-9
    want_item = sum(v[0] for v in KNOWN.values()) + 2e-4 + 1e-5      # + one state save
    assert prof["coefficients"]["per_item_s"] == pytest.approx(want_item, rel=1e-6)
    assert prof["fit"]["fitted"] == "per-kind"
    total = fit_profile(_grid({k: np.array(v) for k, v in KNOWN.items()}))
    assert total["coefficients"]["per_pair_s"] == pytest.approx(3e-9, rel=1e-6)
    assert total["fit"]["fit_max_rel_err"] < 1e-9


def test_calibrate_fits_a_saved_grid(tmp_path):
    import numpy as np

    (tmp_path / "g.json").write_text(json.dumps(_grid({k: np.array(v)
                                                       for k, v in KNOWN.items()})))
    res = runner.invoke(app, ["calibrate", "--from-grid", str(tmp_path / "g.json"),
                              "--out", str(tmp_path / "p.yaml"), "--fit", "per-kind"])
    assert res.exit_code == 0, res.output
    assert "fit median error 0.0%" in res.output
    prof = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert prof["provenance"]["device_name"] == "test cpu"
    (tmp_path / "bad.json").write_text("{}")
    res = runner.invoke(app, ["calibrate", "--from-grid", str(tmp_path / "bad.json"),
                              "--out", str(tmp_path / "q.yaml")])
    assert res.exit_code != 0 and "not a calibration grid" in res.output
    res = runner.invoke(app, ["calibrate", "--from-grid", str(tmp_path / "g.json"),
                              "--model", "nemotron-h-8b", "--out", str(tmp_path / "q.yaml")])
    assert res.exit_code != 0 and "takes its model from the grid" in res.output


def test_held_out_cases_lie_off_the_grid():
    from sim.commands.calibrate import QUICK_GRID, held_out_cases

    cases = held_out_cases(QUICK_GRID, 20, seed=3)
    on = {(t, c) for t in QUICK_GRID["new"] for c in QUICK_GRID["cached"]}
    assert len(cases) == 20 and len(set(cases)) == 20 and not set(cases) & on
    assert all(1 <= t <= 2 * 512 and 0 <= c <= 1024 and c % 16 == 0 for t, c in cases)
    assert held_out_cases(QUICK_GRID, 20, seed=3) == cases


def test_device_tags_and_report_lines():
    from backends.torch_backend.envinfo import describe, device_tag

    assert device_tag({"device": "cuda", "device_name": "NVIDIA H200"}) == "h200"
    assert device_tag({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"}) == "h100"
    assert device_tag({"device": "cpu", "device_name": "AMD EPYC"}) == "cpu"
    line = describe({"device": "cuda", "device_name": "NVIDIA H200", "cuda": "13.0",
                     "driver": "580.1", "clocks_mhz": {"sm": 1980.0}, "torch": "2.11.0"})
    assert line == "NVIDIA H200 (cuda 13.0, driver 580.1, SM 1980 MHz), torch 2.11.0"


# ---- the CUDA-only paths, on a CPU: torch.cuda's events and queries stood in for ----------

class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time

        self.t = time.perf_counter()

    def elapsed_time(self, end):            # milliseconds, as torch.cuda.Event's
        return (end.t - self.t) * 1e3


@pytest.fixture
def fake_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)


def test_cuda_timing_reads_events_in_seconds(fake_cuda):
    import time

    from backends.torch_backend.timing import _CudaTimer, bench

    calls = []
    samples = bench(lambda: (calls.append(1), time.sleep(0.002)), "cuda", repeats=3, warmup=2)
    assert len(calls) == 5 and len(samples) == 3
    assert all(0.0015 < s < 0.5 for s in samples)
    timer = _CudaTimer()
    with timer("mamba"):
        time.sleep(0.002)
    with timer("mamba"):
        time.sleep(0.001)
    r = timer.result()
    assert 0.0025 < r["mamba"] < 0.5 and r["attention"] == 0.0


def test_cuda_names_the_models_gpu():
    import torch

    from backends.torch_backend.timing import same_device

    assert same_device("cuda", torch.device("cuda:0")) and same_device("cuda:1", "cuda")
    assert not same_device("cuda:0", "cuda:1") and not same_device("cpu", "cuda:0")
    assert same_device("cpu", "cpu")


SMI = "NVIDIA H200, 580.159.04, 1980, 3201, 1980, 3201, 34, 120.50, 143771\n"


def test_the_cuda_environment_report(monkeypatch):
    import torch

    from backends.torch_backend import envinfo

    class Props:
        major, minor, multi_processor_count, total_memory = 9, 0, 132, 150_000_000_000

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: Props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(envinfo, "_run", lambda args, timeout=20.0:
                        SMI if any(a.startswith("--query-gpu") for a in args) else "table\n")
    env = envinfo.environment("cuda")
    assert env["device_name"] == "NVIDIA H200" and env["capability"] == "9.0"
    assert env["driver"] == "580.159.04" and env["clocks_mhz"]["sm"] == 1980.0
    assert env["clocks_mhz"]["memory_max"] == 3201.0 and set(env["tf32"]) == {"matmul", "cudnn"}
    assert envinfo.device_tag(env) == "h200"
    assert envinfo.describe(env).startswith("NVIDIA H200 (cuda 13.0, driver 580.159.04, SM 1980")
    # a driver refusing a field: the short query still names the GPU and driver
    monkeypatch.setattr(envinfo, "_run", lambda args, timeout=20.0:
                        None if "clocks" in " ".join(args) else "NVIDIA H200, 580.1\n")
    q = envinfo.nvidia_smi_query()
    assert q["name"] == "NVIDIA H200" and q["driver"] == "580.1" and q["clocks_mhz"]["sm"] is None
    # a GPU grid's profile says where it was measured
    from sim.commands.calibrate import fit_profile

    g = _grid({k: __import__("numpy").array(v) for k, v in KNOWN.items()})
    g["device"], g["environment"] = "cuda", env
    prof = fit_profile(g)
    assert prof["device"] == "cuda (NVIDIA H200)"
    p = prof["provenance"]
    assert p["timer"] == "cuda_events" and p["clocks_mhz"]["sm"] == 1980.0 and p["cuda"] == "13.0"


def test_the_check_refuses_a_used_output_folder(tmp_path, capsys):
    (tmp_path / "old.txt").write_text("x")
    assert gpu_check.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 2
    assert "not an empty folder" in capsys.readouterr().err


def test_a_broken_phase_is_recorded_and_the_next_one_runs(tmp_path):
    phase = gpu_check.Phases(tmp_path, None)
    with phase("boom"):
        raise RuntimeError("planted")
    ran = []
    with phase("next"):
        ran.append(1)
    assert ran == [1] and phase.errors == {"boom": "RuntimeError: planted"}
    assert "RuntimeError: planted" in (tmp_path / "errors.log").read_text()
    assert set(phase.s) == {"boom", "next"}


def test_past_the_deadline_no_phase_starts_and_the_summary_says_so(tmp_path):
    out = tmp_path / "gc"
    rc = gpu_check.main(["--device", "cpu", "--quick", "--out", str(out), "--deadline-s", "-1"])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 1 and not s["ok"]
    assert s["skipped"] == ["verify", "calibrate tiny-hybrid"] and s["models"] == {}
    assert "skipped: past --deadline-s" in (out / "summary.md").read_text()
