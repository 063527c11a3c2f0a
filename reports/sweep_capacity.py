"""The capacity view of a sweep: how much cache memory to provision for a hit rate, and
which cache policy gets there cheapest.

A capacity planner sweeps the pool's byte budget (``kv_cache.kv_cache_memory_bytes``)
against ``cache.policy``.  The memory that answers the planner is what is *provisioned*
(``pool_bytes`` in summary.json: the pool vLLM allocates per GPU), not the peak in use:
where memory does not bind, every point would otherwise sit at the same spot.  Each
policy is one curve of token hit rate against provisioned memory, with its own frontier
(the points no cheaper point of the same policy matches); ``ideal`` points (unlimited
memory: the budget does not bind them) are the upper bounds, drawn as horizontal
reference lines.  ``cheapest`` answers "the least provisioned memory that reaches a
target hit rate", absolute and as a fraction of ``ideal``.

Only a sweep whose points carry ``pool_bytes`` and differ in it or in policy gets this
view (``is_capacity_sweep``); the other sweeps' reports are unchanged.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from reports import style
from reports.render import Table
from reports.sweep_data import Point, Sweep, natural_key, pareto_frontier

IDEAL = "ideal"
DEFAULT_TARGET = 0.9
CAPTION = ("How much cache memory must each GPU provision for a token hit rate, which "
           "cache policy gets there cheapest, and what does each cost in time to first token?")
# fixed colours for the policies a planner compares (others take the tab10 cycle)
POLICY_COLORS = {"none": style.DOMINATED, "vllm": style.HIT, "marconi": "#2ca02c"}
IDEAL_STYLES = ("--", ":", "-.")


def policy_label(p: Point) -> str:
    """The point's cache policy as its curve is named: ``summary.json``'s ``policy``, and
    for ``ideal`` its ``checkpoints`` variant when the sweep sets one other than the
    default (``ideal(checkpoints: vllm)``)."""
    pol = str(p.metrics.get("policy") or p.axes.get("cache.policy") or "vllm")
    ck = p.axes.get("cache.checkpoints", "")
    if pol == IDEAL and ck not in ("", "(base)", "null", "every_unit"):
        return f"{IDEAL}(checkpoints: {ck})"
    return pol


def is_ideal(p: Point) -> bool:
    return policy_label(p).startswith(IDEAL)


def pool_gib(p: Point) -> float:
    return p.m("pool_bytes") / style.GIB


def capacity_points(sweep: Sweep) -> list[Point]:
    """The plotted points that carry a finite provisioned pool."""
    return [p for p in sweep.plotted if style.finite(p.m("pool_bytes"))]


def is_capacity_sweep(sweep: Sweep) -> bool:
    """More than one point, differing in provisioned memory or in policy."""
    pts = capacity_points(sweep)
    return len(pts) > 1 and (len({p.m("pool_bytes") for p in pts}) > 1
                             or len({policy_label(p) for p in pts}) > 1)


@dataclass(frozen=True)
class Curve:
    policy: str
    points: list[Point]       # by provisioned memory, then hit rate descending
    frontier: list[str]       # ids of the points no cheaper point of this policy matches


def curves(sweep: Sweep) -> tuple[list[Curve], list[Curve]]:
    """(the budgeted policies' curves, the ideal bounds' curves), each in policy order
    (``none`` and ``vllm`` first, then by name)."""
    by: dict[str, list[Point]] = {}
    for p in capacity_points(sweep):
        by.setdefault(policy_label(p), []).append(p)
    order = sorted(by, key=lambda k: ({"none": 0, "vllm": 1}.get(k, 2), k))
    out = []
    for k in order:
        pts = sorted(by[k], key=lambda p: (p.m("pool_bytes"), -p.hit_pct, natural_key(p.id)))
        front = pareto_frontier([(p.id, p.m("pool_bytes"), p.m("token_hit_rate")) for p in pts])
        out.append(Curve(k, pts, front))
    return ([c for c in out if not c.policy.startswith(IDEAL)],
            [c for c in out if c.policy.startswith(IDEAL)])


def ideal_hit(sweep: Sweep) -> float | None:
    """The best token hit rate (fraction) of the plain ``ideal`` policy, if it ran."""
    hits = [p.m("token_hit_rate") for p in capacity_points(sweep) if policy_label(p) == IDEAL]
    return max(hits) if hits else None


def cheapest(sweep: Sweep, target: float) -> Point | None:
    """The budgeted (non-ideal) point of least provisioned memory whose token hit rate
    reaches ``target`` (a fraction); ties: the higher hit rate, then the lower id."""
    ok = [p for p in capacity_points(sweep)
          if not is_ideal(p) and p.m("token_hit_rate") >= target - 1e-12]
    if not ok:
        return None
    return min(ok, key=lambda p: (p.m("pool_bytes"), -p.m("token_hit_rate"), natural_key(p.id)))


@dataclass(frozen=True)
class Answer:
    what: str                 # "90 % token hit" / "90 % of ideal (41.2 % token hit)"
    target: float             # the hit rate to reach, a fraction
    point: Point | None

    def line(self, sweep: Sweep) -> str:
        if self.point is None:
            return f"cheapest config for {self.what}: none reaches it"
        p = self.point
        return (f"cheapest config for {self.what}: {p.id} ({p.label or p.id}): "
                f"{policy_label(p)}, {pool_gib(p):.2f} GiB per GPU, token hit "
                f"{p.hit_pct:.2f} %")


def answers(sweep: Sweep, target: float = DEFAULT_TARGET) -> list[Answer]:
    """The cheapest configuration for ``target`` as a token hit rate and, when the
    sweep ran ``ideal``, as a fraction of ideal's hit rate."""
    pct = f"{target * 100:g} %"
    out = [Answer(f"{pct} token hit", target, cheapest(sweep, target))]
    best = ideal_hit(sweep)
    if best is not None:
        t = target * best
        out.append(Answer(f"{pct} of ideal ({t * 100:.2f} % token hit)", t, cheapest(sweep, t)))
    return out


