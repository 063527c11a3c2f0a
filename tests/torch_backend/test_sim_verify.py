"""`sim verify` on the scaled-down athena: the torch backend runs every chunk on the cache
model's blocks; resumed prefills equal scratch, and a planted off-by-one state is caught."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

from typer.testing import CliRunner  # noqa: E402

from sim.entrypoints.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
runner = CliRunner()


def test_athena_tiny_verifies(tmp_path):
    res = runner.invoke(app, ["verify", TINY, "--set", "workload.num_requests=14",
                              "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert "resumed from cached KV blocks and Mamba states" in res.output
    lines = [ln.split(",") for ln in (tmp_path / "v" / "verify.csv").read_text().splitlines()[1:]]
    prefills = [ln for ln in lines if ln[4] == "prefill"]
    resumed = [ln for ln in prefills if int(ln[2]) > 0]
    assert len(prefills) == 14 and len(resumed) >= 8
    assert len([ln for ln in lines if ln[4] == "decode"]) == 14   # every request decodes
    assert max(float(ln[3]) for ln in lines) < 1e-4


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_planted_wrong_state_fails_the_check(dtype):
    res = runner.invoke(app, ["verify", TINY, "--set", "workload.num_requests=8",
                              "--set", f"backend.dtype={dtype}", "--plant", "state_off_by_one"])
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "differ from scratch" in res.output


def test_bf16_verifies_against_the_fp32_reference():
    """bf16 rounding stays far inside the bf16 bound; the planted state (above) far outside."""
    res = runner.invoke(app, ["verify", TINY, "--set", "workload.num_requests=8",
                              "--set", "backend.dtype=bfloat16"])
    assert res.exit_code == 0, res.output
    assert "against a float32 reference" in res.output and "OK" in res.output


def test_broken_speculative_rollback_is_caught():
    """Keeping the Mamba state of the last scheduled draft instead of the last accepted
    token (no roll-back) fails the decode check; the honest run (above) passes it."""
    from sim.commands.run import simulate
    try:
        from sim.config.scenario import load_scenario
    except ImportError:
        from sim.scenario import load_scenario
    sc = load_scenario(TINY, {"backend.kind": "torch", "backend.verify": True,
                              "workload.num_requests": 6})
    dep, _, _ = simulate(sc, plant="spec_last_state")
    dec = [v for v in dep.verify if v.kind == "decode"]
    assert dec and max(v.max_abs_err for v in dec) > 100 * 1e-4
    assert max(v.max_abs_err for v in dep.verify if v.kind == "prefill") < 1e-4


def test_resumes_from_internal_prefill_checkpoints(tmp_path):
    """MambaMixer2 exports the prompt's state from inside the final prefill chunk (vLLM's
    internal prefill checkpoints): the next turn resumes there, off the block grid, and
    equals scratch only when the backend exports that state into the block the cache model
    keyed (without the export this run fails with errors of ~3.9)."""
    import yaml

    data = yaml.safe_load(Path(TINY).read_text())
    data["name"] = "tiny-turns"
    data["workload"] = {
        "kind": "multi_turn", "num_sessions": 6, "session_rate_per_s": 2.0,
        "turns": {"dist": "uniform", "low": 2, "high": 3}, "system_prompt_tokens": 301,
        "user_tokens": {"dist": "uniform", "low": 20, "high": 80},
        "output_tokens": {"dist": "uniform", "low": 3, "high": 8},
        "think_time_s": {"dist": "uniform", "low": 0.5, "high": 1.0}}
    path = tmp_path / "tiny-turns.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = runner.invoke(app, ["verify", str(path), "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    lines = [ln.split(",") for ln in (tmp_path / "v" / "verify.csv").read_text().splitlines()[1:]]
    later_turns = [int(ln[2]) for ln in lines if ln[4] == "prefill" and "-t00" not in ln[0]]
    block = 48                                   # athena-tiny's attention/Mamba block
    assert any(r % block for r in later_turns), later_turns   # resumed inside a block
