"""``sim run`` draws its report in worker processes (reports/workers.py): the same bytes
as a report drawn in the main process, and a worker that fails, dies or hangs costs
time, never the report, an exit code or a stray process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import reports.workers as W
from sim.config.scenario import load_scenario
from sim.commands.run import simulate, write_run

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="workers fork (Linux)")


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """A small run (attribution and memory on: all four figures) and its in-process
    report, the reference."""
    d = tmp_path_factory.mktemp("wk")
    data = yaml.safe_load((ROOT / "scenarios" / "athena.yaml").read_text())
    data["workload"]["num_requests"] = 80
    p = d / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    sc = load_scenario(p)
    dep, rows, summary = simulate(sc)
    ref = write_run(d / "ref", sc, dep, rows, summary)
    return sc, dep, rows, summary, ref


def _same(a: Path, b: Path) -> None:
    names = sorted(n for n in os.listdir(a) if n != "run.json")
    assert names == sorted(n for n in os.listdir(b) if n != "run.json")
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n


def _children() -> set[int]:
    import multiprocessing

    return {p.pid for p in multiprocessing.active_children()}


@pytest.mark.parametrize("cpus", sorted(W.PLANS))
def test_workers_write_the_same_bytes(ran, tmp_path, cpus):
    """Every plan (two parts on a 2-CPU machine, four with more) draws every figure and
    report.md once, and the same bytes."""
    import multiprocessing

    sc, dep, rows, summary, ref = ran
    assert {"ttft_cdf.png", "hit_hist.png", "miss_waterfall.png", "memory.png"} <= set(
        os.listdir(ref))
    parts = W.PLANS[cpus]
    drawn = [s for part in parts for s in part]
    from reports.run_report import FIGURES

    assert sorted(drawn) == sorted((W.REPORT_MD, *FIGURES))
    before = _children()
    workers = W.ReportWorkers(multiprocessing.get_context("fork"), parts)
    out = write_run(tmp_path / "w", sc, dep, rows, summary, workers=workers)
    _same(ref, out)
    assert _children() == before        # stopped and reaped


def _in_child(action):
    """A draw_part that does ``action`` in a worker and draws normally here."""
    parent, real = os.getpid(), W.draw_part

    def draw_part(*args):
        if os.getpid() != parent:
            action()
        real(*args)
    return draw_part


def test_a_dead_worker_costs_time_not_the_report(ran, tmp_path, monkeypatch, capfd):
    sc, dep, rows, summary, ref = ran
    monkeypatch.setattr(W, "draw_part", _in_child(lambda: os._exit(3)))
    out = write_run(tmp_path / "w", sc, dep, rows, summary, workers=W.ReportWorkers.start())
    _same(ref, out)
    assert "report worker exited without answering" in capfd.readouterr().err


def test_a_hung_worker_is_stopped_after_the_timeout(ran, tmp_path, monkeypatch):
    import time

    sc, dep, rows, summary, ref = ran
    monkeypatch.setattr(W, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(W, "draw_part", _in_child(lambda: time.sleep(3600)))
    before = _children()
    t0 = time.monotonic()
    out = write_run(tmp_path / "w", sc, dep, rows, summary, workers=W.ReportWorkers.start())
    assert time.monotonic() - t0 < 60
    _same(ref, out)
    assert _children() == before


def test_a_failing_report_fails_as_in_process(ran, tmp_path, monkeypatch):
    """An exception while drawing: the main process draws the part again and raises
    what an in-process report raises; no partial run folder."""
    sc, dep, rows, summary, ref = ran
    from reports import run_report

    def broken(*a, **k):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(run_report, "hit_histogram", broken)
    for workers in (None, W.ReportWorkers.start()):
        out = tmp_path / f"w{workers is None}"
        with pytest.raises(RuntimeError, match="drawing failed"):
            write_run(out, sc, dep, rows, summary, workers=workers)
        assert not out.exists()
        assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def _no_redraw_here(monkeypatch) -> None:
    """In this process (the workers, forked already, keep theirs): drawing the report
    here fails the test, so that a worker's failure cannot hide behind the main
    process's fallback, which writes the same bytes."""
    import reports.run_report as rr

    def redraw(*a, **k):
        raise AssertionError("the report was drawn in the main process")

    monkeypatch.setattr(rr, "write_report", redraw)


@pytest.mark.parametrize("cpus", sorted(W.PLANS))
def test_a_memory_figure_drawn_ahead_is_the_same_bytes(ran, tmp_path, cpus, monkeypatch):
    """The memory figure's inputs handed over as the replay ends (``prelude``, what
    ``sim run`` does) give the same report, every plan; a second prelude after the
    folder is handed over is ignored."""
    import multiprocessing

    from sim.commands.run import memory_prelude

    sc, dep, rows, summary, ref = ran
    got = memory_prelude(sc, dep)
    assert got is not None and got[3] == sc.name
    workers = W.ReportWorkers(multiprocessing.get_context("fork"), W.PLANS[cpus])
    _no_redraw_here(monkeypatch)          # (the workers drew it all: no fallback)
    workers.prelude(got)
    out = write_run(tmp_path / "w", sc, dep, rows, summary, workers=workers)
    _same(ref, out)
    workers.prelude(got)                  # (after submit: nothing sent, no error)


