"""Command-line behaviour a user sees: outputs, and one-line errors with exit code 2."""
from __future__ import annotations

import io
import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from sim.entrypoints.common import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _athena(tmp_path: Path, **edits) -> Path:
    data = yaml.safe_load((ROOT / "scenarios" / "athena.yaml").read_text())
    data["workload"]["num_requests"] = 60
    for dotted, value in edits.items():
        cur = data
        *head, last = dotted.split(".")
        for h in head:
            cur = cur[h]
        cur[last] = value
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_run_writes_the_run_folder(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(_athena(tmp_path)), "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    for f in ("requests.csv", "summary.json", "report.md", "ttft_cdf.png", "hit_hist.png"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    assert s["requests"] == 60 and 0 < s["token_hit_rate"] < 1
    header = (out / "requests.csv").read_text().splitlines()[0].split(",")
    assert {"request_id", "hit_tokens", "attention_hit_tokens", "lost_tokens", "ttft_s"} <= set(header)


def _one_line_error(res, *needles):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    for n in needles:
        assert n in lines[0], lines[0]


def test_scenario_typo_is_one_line_exit_2_no_output(tmp_path):
    p = _athena(tmp_path)
    data = yaml.safe_load(p.read_text())
    data["cache"]["prefix_match_unt"] = 64
    p.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(p), "--out", str(out)])
    _one_line_error(res, str(p), "cache.prefix_match_unt", "unknown key")
    assert not out.exists()


def test_negative_size_is_one_line(tmp_path):
    res = runner.invoke(app, ["run", str(_athena(tmp_path, **{"scheduler.max_num_seqs": -4}))])
    _one_line_error(res, "scheduler.max_num_seqs")


def test_bad_hash_block_size_names_the_field(tmp_path):
    res = runner.invoke(app, ["run", str(_athena(tmp_path, **{"cache.hash_block_size": 100}))])
    _one_line_error(res, "cache.hash_block_size", "divide")


def test_old_hash_unit_name_is_accepted_and_errors_use_the_one_name(tmp_path):
    # prefix_match_unit is an old name (sim/cache/config.py ALIASES) of hash_block_size
    res = runner.invoke(app, ["run", str(_athena(tmp_path)), "--set",
                              "cache.prefix_match_unit=100"])
    _one_line_error(res, "cache.hash_block_size", "divide")
    p = _athena(tmp_path)
    data = yaml.safe_load(p.read_text())
    data["cache"]["prefix_match_unit"] = data["cache"].pop("hash_block_size")
    p.write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["run", str(p), "--out", str(tmp_path / "o"), "-q", "--no-report"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "run.json").read_text())["scenario"]["cache"][
        "hash_block_size"] == 64
    data["cache"]["prefix_match_unit"] = 100
    p.write_text(yaml.safe_dump(data))
    _one_line_error(runner.invoke(app, ["run", str(p)]), "cache.hash_block_size", "divide")
    data["cache"]["hash_block_size"] = 64
    p.write_text(yaml.safe_dump(data))
    _one_line_error(runner.invoke(app, ["run", str(p)]), "cache.", "set twice")


def test_broken_trace_line_names_file_and_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"id": "a", "arrival_s": 0, "prompt": "S:10", "output_tokens": 2}\n{"id": "b",\n')
    p = _athena(tmp_path)
    data = yaml.safe_load(p.read_text())
    data["workload"] = {"kind": "jsonl", "path": str(trace)}
    p.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(p), "--out", str(out)])
    _one_line_error(res, "t.jsonl:2")
    assert not out.exists()


def test_case_bad_key_is_one_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("config:\n  blok_size: 16\nrequests: [{id: a, prompt: 'S:4'}]\n")
    res = runner.invoke(app, ["case", str(p)])
    _one_line_error(res, str(p), "config.blok_size")


def test_case_many_files_keyed_by_path():
    files = [str(ROOT / "cases" / "seed-d3-eagle.yaml"), str(ROOT / "cases" / "junction-flag.yaml")]
    res = runner.invoke(app, ["case", *files])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert list(out) == files
    assert [r["hit"] for r in out[files[1]]] == [0, 0, 12]


def test_model_prints_the_4416_derivation():
    res = runner.invoke(app, ["model", "nemotron-3-super-120b", "--num-speculative-tokens", "5",
                              "--mamba-cache-dtype", "float32", "--mamba-ssm-cache-dtype", "float32"])
    assert res.exit_code == 0, res.output
    assert "block_size 4416 tokens" in res.output


