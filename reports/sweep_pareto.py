"""The Reuse-Pareto figure of a sweep: token hit rate against *provisioned* cache memory
per GPU (``pool_bytes``: the pool vLLM allocates) with the frontier (max hit, min memory),
and TTFT p50/p99 per point beside it, each row naming the point's provisioned and peak
Mamba-state memory.

Why provisioned and not used: where memory does not bind, the memory a run uses is the
same whatever it was given, so a sweep of budgets (``gpu_memory_utilization``,
``kv_cache_memory_bytes``) would put every point at one spot; the planner's question is
what to provision.  A sweep whose points all provision the same pool (switches, not
budgets) keeps peak Mamba-state memory on the axis, as do points written before
``pool_bytes`` existed (``memory_axis``).  The capacity view of the same
axis, one curve per cache policy, is ``capacity.png`` (``reports/sweep_capacity.py``).

Markers are labelled by the axis values that tell points apart when those labels are
few and short; otherwise by point id, with a key (id -> axis values) under the figure,
so no two labels collide and every marker can still be read back to its setting.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from reports import style
from reports.sweep_capacity import policy_label
from reports.sweep_data import (
    FALSE,
    TRUE,
    Point,
    Sweep,
    axis_name,
    by_memory,
    natural_key,
    pareto_frontier,
    pareto_items,
    provisioned,
)

CAPTION = ("Which settings reuse the most prompt for the least cache memory provisioned per "
           "GPU, and what does each cost in time to first token?")
CAPTION_USED = ("Which settings reuse the most prompt for the least Mamba-state memory, "
                "and what does each cost in time to first token?")
MAX_VALUE_LABELS = 4      # more points than this: label by id, with a key
MAX_LABEL_CHARS = 36
KEY_ROWS = 18             # rows per column of the key


@dataclass(frozen=True)
class MemoryAxis:
    """The Pareto's memory axis: ``x(point)`` in GiB, and what it is."""

    x: Callable[[Point], float]
    metric: str               # the summary.json field it reads
    label: str                # the axis label
    title: str                # the figure title's name of it
    provisioned: bool


PROVISIONED = MemoryAxis(lambda p: p.cache_bytes / style.GIB, "pool_bytes",
                         "provisioned cache memory per GPU (GiB, pool_bytes)",
                         "provisioned cache memory per GPU", True)
# with the CPU tier: its host pool per GPU beside the GPU pool (Point.cache_bytes)
PROVISIONED_HOST = MemoryAxis(lambda p: p.cache_bytes / style.GIB, "pool_bytes",
                              "provisioned cache memory per GPU (GiB): GPU pool_bytes + "
                              "host_pool_bytes", "provisioned GPU + host cache memory per GPU",
                              True)
USED = MemoryAxis(lambda p: p.mamba_gib, "mamba_state_bytes_peak",
                  "peak Mamba-state memory per GPU (GiB)", "peak Mamba-state memory per GPU",
                  False)


FLEET = MemoryAxis(lambda p: p.m("pool_bytes") / style.GIB, "pool_bytes",
                   "provisioned cache memory, whole fleet (GiB: replicas x pool)",
                   "provisioned cache memory of the fleet", True)


FLEET_USED = MemoryAxis(lambda p: p.mamba_gib, "mamba_state_bytes_peak",
                        "peak Mamba-state memory, whole fleet (GiB, each replica's peak summed)",
                        "peak Mamba-state memory of the fleet", False)


def _fleet(points: list[Point]) -> bool:
    """Points of fleets (``cluster:``): ``pool_bytes`` is every replica's pool, summed."""
    try:
        return any(style.finite(p.m("replicas")) for p in points)
    except (KeyError, AttributeError, TypeError, ValueError):
        return False


def memory_axis(points: list[Point]) -> MemoryAxis:
    """Provisioned memory when ``sweep_data.provisioned`` says so (a sweep of budgets,
    or of a fleet's replicas: the whole fleet's), else peak Mamba-state memory (see
    there: the frontier tables read the same)."""
    if not provisioned(points):
        return FLEET_USED if _fleet(points) else USED
    if _fleet(points):
        return FLEET
    return PROVISIONED_HOST if any(p.m("host_pool_bytes") > 0 for p in points) else PROVISIONED