def _color(policy: str, i: int, n: int):
    return POLICY_COLORS.get(policy) or style.series_style(i, max(n, 1))[0]


def figure_capacity(sweep: Sweep, folder: Path, target: float = DEFAULT_TARGET) -> style.Saved:
    """``capacity.png``: hit rate against provisioned memory, one curve per policy (filled
    markers on the policy's frontier), the ideal bounds as horizontal lines, the target and
    its cheapest point; TTFT p50 (solid) and p99 (dashed) against the same axis."""
    budgeted, bounds = curves(sweep)
    fig = style.figure(13.0, 5.0)
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": (1.25, 1.0), "wspace": 0.22})
    fig.suptitle(f"{sweep.name}: token hit rate vs provisioned cache memory per GPU",
                 fontsize=11)
    pts = [p for c in budgeted + bounds for p in c.points]
    xs = [pool_gib(p) for c in budgeted for p in c.points] or [pool_gib(p) for p in pts]
    lo, hi = min(xs), max(xs)
    pad = max((hi - lo) * 0.05, 0.5)
    handles = []
    for i, c in enumerate(budgeted):
        col = _color(c.policy, i, len(budgeted))
        x = [pool_gib(p) for p in c.points]
        ax.plot(x, [p.hit_pct for p in c.points], color=col, lw=1.4, zorder=3)
        front = set(c.frontier)
        for p in c.points:
            on = p.id in front
            ax.scatter([pool_gib(p)], [p.hit_pct], s=30, zorder=4, edgecolor=col, linewidth=1.2,
                       facecolor=col if on else "white")
        bx.plot(x, [p.ttft("ttft_p50_s") for p in c.points], color=col, lw=1.4, marker="o",
                markersize=4)
        bx.plot(x, [p.ttft("ttft_p99_s") for p in c.points], color=col, lw=1.2, ls="--",
                marker="D", markersize=3.5)
        handles.append(Line2D([], [], color=col, lw=1.4, marker="o", markersize=5,
                              label=c.policy))
    for j, c in enumerate(bounds):
        ls = IDEAL_STYLES[j % len(IDEAL_STYLES)]
        best = max(c.points, key=lambda p: p.hit_pct)
        ax.axhline(best.hit_pct, color="black", ls=ls, lw=1.1, zorder=2)
        bx.axhline(best.ttft("ttft_p50_s"), color="black", ls=ls, lw=0.9, alpha=0.7)
        handles.append(Line2D([], [], color="black", ls=ls, lw=1.1,
                              label=f"{c.policy}: {best.hit_pct:.2f} % (bound)"))
    for k, a in enumerate(answers(sweep, target)):
        ax.axhline(a.target * 100, color=style.NOTE, lw=0.8, ls=(0, (1, 3)), zorder=1)
        ax.annotate(f"target: {a.what}", (1.0, a.target * 100), xycoords=("axes fraction", "data"),
                    xytext=(-3, 2), textcoords="offset points", ha="right", va="bottom",
                    fontsize=7, color=style.NOTE)
        if a.point is not None:
            ax.scatter([pool_gib(a.point)], [a.point.hit_pct], s=150, facecolor="none",
                       edgecolor=style.FRONTIER, linewidth=1.6, zorder=5)
        handles.append(Line2D([], [], color=style.FRONTIER if a.point else style.NOTE, lw=0,
                              marker="o", markerfacecolor="none", markersize=10,
                              label=("cheapest for " + a.what) if a.point else
                              f"{a.what}: not reached"))
    ax.set_xlim(lo - pad, hi + pad)
    top = max([p.hit_pct for p in pts] + [t.target * 100 for t in answers(sweep, target)])
    ax.set_ylim(0, max(top * 1.08, 1.0))
    ax.set_xlabel("provisioned cache memory per GPU (GiB, pool_bytes)")
    ax.set_ylabel("token hit rate (% of prompt tokens)")
    ax.grid(alpha=0.3)
    ax.set_title("one curve per policy; filled: on the policy's frontier", loc="left")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.13), ncol=2,
              frameon=False, fontsize=7.5)
    bx.set_xlim(lo - pad, hi + pad)
    bx.set_xlabel("provisioned cache memory per GPU (GiB, pool_bytes)")
    bx.set_ylabel("time to first token (s)")
    bx.grid(alpha=0.3)
    bx.set_title("TTFT p50 (solid) and p99 (dashed); ideal p50 as lines", loc="left")
    finite = [v for p in pts for v in (p.ttft("ttft_p50_s"), p.ttft("ttft_p99_s"))
              if style.finite(v)]
    if finite:
        bx.set_yscale("log")
        bx.set_ylim(min(finite) / 1.3, max(finite) * 1.3)
        bx.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        # each tick as written (0.05, 0.1, 100): ScalarFormatter gave every label one
        # count of decimals, so 0.05 printed as a second "0.1" and 100 as "100.0"
        bx.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        bx.yaxis.set_minor_formatter(NullFormatter())
    return style.save(fig, folder, "capacity", CAPTION)