def test_report_regenerates_from_the_folder_alone(tmp_path):
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(_athena(tmp_path)), "--out", str(out), "-q"]).exit_code == 0
    before = {f: (out / f).read_bytes() for f in ("report.md", "ttft_cdf.png", "hit_hist.png")}
    for f in before:
        (out / f).unlink()
    res = runner.invoke(app, ["report", str(out)])
    assert res.exit_code == 0, res.output
    assert {f: (out / f).read_bytes() for f in before} == before


def test_report_on_a_non_run_folder_is_one_line(tmp_path):
    res = runner.invoke(app, ["report", str(tmp_path)])
    _one_line_error(res, "neither a sweep folder")


def test_validate_against_vllm_agrees_or_skips():
    res = runner.invoke(app, ["validate", "--against-vllm", str(ROOT / "cases" / "seed-d3-eagle.yaml")])
    assert res.exit_code == 0, res.output
    assert "agree with vLLM" in res.output or res.output.startswith("skipped:")


def test_the_progress_bar_asks_for_its_total_only_when_it_is_shown(monkeypatch):
    """A trace's total is a pass over its file: asked for once when a bar can be shown
    (stderr a terminal, not --quiet), never otherwise; the bar counts to it."""
    import io
    import sys

    from sim.entrypoints import cli

    asked = []

    def total():
        asked.append(1)
        return 40

    class Tty(io.StringIO):
        def isatty(self):
            return True

    for enabled, tty in ((False, True), (True, False)):
        monkeypatch.setattr(sys, "stderr", Tty() if tty else io.StringIO())
        update, stop = cli.progress(enabled, "requests", total, delay_s=0.0)
        update(5)
        stop()
        assert not asked
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    update, stop = cli.progress(True, "requests", total, delay_s=0.0)
    update(5)
    stop()
    assert asked == [1]


def test_sweep_of_a_scenario_or_case_says_it_wants_a_sweep_file(tmp_path):
    for path, what in ((ROOT / "scenarios" / "athena.yaml", "a scenario"),
                       (ROOT / "cases" / "seed-d3-eagle.yaml", "a case file")):
        out = tmp_path / "out"
        res = runner.invoke(app, ["sweep", str(path), "--out", str(out)])
        _one_line_error(res, str(path), f"{what}, not a sweep file", "wants a sweep file")
        assert "unknown key" not in res.output
        assert not out.exists()
    # a sweep file with a typo is still a sweep file's error
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: ../scenarios/athena.yaml\ngird: {}\n")
    _one_line_error(runner.invoke(app, ["sweep", str(bad)]), "gird: unknown key")


class _Tty(io.StringIO):
    """A terminal's stderr: records what is written."""

    def isatty(self):
        return True


def test_the_bar_shows_on_a_run_expected_to_take_over_a_second(monkeypatch):
    """The rate over the first PROBE_S decides: 1,000 requests at 100 per 0.25 s (2.5 s
    in all) get a bar at once, at 500 per 0.25 s (0.5 s in all) none; a bar without a
    total shows once a second has gone by."""
    import sys
    import time

    from sim.entrypoints import common

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    for per_probe, total, at, shown in ((100, 1000, 0.25, True), (500, 1000, 0.25, False),
                                        (500, None, 0.5, False), (500, None, 1.01, True)):
        monkeypatch.setattr(sys, "stderr", _Tty())
        clock[0] = 100.0
        update, stop = common.progress(True, "requests", total)
        clock[0] += at
        update(per_probe)
        assert bool(common.BARS) == shown, (per_probe, total, at)
        stop()
        assert not common.BARS


def test_an_interrupt_prints_its_message_on_its_own_line(monkeypatch, tmp_path):
    """Ctrl-C while the bar is drawn: the bar is erased first, so the message starts a
    line of its own (not after the bar's ETA)."""
    import signal
    import sys

    import pytest

    import sim.commands.run
    from sim.entrypoints import cli, common

    def simulate(sc, progress=None, replayed=None, **kw):
        progress(1)
        raise cli.Interrupted(signal.SIGINT)      # (what main's SIGINT handler raises)

    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sim.commands.run, "simulate", simulate)
    monkeypatch.setattr(common, "SHOW_IF_EXPECTED_S", 0.0)
    monkeypatch.setattr(common, "PROBE_S", 0.0)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.main(["run", str(_athena(tmp_path)), "--out", str(tmp_path / "o"),
                      "--no-report"])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    assert exit_.value.code == 130
    text = err.getvalue()
    assert "ETA" in text                                   # the bar was drawn
    before, msg = text.rsplit("interrupted; nothing written", 1)
    assert msg == "\n"
    assert before.endswith("\x1b[2K"), repr(before[-80:])  # its line erased, message at its start
    assert not common.BARS
    assert not (tmp_path / "o").exists()