def frontier_items(points: list[Point], axis: MemoryAxis):
    """``(id, memory, hit)`` of each point on ``axis`` (see ``pareto_frontier``)."""
    return pareto_items(points)


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def label_points(fig, ax, points: list[Point], names: dict[str, str], ids: bool,
                 line: tuple[list, list] | None = None, marker_px: float = 5.5,
                 tol_px: float = 8.0, x: Callable[[Point], float] = USED.x) -> None:
    """Label every marker with ``names[id]`` (point ids, three a line, when ``ids``;
    else one name a line). Coinciding markers (within tol_px) share one
    label; each label takes the first offset (nearest first) whose text box overlaps no
    marker, no earlier label and (if it can) not the step line ``line`` = (xs, ys), and
    stays inside the axes; labels off the nearest ring get a leader line."""
    renderer = fig.canvas.get_renderer()  # limits and layout are fixed: no draw needed
    groups: list[list[Point]] = []
    centers: list[np.ndarray] = []
    for p in points:
        px = ax.transData.transform((x(p), p.hit_pct))
        for g, c in zip(groups, centers):
            if math.hypot(px[0] - c[0], px[1] - c[1]) <= tol_px:
                g.append(p)
                break
        else:
            groups.append([p])
            centers.append(px)
    axbox = ax.get_window_extent(renderer)
    every = ax.transData.transform(np.array([(x(p), p.hit_pct) for p in points]))
    markers = [Bbox.from_extents(x - marker_px, y - marker_px, x + marker_px, y + marker_px)
               for x, y in every]
    centers = [ax.transData.transform((float(np.mean([x(p) for p in g])),
                                       float(np.mean([p.hit_pct for p in g])))) for g in groups]
    segments = []
    if line is not None:
        lx, ly = line
        pts = ax.transData.transform(np.column_stack([lx, ly]))
        for (xa, ya), (xb, yb) in zip(pts[:-1], pts[1:]):
            segments.append(Bbox.from_extents(min(xa, xb) - 1, ya - 1, max(xa, xb) + 1, ya + 1))
            segments.append(Bbox.from_extents(xb - 1, min(ya, yb) - 1, xb + 1, max(ya, yb) + 1))
    placed = []
    dirs = [(1, 0), (1, 1), (1, -1), (-1, 0), (-1, 1), (-1, -1), (0, 1), (0, -1)]
    scale = fig.dpi / 72.0
    pad = 1.5
    for g, c in zip(groups, centers):
        texts = [names[p.id] for p in sorted(g, key=lambda p: natural_key(p.id))]
        if ids:
            text = ",\n".join(", ".join(texts[i:i + 3]) for i in range(0, len(texts), 3))
        else:
            text = "\n".join(texts)
        probe = ax.text(0, 0, text, fontsize=7.5, transform=None)
        tb = probe.get_window_extent(renderer)
        probe.remove()
        w, h = tb.width, tb.height
        best = None
        for r in (6, 14, 24, 36, 50, 66):
            for dx, dy in dirs:
                norm = math.hypot(dx, dy)
                ox, oy = r * dx / norm * scale, r * dy / norm * scale
                ax_x = c[0] + ox
                ay = c[1] + oy
                x0 = ax_x if dx > 0 else (ax_x - w if dx < 0 else ax_x - w / 2)
                y0 = ay if dy > 0 else (ay - h if dy < 0 else ay - h / 2)
                bb = Bbox.from_extents(x0 - pad, y0 - pad, x0 + w + pad, y0 + h + pad)
                cost = sum(_overlap(bb, o) for o in placed)
                cost += sum(_overlap(bb, m) for m in markers)
                cost += 0.5 * sum(_overlap(bb, sg) for sg in segments)
                cost += 1000 * (max(0, axbox.x0 - bb.x0) + max(0, bb.x1 - axbox.x1)
                                + max(0, axbox.y0 - bb.y0) + max(0, bb.y1 - axbox.y1))
                if best is None or cost < best[0]:
                    best = (cost, r, dx, dy, bb)
                if cost == 0:
                    break
            if best[0] == 0:
                break
        _, r, dx, dy, bb = best
        norm = math.hypot(dx, dy)
        kw = dict(xytext=(r * dx / norm, r * dy / norm), textcoords="offset points",
                  ha="left" if dx > 0 else ("right" if dx < 0 else "center"),
                  va="bottom" if dy > 0 else ("top" if dy < 0 else "center"),
                  fontsize=7.5, zorder=5)
        if r > 6:  # leader from the text's near corner or edge to the marker
            relpos = (0.0 if dx > 0 else (1.0 if dx < 0 else 0.5),
                      0.0 if dy > 0 else (1.0 if dy < 0 else 0.5))
            kw["arrowprops"] = dict(arrowstyle="-", lw=0.6, color="#555555", shrinkA=1,
                                    shrinkB=4, relpos=relpos)
        anchor = (float(np.mean([x(p) for p in g])), float(np.mean([p.hit_pct for p in g])))
        ax.annotate(text, anchor, **kw)
        placed.append(bb)