def test_a_memory_figure_that_fails_ahead_is_drawn_with_its_part(ran, tmp_path,
                                                                   monkeypatch):
    """Drawing ahead fails (here: made to) -> the part draws the figure itself from the
    fields sent ahead: the same report."""
    import multiprocessing

    import reports.memory_figure as mf
    from sim.commands.run import memory_prelude

    def fail(*a, **k):
        raise RuntimeError("made to fail")

    monkeypatch.setattr(mf, "memory_png", fail)
    sc, dep, rows, summary, ref = ran
    workers = W.ReportWorkers(multiprocessing.get_context("fork"), W.PLANS[2])
    _no_redraw_here(monkeypatch)
    workers.prelude(memory_prelude(sc, dep))
    _same(ref, write_run(tmp_path / "w", sc, dep, rows, summary, workers=workers))


def test_a_memory_figure_drawn_ahead_is_written_only_for_its_own_inputs(ran, tmp_path):
    """``draw_memory`` writes the figure drawn ahead when the folder's inputs are exactly
    those it was drawn from, and draws its own otherwise; ``memory_png`` is the bytes
    ``draw_memory`` writes."""
    import json
    import shutil

    from reports.memory_figure import draw_memory, memory_png, title_of
    from sim.commands.run import memory_prelude

    sc, dep, rows, summary, ref = ran
    fields, pool, block, name = memory_prelude(sc, dep)
    s = json.loads((ref / "summary.json").read_text())
    assert (pool, block) == (float(s["pool_bytes"]), s["pool_bytes"] / s["num_gpu_blocks"])
    assert memory_png(fields, pool, block, title_of(name)) == (ref / "memory.png").read_bytes()
    folder = tmp_path / "f"
    shutil.copytree(ref, folder)
    (folder / "memory.png").unlink()
    draw_memory(folder, s, fields, drawn=(fields, pool, block, title_of(name), b"ahead"))
    assert (folder / "memory.png").read_bytes() == b"ahead"      # (used: same inputs)
    for other in ((fields, pool * 2, block, title_of(name)),
                  (fields, pool, block, title_of("another")),
                  (fields[:1] + [(fields[1][0], ())] + fields[2:], pool, block, title_of(name))):
        draw_memory(folder, s, fields, drawn=(*other, b"ahead"))
        assert (folder / "memory.png").read_bytes() == (ref / "memory.png").read_bytes()


def test_no_report_imports_no_matplotlib(tmp_path):
    """``--no-report``: no worker, and matplotlib never imported."""
    data = yaml.safe_load((ROOT / "scenarios" / "athena.yaml").read_text())
    data["workload"]["num_requests"] = 20
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    code = ("import sys; from sim.entrypoints.cli import main\n"
            "try:\n    main(['run', 's.yaml', '--out', 'o', '-q', '--no-report'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
    assert (tmp_path / "o" / "requests.csv").is_file()
    assert not (tmp_path / "o" / "report.md").exists()


def test_report_columns_read_as_written(ran):
    """The report's columns taken from memory are the values a full read of the
    requests.csv written from them gives."""
    from reports import rows
    from reports.run_report import read_rows

    sc, dep, _, summary, ref = ran
    full = [rows.ReportRow._make(getattr(r, c) for c in rows.REPORT_COLUMNS)
            for r in read_rows(ref)]
    assert rows.rows_of(rows.as_written(dep.records)) == full
    assert rows.rows_of(rows.as_written(list(dep.records))) == full
    assert len(full) == summary["requests"]


def test_report_files_handed_over_as_written(ran, tmp_path):
    """What the workers get of summary.json, run.json and memory.csv (to draw while the
    files are written) is what the files read back: the same JSON text, and memory.csv's
    columns as ``read_memory`` reads them."""
    from reports.memory_figure import as_read, read_memory

    sc, dep, rows, summary, _ = ran
    got = {}

    class Catch:            # (the workers' side of ``write_run``: what was handed over)
        def submit(self, folder, columns, files=None):
            got.update(columns=columns(), files=files)

        def finish(self):
            pass

        def close(self):
            pass

    out = write_run(tmp_path / "w", sc, dep, rows, summary, workers=Catch())
    summary_text, run_text, fields = got["files"]
    assert summary_text == (out / "summary.json").read_text()
    assert run_text == (out / "run.json").read_text()
    assert as_read(fields) == read_memory(out / "memory.csv")
    assert len(read_memory(out / "memory.csv")["time_s"]) > 10
