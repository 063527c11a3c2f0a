"""The run report's figures on hand-built run folders: what each axis, title and legend
says is read back from the matplotlib figure before it is saved."""
from __future__ import annotations

import pytest
from matplotlib.patches import StepPatch

from reports import run_report, style
from tests.reports.builders import Req, write_run

TTFTS = [0.1 * (i + 1) for i in range(10)]          # 0.1 .. 1.0 s
# the figures of a run of one replica (a fleet adds replicas.png)
SINGLE = tuple(s for s in run_report.FIGURES if s != "replicas")
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@pytest.fixture
def figures(monkeypatch):
    """The figures ``style.save`` receives, by file stem: their axes' texts."""
    seen = {}
    real = style.save

    def spy(fig, folder, stem, caption="", **kw):
        seen[stem] = {
            "titles": [ax.get_title(loc="left") + ax.get_title() for ax in fig.axes],
            "xlabels": [ax.get_xlabel() for ax in fig.axes],
            "ylabels": [ax.get_ylabel() for ax in fig.axes],
            "legend": [t.get_text() for ax in fig.axes if ax.get_legend()
                       for t in ax.get_legend().get_texts()],
            "xticks": [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes],
            # bars drawn: a rectangle each, or the bins of one stepped outline
            "bars": [sum(len(p.get_data().values) if isinstance(p, StepPatch) else 1
                         for p in ax.patches) for ax in fig.axes],
            "caption": caption,
        }
        return real(fig, folder, stem, caption, **kw)

    monkeypatch.setattr(style, "save", spy)
    return seen


def _mostly_misses():
    reqs = [Req(ttft=t) for t in TTFTS]
    reqs[3] = Req(hit=128, ttft=TTFTS[3])
    reqs[7] = Req(hit=256, lost=64, ttft=TTFTS[7])
    return reqs


def test_ttft_percentiles_are_numpy_linear(tmp_path, figures):
    run_report.write_report(write_run(tmp_path / "r", _mostly_misses()))
    # linear interpolation (sim.rundir.stats), not the nearest rank the report once drew (0.600 s)
    assert figures["ttft_cdf"]["legend"] == ["p50 = 0.550 s", "p90 = 0.910 s", "p99 = 0.991 s"]
    assert figures["ttft_cdf"]["xlabels"] == ["time to first token (s)"]


def test_hit_histogram_leaves_misses_out_and_says_so(tmp_path, figures):
    run_report.write_report(write_run(tmp_path / "r", _mostly_misses()))
    hist = figures["hit_hist"]
    top, bottom = hist["titles"]
    assert "2 of 10 requests (20.0%) reuse a prefix; 8 miss (not drawn)" in top
    assert "1 of 10 requests (10.0%), 64 tokens" in bottom
    # few distinct values: one bar each, labelled with the exact token count
    assert hist["bars"] == [2, 1]
    assert hist["xticks"] == [["128", "256"], ["64"]]
    assert all("(tokens" in x for x in hist["xlabels"])
    assert hist["ylabels"] == ["requests", "requests"]


def test_many_hit_values_are_binned_in_round_hash_units(tmp_path, figures):
    reqs = [Req(hit=64 * (i + 1), ttft=0.1) for i in range(100)]     # 64 .. 6,400 tokens
    run_report.write_report(write_run(tmp_path / "r", reqs))
    xl = figures["hit_hist"]["xlabels"][0]
    # 6,400 / 64 / 40 bins = 2.5 units -> the next of 1, 2, 5 x 10^k: 5 units = 320 tokens
    assert xl == "reused prefix per request (tokens; bins of 320)"
    assert figures["hit_hist"]["bars"][0] == 21
    # short tick labels on a wide token axis (no "100000120000")
    assert all(len(t) <= 5 for t in figures["hit_hist"]["xticks"][0])


def test_every_figure_has_a_caption_used_as_alt_text(tmp_path, figures):
    folder = write_run(tmp_path / "r", _mostly_misses())
    run_report.write_report(folder)
    md = (folder / "report.md").read_text()
    for stem in ("ttft_cdf", "hit_hist"):
        cap = figures[stem]["caption"]
        assert cap.endswith("?") and cap == run_report.CAPTIONS[stem]
        assert f"![{cap}]({stem}.png)" in md