def key_columns(sweep: Sweep, points: list[Point]) -> list[str]:
    """The key as monospace text blocks (one per column of at most KEY_ROWS points):
    a header of the varying axes' names, then one aligned row of values per point."""
    head, rows = sweep.value_table(sorted(points, key=lambda p: natural_key(p.id)))
    return ["\n".join([head, *rows[i:i + KEY_ROWS]]) for i in range(0, len(rows), KEY_ROWS)]


BOUND_STYLES = ("--", ":", "-.")


def ideal_bounds(points: list[Point], axis: MemoryAxis) -> list[Point]:
    """The points of the ideal policy on a provisioned-memory axis, where the sweep has
    others: with unlimited memory no budget binds them, so their pool (the base
    scenario's, 64.79 GiB on athena) is nominal; drawn as a line at their hit rate, they
    no longer stretch the axis and squash every configuration into its left edge."""
    from reports.sweep_capacity import is_ideal

    if not axis.provisioned or all(is_ideal(p) for p in points):
        return []
    return [p for p in points if is_ideal(p)]


def use_value_labels(sweep: Sweep, points: list[Point]) -> bool:
    names = [sweep.point_label(p) for p in points]
    return (len(points) <= MAX_VALUE_LABELS and bool(sweep.varying_axes)
            and max((len(t) for t in names), default=0) <= MAX_LABEL_CHARS)


