"""pareto.png's memory axis: provisioned cache memory per GPU (``pool_bytes``) when the
points differ in it, so a sweep of budgets where memory does not bind no longer stacks
every point at one spot; peak Mamba-state memory when every point provisions the same pool
(a sweep of switches) or the points predate ``pool_bytes``.

The figure is captured before it is saved (``style.save`` wrapped) and its markers read
back: their x positions, y positions and whether they are filled (on the frontier)."""
from __future__ import annotations

import pytest

from reports import style, sweep_pareto
from reports.sweep_data import load_sweep
from tests.reports.builders import P, write_sweep

GIB = 2**30
BUDGET = "kv_cache.kv_cache_memory_bytes"


def _draw(tmp_path, points, monkeypatch):
    """Draw pareto for ``points``; returns ({point id: (x, y, on frontier)}, svg text)."""
    sweep = load_sweep(write_sweep(tmp_path / "s", points))
    seen = {}
    real_save = style.save

    def save(fig, folder, stem, *a, **k):
        ax = fig.axes[0]
        marks = []
        for c in ax.collections:
            (x, y), = c.get_offsets()
            filled = tuple(c.get_facecolor()[0][:3]) != (1.0, 1.0, 1.0)
            marks.append((float(x), float(y), filled))
        seen["marks"] = marks
        seen["xlabel"] = ax.get_xlabel()
        return real_save(fig, folder, stem, *a, **k)

    monkeypatch.setattr(sweep_pareto.style, "save", save)
    sweep_pareto.figure_pareto(sweep, tmp_path / "s")
    ordered = sorted(sweep.plotted, key=lambda p: (sweep_pareto.memory_axis(sweep.plotted).x(p),
                                                    -p.hit_pct, p.id))
    return dict(zip([p.id for p in ordered], seen["marks"])), seen["xlabel"]


# p0 provisions less but holds more Mamba state; p1 the reverse; p2 the most of both
POINTS = [("p0", 1 * GIB, 3 * GIB, 0.50), ("p1", 2 * GIB, 1 * GIB, 0.50),
          ("p2", 4 * GIB, 2 * GIB, 0.80)]


def _points(same_pool: bool = False) -> list[P]:
    return [P(i, {BUDGET: str(pool)}, summary={
        "pool_bytes": 8 * GIB if same_pool else pool, "mamba_state_bytes_peak": used,
        "token_hit_rate": hit}) for i, pool, used, hit in POINTS]


def test_x_is_the_provisioned_pool_and_the_frontier_follows_it(tmp_path, monkeypatch):
    marks, xlabel = _draw(tmp_path, _points(), monkeypatch)
    assert xlabel == "provisioned cache memory per GPU (GiB, pool_bytes)"
    for pid, pool, _, hit in POINTS:
        x, y, _ = marks[pid]
        assert x == pytest.approx(pool / GIB) and y == pytest.approx(hit * 100)
    # on provisioned memory p0 (1 GiB, 50 %) dominates p1 (2 GiB, 50 %); on used memory
    # it would be the reverse
    assert {pid for pid, (_, _, on) in marks.items() if on} == {"p0", "p2"}
    svg = (tmp_path / "s" / "pareto.svg").read_text()
    assert "token hit rate vs provisioned cache memory per GPU" in svg
    assert "| " in svg                      # each row names provisioned | peak Mamba-state


def test_one_pool_for_every_point_keeps_the_used_axis(tmp_path, monkeypatch):
    marks, xlabel = _draw(tmp_path, _points(same_pool=True), monkeypatch)
    assert xlabel == "peak Mamba-state memory per GPU (GiB)"
    for pid, _, used, _ in POINTS:
        assert marks[pid][0] == pytest.approx(used / GIB)
    assert {pid for pid, (_, _, on) in marks.items() if on} == {"p1", "p2"}


def test_points_without_pool_bytes_keep_the_used_axis(tmp_path):
    pts = [P(i, {BUDGET: str(pool)}, summary={"mamba_state_bytes_peak": used,
                                              "token_hit_rate": hit})
           for i, pool, used, hit in POINTS]
    sweep = load_sweep(write_sweep(tmp_path / "s", pts))
    assert sweep_pareto.memory_axis(sweep.plotted) is sweep_pareto.USED


def test_same_inputs_same_png(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path / "s", _points()))
    outs = []
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        sweep_pareto.figure_pareto(sweep, tmp_path / d)
        outs.append((tmp_path / d / "pareto.png").read_bytes())
    assert outs[0] == outs[1]