def test_report_is_deterministic(tmp_path):
    a = write_run(tmp_path / "a", _mostly_misses())
    b = write_run(tmp_path / "b", _mostly_misses())
    run_report.write_report(a)
    run_report.write_report(b)
    for name in ("report.md", "ttft_cdf.png", "hit_hist.png"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_no_request_with_a_hit(tmp_path, figures):
    run_report.write_report(write_run(tmp_path / "r", [Req(ttft=t) for t in TTFTS]))
    assert "0 of 10 requests (0.0%) reuse a prefix; 10 miss" in figures["hit_hist"]["titles"][0]
    assert figures["hit_hist"]["bars"] == [0, 0]


@pytest.fixture(scope="module")
def athena_run(tmp_path_factory):
    """A small real run folder (60 Athena requests: all four run figures), with its
    report drawn in this process."""
    from pathlib import Path

    import yaml

    from sim.config.scenario import load_scenario
    from sim.commands.run import simulate, write_run as write_sim_run

    d = tmp_path_factory.mktemp("athena_run")
    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "scenarios" / "athena.yaml").read_text())
    data["workload"]["num_requests"] = 60
    (d / "s.yaml").write_text(yaml.safe_dump(data))
    sc = load_scenario(d / "s.yaml")
    dep, rows, summary = simulate(sc)
    return write_sim_run(d / "run", sc, dep, rows, summary)


def test_run_figures_cut_to_their_pixels_match_the_tight_box(tmp_path, monkeypatch,
                                                             athena_run):
    """Every run figure is drawn once and cut to its pixels (``style.Trim``): the
    canvas's margins hold all of it (else ``save`` falls back on matplotlib's tight
    box), and the cut is the tight box's image to a few pixels a side."""
    import shutil

    from PIL import Image

    cut = tmp_path / "cut"
    shutil.copytree(athena_run, cut)
    stems = SINGLE
    clipped = []
    real_cut = style.Trim.cut

    def watch(self, canvas, rgba):
        got = real_cut(self, canvas, rgba)
        clipped.append(self.clipped)
        return got

    monkeypatch.setattr(style.Trim, "cut", watch)
    tight = tmp_path / "tight"
    shutil.copytree(cut, tight)
    run_report.write_report(cut)
    assert clipped == [False] * len(stems)          # no figure reached a margin
    monkeypatch.setattr(style.Trim, "cut", lambda self, canvas, rgba: setattr(
        self, "clipped", True))                     # every figure: the tight box
    run_report.write_report(tight)
    for stem in stems:
        a, b = Image.open(cut / f"{stem}.png"), Image.open(tight / f"{stem}.png")
        assert (a.mode, b.mode) == ("RGB", "RGB")
        assert abs(a.width - b.width) <= 8 and abs(a.height - b.height) <= 8, \
            (stem, a.size, b.size)


def test_memory_csv_read_back_as_any_csv_reader_reads_it(tmp_path):
    """``read_memory``'s split of the file as ``sim run`` writes it gives what
    ``csv.reader`` gives, on that file and on the CSV it cannot split (quotes, CRLF,
    a blank line at the end), where it reads by ``csv.reader``; a field that is no
    number is the same ValueError."""
    from reports.memory_figure import _read_memory_csv, read_memory

    head = "time_s,kv_blocks,mamba_blocks,in_use_blocks,cached_blocks,running,waiting\n"
    rows = "".join(f"{i * 0.001234567:.6f},{i},{2 * i},{i // 2},{i - i // 2},{i % 7},0\n"
                   for i in range(500))
    variants = {
        "written": head + rows,
        "empty": head,
        "crlf": (head + rows).replace("\n", "\r\n"),
        "quoted": head + '"0.500000",1,2,3,4,5,6\n',
        "blank line": head + rows + "\n",
    }
    for name, text in variants.items():
        p = tmp_path / f"{name}.csv"
        p.write_bytes(text.encode())
        got = read_memory(p)
        assert got == _read_memory_csv(p), name
    assert list(read_memory(tmp_path / "crlf.csv")) == head.strip().split(",")
    assert read_memory(tmp_path / "written.csv")["time_s"][3] == float("0.003704")
    bad = tmp_path / "bad.csv"
    bad.write_text(head + "0.1,1,2,x,4,5,6\n")
    with pytest.raises(ValueError):
        read_memory(bad)