def figure_pareto(sweep: Sweep, folder: Path) -> style.Saved:
    pts = sweep.plotted
    n = len(pts)
    axis = memory_axis(pts)
    mem = axis.x
    caption = CAPTION if axis.provisioned else CAPTION_USED
    front = set(pareto_frontier(frontier_items(pts, axis)))
    ordered = (sorted(pts, key=lambda p: (mem(p), -p.hit_pct, natural_key(p.id)))
               if axis.provisioned else by_memory(pts))
    values = use_value_labels(sweep, pts)
    names = {p.id: sweep.point_label(p) if values else p.id for p in pts}
    blocks = key_columns(sweep, pts) if (pts and not values and sweep.varying_axes) else []
    aliases = sweep.aliases() if blocks else []
    h = max(4.4, 0.26 * n + 1.2)
    gap = 1.0  # x label and legend under the panels
    key_h = 0.135 * (min(n, KEY_ROWS) + 2) + 0.1 if blocks else 0.0
    H = h + gap + key_h
    fig = style.figure(13.0, H)
    # provisioned | used row labels are longer: a wider gap for them
    widths = (6.3, 2.1, 4.6) if axis.provisioned else (6.6, 1.7, 4.7)
    gs = fig.add_gridspec(3 if blocks else 2, 3, width_ratios=widths,
                          height_ratios=(h, gap, key_h) if blocks else (h, gap),
                          wspace=0.0, hspace=0.0, left=0.06, right=0.98, top=1 - 0.62 / H,
                          bottom=0.02)
    ax = fig.add_subplot(gs[0, 0])
    bx = fig.add_subplot(gs[0, 2])
    fig.suptitle(f"{sweep.name}: Reuse-Pareto, token hit rate vs {axis.title}",
                 fontsize=11, y=1 - 0.08 / H, va="top")
    if not pts:
        style.empty(ax, "no successful points")
        style.empty(bx, "no successful points")
        return style.save(fig, folder, "pareto", caption)

    flag = sweep.flag_axis
    shapes = {FALSE: "o", TRUE: "^"}
    bounds = ideal_bounds(ordered, axis)
    drawn = [p for p in ordered if p not in bounds]
    for p in drawn:
        on = p.id in front
        mk = shapes[p.axes[flag].lower()] if flag else "o"
        ax.scatter([mem(p)], [p.hit_pct], s=40 if on else 32, marker=mk, zorder=4,
                   facecolor=style.FRONTIER if on else "white",
                   edgecolor=style.FRONTIER if on else style.DOMINATED, linewidth=1.2)
    xs = np.array([mem(p) for p in drawn])
    ys = np.array([p.hit_pct for p in pts])
    xspan = max(xs.max() - xs.min(), abs(xs.max()) * 0.1, 0.2)
    yspan = max(ys.max() - ys.min(), 4.0)
    x0, x1 = xs.min() - 0.12 * xspan, xs.max() + (0.45 if values else 0.2) * xspan
    y0, y1 = ys.min() - 0.15 * yspan, ys.max() + 0.15 * yspan
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    fpts = [p for p in drawn if p.id in front]
    fx = [mem(p) for p in fpts] + [x1] if fpts else []
    fy = [p.hit_pct for p in fpts] + [fpts[-1].hit_pct] if fpts else []
    ax.plot(fx, fy, drawstyle="steps-post", color=style.FRONTIER, lw=1.2, alpha=0.8, zorder=3)
    for j, p in enumerate(bounds):
        ax.axhline(p.hit_pct, color=style.FRONTIER if p.id in front else style.DOMINATED,
                   ls=BOUND_STYLES[j % len(BOUND_STYLES)], lw=1.0, zorder=2)
    ax.set_xlabel(axis.label)
    ax.set_ylabel("token hit rate (% of prompt tokens)")
    ax.grid(alpha=0.3)
    ax.set_title(f"{n} point{'s' if n != 1 else ''}; the frontier keeps the best hit rate "
                 f"for the memory", loc="left")
    handles = [Line2D([], [], color=style.FRONTIER, lw=1.2, marker="o", markersize=6,
                      label=f"Pareto frontier ({len(front)})"),
               Line2D([], [], color=style.DOMINATED, lw=0, marker="o", markerfacecolor="white",
                      markersize=6, label=f"dominated ({n - len(front)})")]
    for j, p in enumerate(bounds):       # (in the key, not on the axes: no label collides)
        handles.append(Line2D([], [], color=style.FRONTIER if p.id in front else
                              style.DOMINATED, lw=1.0, ls=BOUND_STYLES[j % len(BOUND_STYLES)],
                              label=f"{p.id} {policy_label(p)}: {p.hit_pct:.2f} % (a bound: "
                                    f"its {mem(p):.2f} GiB pool binds nothing)"))
    if flag:
        for v, mk in shapes.items():
            handles.append(Line2D([], [], color="black", lw=0, marker=mk, markerfacecolor="none",
                                  markersize=6, label=f"{axis_name(flag)}={v}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.085 * 4.4 / h),
              ncol=2, frameon=False, fontsize=7.5, handletextpad=0.4, columnspacing=1.5)
    label_points(fig, ax, drawn, names, ids=not values, line=(fx, fy) if fx else None, x=mem)

    # right panel: TTFT p50 / p99 per point, same order as the memory axis
    ypos = np.arange(n)[::-1]
    p50 = [p.ttft("ttft_p50_s") for p in ordered]
    p99 = [p.ttft("ttft_p99_s") for p in ordered]
    for y, a, b in zip(ypos, p50, p99):
        bx.plot([a, b], [y, y], color="#bbbbbb", lw=1.6, zorder=2)
    bx.scatter(p50, ypos, color=style.HIT, s=24, zorder=3, label="TTFT p50")
    bx.scatter(p99, ypos, color=style.P99, marker="D", s=20, zorder=3, label="TTFT p99")
    bx.set_yticks(ypos)
    if axis.provisioned:    # used beside provisioned: what the pool held of Mamba states
        rows = [f"{p.id} {mem(p):6.2f} | {p.mamba_gib:5.2f} GiB" for p in ordered]
    else:
        rows = [f"{p.id} {p.mamba_gib:6.2f} GiB" for p in ordered]
    bx.set_yticklabels(rows, fontsize=7.5, family="monospace")
    for t, p in zip(bx.get_yticklabels(), ordered):
        if p.id in front:
            t.set_color(style.FRONTIER)
            t.set_fontweight("bold")
    bx.set_ylim(-0.7, n - 0.3)
    bx.set_xlabel("time to first token (s)")
    finite = [v for v in p50 + p99 if style.finite(v)]
    bx.set_xlim(0, max(finite) * 1.08 if finite else 1.0)
    bx.grid(axis="x", alpha=0.3)
    bx.set_title("TTFT p50 and p99 per point (point, provisioned | peak Mamba-state)"
                 if axis.provisioned else "TTFT p50 and p99 per point (point, memory)", loc="left")
    bx.legend(loc="upper left", bbox_to_anchor=(0.0, -0.085 * 4.4 / h), ncol=2, frameon=False)

    if blocks:
        kx = fig.add_subplot(gs[2, :])
        kx.axis("off")
        kx.text(0.0, 1.0, "key: the axis values of each point", va="top", ha="left",
                fontsize=8, fontweight="bold", transform=kx.transAxes)
        step = 1.0 / max(len(blocks), 2) if len(blocks) > 1 else 0.5
        for i, b in enumerate(blocks):
            kx.text(i * step, 1.0 - 0.16 / key_h, b.replace("$", r"\$"), va="top", ha="left",
                    family="monospace", fontsize=7.5, transform=kx.transAxes)
    return style.save(fig, folder, "pareto", caption, note="; ".join(aliases))