def capacity_blocks(sweep: Sweep, folder: Path, caption: str,
                    target: float = DEFAULT_TARGET) -> tuple[list, Path]:
    """The report's capacity section and ``report_capacity.csv`` (every point by policy
    and provisioned memory, with its frontier flag)."""
    budgeted, bounds = curves(sweep)
    B: list = [("h2", "Capacity: token hit rate vs provisioned memory"),
               ("img", "capacity.png", caption)]
    B.append(("p", "; ".join(a.line(sweep) for a in answers(sweep, target)) + "."))
    rows, csv_rows = [], []
    for c in budgeted + bounds:
        front = set(c.frontier)
        for p in c.points:
            on = p.id in front and not c.policy.startswith(IDEAL)
            rows.append([c.policy, p.id, f"{pool_gib(p):.2f}", f"{p.hit_pct:.2f} %",
                         f"{p.ttft('ttft_p50_s'):.3f}", f"{p.ttft('ttft_p99_s'):.3f}",
                         "yes" if on else ""])
            csv_rows.append([c.policy, p.id, p.label, str(int(p.m("pool_bytes"))),
                             f"{pool_gib(p):.4f}", f"{p.hit_pct:.4f}",
                             f"{p.ttft('ttft_p50_s'):.6f}", f"{p.ttft('ttft_p99_s'):.6f}",
                             "true" if on else "false"])
    B.append(("table", Table(["policy", "id", "GiB/GPU", "token hit", "TTFT p50 (s)",
                              "TTFT p99 (s)", "frontier"], rows, "llrrrrl")))
    path = Path(folder) / "report_capacity.csv"
    import io

    from sim.rundir.atomic_files import write_file

    f = io.StringIO(newline="")
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["policy", "point", "label", "pool_bytes", "pool_gib", "token_hit_rate_pct",
                "ttft_p50_s", "ttft_p99_s", "on_policy_frontier"])
    w.writerows(csv_rows)
    write_file(path, f.getvalue())
    return B, path


__all__ = ["Answer", "Curve", "answers", "capacity_blocks", "cheapest", "curves",
           "figure_capacity", "ideal_hit", "is_capacity_sweep", "policy_label"]