def test_figures_built_ahead_draw_the_same_bytes(tmp_path, athena_run):
    """``frames`` (what a report worker builds while the simulation runs: figure, axes,
    ticks) gives every run figure the same bytes as drawing from scratch, and each
    frame is used once."""
    import shutil

    from reports import workers

    scratch = athena_run
    ahead = tmp_path / "ahead"
    shutil.copytree(scratch, ahead)
    built = run_report.frames(SINGLE)
    assert sorted(built) == sorted(SINGLE)
    assert not workers._frames(("report.md",))        # (no figure: nothing built)
    run_report.draw(ahead, SINGLE, built=built)
    assert built == {}                                # each one used
    for stem in SINGLE:
        assert (ahead / f"{stem}.png").read_bytes() == (scratch / f"{stem}.png").read_bytes(), \
            stem


def test_titles_placed_once_land_where_the_search_puts_them(tmp_path, athena_run,
                                                             monkeypatch):
    """The run figures' axes place their titles at the top edge once
    (``style.fixed_titles``) instead of searching at every draw for what a title must
    clear: the search would leave them there (ticks and labels at the bottom, no
    offset text), so every figure has the same bytes with the search back on."""
    import contextlib
    import shutil

    from reports import style

    frame = run_report.frames(("ttft_cdf",))["ttft_cdf"]
    assert frame[1]._autotitlepos is False            # (placed, not searched for)
    searched = tmp_path / "searched"
    shutil.copytree(athena_run, searched)
    monkeypatch.setattr(style, "fixed_titles", contextlib.nullcontext)
    assert run_report.frames(("ttft_cdf",))["ttft_cdf"][1]._autotitlepos is True
    run_report.draw(searched, SINGLE)
    for stem in SINGLE:
        assert (searched / f"{stem}.png").read_bytes() == \
            (athena_run / f"{stem}.png").read_bytes(), stem


def test_a_fleet_run_draws_its_replicas_panel(tmp_path):
    """A fleet's report has the per-replica panel, cut to its pixels like the others,
    and a Fleet section naming the router; a single replica's has neither."""
    from sim.config.scenario import load_scenario
    from sim.commands.run import simulate, write_run

    sc = load_scenario(ROOT / "scenarios" / "athena-tiny.yaml",
                       {"cluster.replicas": 3, "cluster.router.policy": "least_outstanding"})
    out = write_run(tmp_path / "fleet", sc, *simulate(sc))
    assert (out / "replicas.png").stat().st_size > 0
    md = (out / "report.md").read_text()
    assert "## Fleet" in md and "`least_outstanding`" in md and "replicas.png" in md
    again = tmp_path / "again"
    import shutil

    shutil.copytree(out, again)
    run_report.write_report(again)          # (sim report DIR: the same bytes)
    assert (again / "replicas.png").read_bytes() == (out / "replicas.png").read_bytes()


def test_requests_panel_bins_are_time_weighted_with_their_range():
    """A run of thousands of steps draws the requests running and waiting as bins: each
    bin's time-weighted mean (a value holds until the next step) and its min-max."""
    import numpy as np

    from reports.memory_figure import binned

    # 0 for 1 s, 10 for 3 s, then 4 to the end (8 s): two bins of 4 s
    edges, mean, lo, hi = binned([0.0, 1.0, 4.0, 8.0], [0, 10, 4, 4], bins=2)
    assert list(edges) == [0.0, 4.0, 8.0]
    assert np.allclose(mean, [7.5, 4.0])
    assert list(lo) == [0, 4] and list(hi) == [10, 4]
    # a bin with no step of its own: the value holding through it
    edges, mean, lo, hi = binned([0.0, 1.0, 9.0], [2, 6, 6], bins=3)
    assert np.allclose(mean, [(2 + 2 * 6) / 3, 6, 6]) and list(lo) == [2, 6, 6]
