"""The sweep report: figures, tables and CSVs for a sweep folder.

``write_sweep_report(sweep_dir)`` reads ``points.csv`` and ``points/<point>/requests.csv``
(it never reruns anything) and (re)writes into ``sweep_dir``:

* ``pareto.png/.svg``: token hit rate against peak Mamba-state memory per GPU, the
  Pareto frontier (max hit, min memory) as a step line, and TTFT p50/p99 per point;
* ``ttft_cdf.png/.svg``, ``ttft_vs_prompt.png/.svg``, ``lost_reuse.png/.svg``;
* ``report.md`` and ``report.html`` (the same blocks; images inline as data URIs);
* ``report_points.csv``, ``report_pareto.csv``, ``report_ttft_quantiles.csv``,
  ``report_lost_reuse.csv`` and, when the sweep has exactly one boolean axis,
  ``report_flag_delta.csv``: every number the report shows.

The same folder gives byte-identical outputs: points are sorted by id, numbers are
formatted with fixed precision and matplotlib writes no dates, versions or random ids.
Failed points (and ok points without a readable ``requests.csv``) are left out of the
figures and listed in the report.
"""
from __future__ import annotations

import base64
import csv
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

GIB = 2**30
BASE_COLUMNS = ("point", "label", "status", "error")
# summary.json keys, in the order sim run writes them: the first of these in points.csv
# ends the axis columns.
SUMMARY_KEYS = ("scenario", "model", "policy", "block_size", "hash_block_size", "num_gpu_blocks",
                "requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
                "lost_tokens", "lost_token_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "output_tokens", "makespan_s", "throughput_tok_s",
                "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions", "steps",
                "wall_s", "sim_requests_per_s")
_STRING_KEYS = {"scenario", "model", "policy"}
_TRUE, _FALSE = "true", "false"

_PNG_META = {"Software": None}
_SVG_META = {"Date": None, "Creator": None}
_RC = {
    "svg.hashsalt": "hybrid-cache-sim-sweep-report",
    "svg.fonttype": "none",  # text stays text: smaller files, searchable labels
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
}
_DPI = 110
_FRONTIER_COLOR = "#d62728"
_DOMINATED_COLOR = "#7f7f7f"

FIGURES = ("pareto", "ttft_cdf", "ttft_vs_prompt", "lost_reuse")


# --------------------------------------------------------------------------- loading


@dataclass
class Requests:
    """The requests.csv columns the report uses, as arrays."""

    prompt_tokens: np.ndarray
    lost_tokens: np.ndarray
    ttft_s: np.ndarray
    mamba_states_written: np.ndarray

    def __len__(self) -> int:
        return len(self.ttft_s)


@dataclass
class Point:
    id: str
    label: str
    status: str
    error: str
    axes: dict[str, str]
    metrics: dict[str, object]
    requests: Requests | None = None
    note: str = ""  # why an ok point is not plotted, if it is not

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def plotted(self) -> bool:
        """In the figures: ok, with the memory and hit metrics and its requests.csv."""
        return (self.ok and self.requests is not None
                and _finite(self.metrics.get("mamba_state_bytes_peak"))
                and _finite(self.metrics.get("token_hit_rate")))

    def m(self, key: str) -> float:
        v = self.metrics.get(key)
        return float(v) if isinstance(v, (int, float)) else math.nan

    @property
    def mamba_gib(self) -> float:
        return self.m("mamba_state_bytes_peak") / GIB

    @property
    def hit_pct(self) -> float:
        return self.m("token_hit_rate") * 100.0

    @property
    def states_per_request(self) -> float:
        if self.requests is None or len(self.requests) == 0:
            return math.nan
        return float(np.mean(self.requests.mamba_states_written))

    def ttft(self, key: str) -> float:
        """ttft_mean_s / ttft_p50_s / ... from points.csv, else from requests.csv."""
        v = self.m(key)
        if _finite(v) or self.requests is None or len(self.requests) == 0:
            return v
        t = np.sort(self.requests.ttft_s)
        if key == "ttft_mean_s":
            return float(np.mean(t))
        q = {"ttft_p50_s": 0.5, "ttft_p90_s": 0.9, "ttft_p99_s": 0.99}[key]
        return _quantile(t, q)


@dataclass
class Sweep:
    points: list[Point]
    axes: list[str]
    boolean_axes: list[str] = field(default_factory=list)

    @property
    def plotted(self) -> list[Point]:
        return [p for p in self.points if p.plotted]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _quantile(sorted_vals: np.ndarray, q: float) -> float:
    """Linear interpolation between closest ranks (as sim run's summary)."""
    n = len(sorted_vals)
    if n == 0:
        return math.nan
    k = (n - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, n - 1)
    return float(sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo))


def _natural_key(s: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", s) if t]


def _parse_number(s: str):
    s = (s or "").strip()
    if not s:
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def _read_requests(path: Path) -> Requests:
    cols = {"prompt_tokens": [], "lost_tokens": [], "ttft_s": [], "mamba_states_written": []}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("rejected"):
                continue        # refused on arrival: no measurements
            for k, acc in cols.items():
                acc.append(float(row[k]))
    return Requests(**{k: np.asarray(v, dtype=float) for k, v in cols.items()})


def load_sweep(sweep_dir: Path) -> Sweep:
    """Read points.csv and every ok point's requests.csv."""
    sweep_dir = Path(sweep_dir)
    import io

    from sim.config.errors import InputError
    from sim.config.loader import read_text

    text = read_text(sweep_dir / "points.csv")          # unreadable / not UTF-8: one line
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        rows = list(reader)
    except csv.Error as e:
        raise InputError(f"{sweep_dir / 'points.csv'}: bad CSV ({e})") from None
    missing = [c for c in ("point", "status") if c not in header]
    if missing:
        raise InputError(f"{sweep_dir / 'points.csv'}: missing column(s) {', '.join(missing)}")
    # axis columns: after the fixed columns, up to the first summary metric
    axes = []
    for c in header:
        if c in BASE_COLUMNS:
            continue
        if c in SUMMARY_KEYS:
            break
        axes.append(c)
    metric_cols = [c for c in header if c not in BASE_COLUMNS and c not in axes]
    points = []
    for row in rows:
        pid = (row.get("point") or "").strip()
        metrics = {}
        for c in metric_cols:
            raw = (row.get(c) or "").strip()
            metrics[c] = raw if c in _STRING_KEYS else _parse_number(raw)
        p = Point(id=pid, label=(row.get("label") or "").strip(),
                  status=(row.get("status") or "").strip().lower(),
                  error=" ".join((row.get("error") or "").split()),
                  axes={a: (row.get(a) or "").strip() for a in axes}, metrics=metrics)
        if p.ok:
            req = sweep_dir / "points" / pid / "requests.csv"
            try:
                p.requests = _read_requests(req)
            except FileNotFoundError:
                p.note = "requests.csv missing"
            except (KeyError, ValueError) as e:
                p.note = f"requests.csv unreadable ({type(e).__name__}: {e})"
            if not p.note and not p.plotted:
                p.note = "memory or hit rate missing in points.csv"
        points.append(p)
    points.sort(key=lambda p: _natural_key(p.id))
    # a boolean axis takes both values (a single-valued one pairs nothing)
    booleans = [a for a in axes if {p.axes[a].lower() for p in points} == {_TRUE, _FALSE}]
    return Sweep(points=points, axes=axes, boolean_axes=booleans)


# --------------------------------------------------------------------------- analysis


def pareto_frontier(items) -> list[str]:
    """Ids of the non-dominated items of ``(id, memory, hit)``: minimise memory,
    maximise hit. An item is dominated when another has memory <= and hit >= with at
    least one strict. Items with a non-finite value are ignored; equal items both stay.
    Returned in order of memory ascending (then hit descending, then id)."""
    pts = [(i, float(m), float(h)) for i, m, h in items
           if math.isfinite(float(m)) and math.isfinite(float(h))]
    front = []
    for i, m, h in pts:
        if not any(m2 <= m and h2 >= h and (m2 < m or h2 > h) for _, m2, h2 in pts):
            front.append((m, -h, _natural_key(i), i))
    return [t[-1] for t in sorted(front)]


def dominators(items, target: str) -> list[str]:
    """Ids of the items that dominate ``target`` (see ``pareto_frontier``)."""
    d = {i: (float(m), float(h)) for i, m, h in items}
    m, h = d[target]
    out = [i for i, (m2, h2) in d.items()
           if i != target and m2 <= m and h2 >= h and (m2 < m or h2 > h)]
    return sorted(out, key=_natural_key)


def _items(points: list[Point]):
    return [(p.id, p.m("mamba_state_bytes_peak"), p.m("token_hit_rate")) for p in points]


@dataclass
class FlagPair:
    others: dict[str, str]
    off: Point | None
    on: Point | None

    @property
    def complete(self) -> bool:
        return (self.off is not None and self.on is not None
                and self.off.plotted and self.on.plotted)


def flag_pairs(sweep: Sweep) -> tuple[str, list[FlagPair]] | None:
    """With exactly one boolean axis: its off/on points per combination of the others."""
    if len(sweep.boolean_axes) != 1:
        return None
    flag = sweep.boolean_axes[0]
    others = [a for a in sweep.axes if a != flag]
    groups: dict[tuple, FlagPair] = {}
    for p in sweep.points:
        key = tuple(p.axes[a] for a in others)
        g = groups.setdefault(key, FlagPair(dict(zip(others, key)), None, None))
        side = "on" if p.axes[flag].lower() == _TRUE else "off"
        if getattr(g, side) is None:  # first by point id wins
            setattr(g, side, p)
    order = sorted(groups, key=lambda k: [_natural_key(v) for v in k])
    return flag, [groups[k] for k in order]


# --------------------------------------------------------------------------- formatting


def _f(v: float, digits: int) -> str:
    """Fixed-precision number for the CSVs; empty when missing."""
    return f"{v:.{digits}f}" if _finite(v) else ""


def _r(v: float, fmt: str, unit: str = "") -> str:
    """A number for the report; n/a when missing."""
    return (format(v, fmt) + unit) if _finite(v) else "n/a"


def _signed(v: float, fmt: str, unit: str = "") -> str:
    if not _finite(v):
        return "n/a"
    s = format(v, "+" + fmt)
    if s.lstrip("+-").strip("0.") == "":
        s = format(0.0, fmt)  # no "-0.00"
    return s + unit


def _rel(new: float, old: float) -> float:
    return (new - old) / old * 100.0 if _finite(new) and _finite(old) and old != 0 else math.nan


def _short_axis(a: str) -> str:
    return a.rsplit(".", 1)[-1]


# --------------------------------------------------------------------------- figures


def _style(i: int, n: int):
    """(colour, line style, marker) of the i-th plotted point out of n."""
    if n <= 10:
        return plt.get_cmap("tab10")(i % 10), "-", "o"
    cmap = plt.get_cmap("tab20")
    styles = ("-", "--", ":")
    markers = ("o", "s", "^")
    return cmap(i % 20), styles[(i // 20) % 3], markers[(i // 20) % 3]


def _new_figure(w: float, h: float):
    return plt.figure(figsize=(w, h), dpi=_DPI)


def _save(fig, folder: Path, stem: str) -> list[Path]:
    """PNG and SVG with the same tight bounding box, computed once."""
    bb = fig.get_tightbbox(fig.canvas.get_renderer()).padded(0.1)
    png, svg = folder / f"{stem}.png", folder / f"{stem}.svg"
    fig.savefig(png, dpi=_DPI, bbox_inches=bb, metadata=_PNG_META)
    fig.savefig(svg, bbox_inches=bb, metadata=_SVG_META)
    plt.close(fig)
    return [png, svg]


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")
    ax.set_xticks([])
    ax.set_yticks([])


def _nice_log_ticks(lo: float, hi: float) -> list[float]:
    """Round tick values (1-3, 1-2-5 or finer) within [lo, hi] on a log axis, at least 4."""
    if not (lo > 0 and hi > lo):
        return []
    for mant in ((1,), (1, 3), (1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 4, 5, 7)):
        ticks = []
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            ticks += [m * 10.0**e for m in mant]
        ticks = [t for t in ticks if lo <= t * (1 + 1e-9) and t <= hi * (1 + 1e-9)]
        if len(ticks) >= 4:
            return ticks
    return ticks


def _tick_text(v: float, tokens: bool) -> str:
    if tokens:
        return f"{v / 1000:g}k" if v >= 1000 else f"{v:g}"
    return f"{v:g}"


def _log_axis(axis, lo: float, hi: float, tokens: bool = False) -> None:
    """Log scale with round, plainly written ticks (no 10^x, no minor labels)."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    ticks = _nice_log_ticks(lo, hi)
    if ticks:
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_ticklabels([_tick_text(t, tokens) for t in ticks])
    axis.set_minor_formatter(NullFormatter())


def _overlap(a, b) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _label_points(fig, ax, points: list[Point], line: tuple[list, list] | None = None,
                  marker_px: float = 5.5, tol_px: float = 8.0) -> None:
    """Label every marker with its point id. Coinciding markers (within tol_px) share one
    label; each label takes the first offset (nearest first) whose text box overlaps no
    marker, no earlier label and (if it can) not the step line ``line`` = (xs, ys), and
    stays inside the axes; labels off the nearest ring get a leader line."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()  # limits and layout are fixed: no draw needed
    groups: list[list[Point]] = []
    centers: list[np.ndarray] = []
    for p in points:
        px = ax.transData.transform((p.mamba_gib, p.hit_pct))
        for g, c in zip(groups, centers):
            if math.hypot(px[0] - c[0], px[1] - c[1]) <= tol_px:
                g.append(p)
                break
        else:
            groups.append([p])
            centers.append(px)
    axbox = ax.get_window_extent(renderer)
    every = ax.transData.transform(np.array([(p.mamba_gib, p.hit_pct) for p in points]))
    markers = [Bbox.from_extents(x - marker_px, y - marker_px, x + marker_px, y + marker_px)
               for x, y in every]
    centers = [ax.transData.transform((float(np.mean([p.mamba_gib for p in g])),
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
        ids = sorted((p.id for p in g), key=_natural_key)
        text = ",\n".join(", ".join(ids[i:i + 3]) for i in range(0, len(ids), 3))
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
        anchor = (float(np.mean([p.mamba_gib for p in g])), float(np.mean([p.hit_pct for p in g])))
        ax.annotate(text, anchor, **kw)
        placed.append(bb)


def figure_pareto(sweep: Sweep, folder: Path) -> list[Path]:
    pts = sweep.plotted
    n = len(pts)
    front = set(pareto_frontier(_items(pts)))
    by_mem = sorted(pts, key=lambda p: (p.mamba_gib, -p.hit_pct, _natural_key(p.id)))
    show_key = 0 < n <= 12
    h = max(4.4, 0.26 * n + 1.2)
    gap = 1.0  # x label and legend under the panels
    key_h = 0.16 * (n + 1) + 0.1 if show_key else 0.0
    fig = _new_figure(13.0, h + gap + key_h)
    gs = fig.add_gridspec(3 if show_key else 2, 3, width_ratios=(6.6, 1.7, 4.7),
                          height_ratios=(h, gap, key_h) if show_key else (h, gap),
                          wspace=0.0, hspace=0.0, left=0.06, right=0.98, top=1 - 0.62 / (h + gap + key_h),
                          bottom=0.02)
    ax = fig.add_subplot(gs[0, 0])
    bx = fig.add_subplot(gs[0, 2])
    fig.suptitle("Reuse-Pareto: token hit rate vs peak Mamba-state memory per GPU",
                 fontsize=11, y=1 - 0.08 / (h + gap + key_h), va="top")
    if not pts:
        _empty(ax, "no successful points")
        _empty(bx, "no successful points")
        return _save(fig, folder, "pareto")

    flag = sweep.boolean_axes[0] if len(sweep.boolean_axes) == 1 else None
    shapes = {_FALSE: "o", _TRUE: "^"}
    for p in by_mem:
        on = p.id in front
        mk = shapes[p.axes[flag].lower()] if flag else "o"
        ax.scatter([p.mamba_gib], [p.hit_pct], s=40 if on else 32, marker=mk, zorder=4,
                   facecolor=_FRONTIER_COLOR if on else "white",
                   edgecolor=_FRONTIER_COLOR if on else _DOMINATED_COLOR, linewidth=1.2)
    xs = np.array([p.mamba_gib for p in pts])
    ys = np.array([p.hit_pct for p in pts])
    xspan = max(xs.max() - xs.min(), abs(xs.max()) * 0.1, 0.2)
    yspan = max(ys.max() - ys.min(), 4.0)
    x0, x1 = xs.min() - 0.12 * xspan, xs.max() + 0.2 * xspan
    y0, y1 = ys.min() - 0.15 * yspan, ys.max() + 0.15 * yspan
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    fpts = [p for p in by_mem if p.id in front]
    fx = [p.mamba_gib for p in fpts] + [x1]
    fy = [p.hit_pct for p in fpts] + [fpts[-1].hit_pct]
    ax.plot(fx, fy, drawstyle="steps-post", color=_FRONTIER_COLOR, lw=1.2, alpha=0.8, zorder=3)
    ax.set_xlabel("peak Mamba-state memory per GPU (GiB)")
    ax.set_ylabel("token hit rate (%)")
    ax.grid(alpha=0.3)
    ax.set_title(f"{n} point{'s' if n != 1 else ''}; the frontier keeps the best hit rate "
                 f"for the memory", loc="left")
    handles = [Line2D([], [], color=_FRONTIER_COLOR, lw=1.2, marker="o", markersize=6,
                      label=f"Pareto frontier ({len(front)})"),
               Line2D([], [], color=_DOMINATED_COLOR, lw=0, marker="o", markerfacecolor="white",
                      markersize=6, label=f"dominated ({n - len(front)})")]
    if flag:
        for v, mk in shapes.items():
            handles.append(Line2D([], [], color="black", lw=0, marker=mk, markerfacecolor="none",
                                  markersize=6, label=f"{_short_axis(flag)}={v}"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.085 * 4.4 / h),
              ncol=2, frameon=False, fontsize=7.5, handletextpad=0.4, columnspacing=1.5)
    _label_points(fig, ax, by_mem, line=(fx, fy))

    # right panel: TTFT p50 / p99 per point, same order as the memory axis
    ypos = np.arange(n)[::-1]
    p50 = [p.ttft("ttft_p50_s") for p in by_mem]
    p99 = [p.ttft("ttft_p99_s") for p in by_mem]
    for y, a, b in zip(ypos, p50, p99):
        bx.plot([a, b], [y, y], color="#bbbbbb", lw=1.6, zorder=2)
    bx.scatter(p50, ypos, color="#1f77b4", s=24, zorder=3, label="TTFT p50")
    bx.scatter(p99, ypos, color="#ff7f0e", marker="D", s=20, zorder=3, label="TTFT p99")
    bx.set_yticks(ypos)
    bx.set_yticklabels([f"{p.id} {p.mamba_gib:6.2f} GiB" for p in by_mem], fontsize=7.5,
                       family="monospace")
    for t, p in zip(bx.get_yticklabels(), by_mem):
        if p.id in front:
            t.set_color(_FRONTIER_COLOR)
            t.set_fontweight("bold")
    bx.set_ylim(-0.7, n - 0.3)
    bx.set_xlabel("time to first token (s)")
    finite = [v for v in p50 + p99 if _finite(v)]
    bx.set_xlim(0, max(finite) * 1.08 if finite else 1.0)
    bx.grid(axis="x", alpha=0.3)
    bx.set_title("TTFT p50 and p99 per point, by memory", loc="left")
    bx.legend(loc="upper left", bbox_to_anchor=(0.0, -0.085 * 4.4 / h), ncol=2, frameon=False)

    if show_key:
        kx = fig.add_subplot(gs[2, :])
        kx.axis("off")
        key = "\n".join(f"{p.id}  {p.label}" for p in pts).replace("$", r"\$")  # no mathtext
        kx.text(0.0, 1.0, "points:\n" + key, va="top", ha="left", family="monospace",
                fontsize=7.5, transform=kx.transAxes)
    return _save(fig, folder, "pareto")


def _legend_outside(ax, n: int, x: float = 1.01) -> None:
    if not ax.get_legend_handles_labels()[0]:
        return
    ncol = 1 if n <= 16 else 2
    ax.legend(loc="upper left", bbox_to_anchor=(x, 1.0), ncol=ncol, frameon=False,
              title="point", fontsize=7.5, handlelength=2.2, borderaxespad=0.0)


def figure_ttft_cdf(sweep: Sweep, folder: Path) -> list[Path]:
    pts = sweep.plotted
    n = len(pts)
    fig = _new_figure(8.0, 4.6)
    ax = fig.add_subplot()
    ax.set_title("TTFT distribution per point (empirical CDF)", loc="left")
    if not pts:
        _empty(ax, "no successful points")
        return _save(fig, folder, "ttft_cdf")
    lo, hi = math.inf, 0.0
    for i, p in enumerate(pts):
        c, ls, _ = _style(i, n)
        v = np.sort(p.requests.ttft_s)
        v = v[v > 0]
        if len(v) == 0:
            continue
        lo, hi = min(lo, float(v[0])), max(hi, float(v[-1]))
        y = np.arange(1, len(v) + 1) / len(v)
        ax.plot(np.concatenate([[v[0]], v]), np.concatenate([[0.0], y]), drawstyle="steps-post",
                color=c, ls=ls, lw=1.3, label=p.id)
    ax.set_xscale("log")
    if hi > lo:
        ax.set_xlim(lo / 1.15, hi * 1.15)
        _log_axis(ax.xaxis, lo / 1.15, hi * 1.15)
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    qs = (0.5, 0.9, 0.99)
    for q in qs:
        ax.axhline(q, color="grey", lw=0.6, ls=":")
    rx = ax.twinx()
    rx.set_ylim(ax.get_ylim())
    rx.set_yticks(qs)
    rx.set_yticklabels([f"p{int(q * 100)}" for q in qs], fontsize=7, color="grey")
    rx.tick_params(length=0)
    _legend_outside(ax, n, x=1.06)
    return _save(fig, folder, "ttft_cdf")


def _prompt_bins(pts: list[Point]) -> np.ndarray:
    allp = np.concatenate([p.requests.prompt_tokens for p in pts])
    allp = allp[allp > 0]
    if len(allp) == 0:
        return np.array([1.0, 2.0])
    lo, hi = float(allp.min()), float(allp.max())
    if hi <= lo * 1.05:
        return np.array([lo * 0.95, hi * 1.05])
    return np.geomspace(lo, hi * 1.0001, 13)


def binned_median_ttft(p: Point, edges: np.ndarray, min_count: int = 3):
    """Per prompt-length bin with >= min_count requests: (median prompt length,
    median TTFT, count)."""
    out = []
    pr, t = p.requests.prompt_tokens, p.requests.ttft_s
    idx = np.searchsorted(edges, pr, side="right") - 1
    for b in range(len(edges) - 1):
        sel = idx == b
        if b == len(edges) - 2:
            sel |= pr == edges[-1]
        if int(sel.sum()) >= min_count:
            out.append((float(np.median(pr[sel])), float(np.median(t[sel])), int(sel.sum())))
    return out


def figure_ttft_vs_prompt(sweep: Sweep, folder: Path) -> list[Path]:
    pts = sweep.plotted
    n = len(pts)
    fig = _new_figure(8.0, 4.6)
    ax = fig.add_subplot()
    if not pts:
        ax.set_title("TTFT by prompt length", loc="left")
        _empty(ax, "no successful points")
        return _save(fig, folder, "ttft_vs_prompt")
    edges = _prompt_bins(pts)
    # a bin's median needs 3 requests, unless no point has such a bin (tiny sweeps)
    min_count = 3 if any(binned_median_ttft(p, edges, 3) for p in pts) else 1
    ax.set_title(f"TTFT by prompt length: median per log-spaced bin (>= {min_count} "
                 f"request{'s' if min_count > 1 else ''})", loc="left")
    scatter = n <= 4
    ylo, yhi = math.inf, 0.0
    for i, p in enumerate(pts):
        c, ls, mk = _style(i, n)
        if scatter:
            ok = p.requests.ttft_s > 0
            ax.scatter(p.requests.prompt_tokens[ok], p.requests.ttft_s[ok], s=5, color=c,
                       alpha=0.2, linewidths=0, zorder=1)
            if ok.any():
                ylo = min(ylo, float(p.requests.ttft_s[ok].min()))
                yhi = max(yhi, float(p.requests.ttft_s[ok].max()))
        med = [m for m in binned_median_ttft(p, edges, min_count) if m[1] > 0]
        if med:
            ax.plot([m[0] for m in med], [m[1] for m in med], color=c, ls=ls, marker=mk,
                    markersize=3.5, lw=1.3, label=p.id, zorder=3)
            ylo = min(ylo, min(m[1] for m in med))
            yhi = max(yhi, max(m[1] for m in med))
    ax.set_xscale("log")
    ax.set_yscale("log")
    xl = (edges[0] / 1.1, edges[-1] * 1.1)
    ax.set_xlim(*xl)
    _log_axis(ax.xaxis, *xl, tokens=True)
    if yhi > ylo:
        yl = (ylo / 1.25, yhi * 1.25)
        ax.set_ylim(*yl)
        _log_axis(ax.yaxis, *yl)
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("time to first token (s, log scale)")
    ax.grid(alpha=0.3)
    if scatter:
        ax.text(0.01, 0.985, "lines: bin medians; dots: individual requests",
                transform=ax.transAxes, va="top", fontsize=7, color="grey")
    _legend_outside(ax, n)
    return _save(fig, folder, "ttft_vs_prompt")


def lost_reuse_stats(p: Point) -> dict:
    lost = p.requests.lost_tokens if p.requests is not None else np.zeros(0)
    nz = lost[lost > 0]
    return {"requests": len(lost), "with_loss": int(len(nz)), "total": float(nz.sum()),
            "mean": float(nz.mean()) if len(nz) else math.nan,
            "max": float(nz.max()) if len(nz) else math.nan}


def _lost_bins(nzs: list[np.ndarray]):
    """Shared bins for the lost-reuse histograms: one per distinct value when there are at
    most 10 across the sweep (losses are usually whole blocks), else 15 equal-width bins.
    Returns (bin labels, per-point count arrays, categorical)."""
    allnz = np.concatenate(nzs) if nzs else np.zeros(0)
    distinct = np.unique(allnz)
    if len(distinct) == 0:
        return [], [np.zeros(0, dtype=int) for _ in nzs], True
    if len(distinct) <= 10:
        counts = [np.array([int((nz == v).sum()) for v in distinct]) for nz in nzs]
        return [f"{int(v):,}" for v in distinct], counts, True
    edges = np.linspace(0, float(distinct[-1]), 16)
    edges[-1] = np.nextafter(edges[-1], np.inf)
    counts = [np.histogram(nz, bins=edges)[0].astype(int) for nz in nzs]
    labels = [f"{int(a):,}–{int(b):,}" for a, b in zip(edges[:-1], edges[1:])]
    return labels, counts, False


_LOST_TITLE = ("lost reuse per request: tokens full attention could reuse but reconciliation "
               "dropped\n(requests with loss > 0 only)")


def figure_lost_reuse(sweep: Sweep, folder: Path) -> list[Path]:
    """Histogram of lost tokens per request, per point, on shared bins: small multiples up
    to 8 points, beyond that one row per point (a heat map with the counts written in)."""
    pts = sweep.plotted
    n = len(pts)
    nzs = [p.requests.lost_tokens[p.requests.lost_tokens > 0] for p in pts]
    labels, counts, categorical = _lost_bins(nzs)
    stats = [lost_reuse_stats(p) for p in pts]
    if n > 8:
        return _lost_matrix(pts, labels, counts, stats, categorical, folder)
    ncols = 1 if n <= 1 else (2 if n <= 4 else 3)
    nrows = max(1, math.ceil(n / ncols))
    pw, ph = (5.6, 2.6) if ncols == 1 else (3.9, 2.0)
    top_in, bottom_in = 0.85, 0.7
    H = ph * nrows + 0.6 * (nrows - 1) + top_in + bottom_in
    W = pw * ncols + 0.75 * (ncols - 1) + 0.9
    fig = _new_figure(W, H)
    gs = fig.add_gridspec(nrows, ncols, left=0.75 / W, right=1 - 0.1 / W, top=1 - top_in / H,
                          bottom=bottom_in / H, wspace=0.75 / pw, hspace=0.6 / ph)
    fig.suptitle(_LOST_TITLE, fontsize=9.5, y=1 - 0.1 / H, va="top")
    if not pts:
        _empty(fig.add_subplot(gs[0, 0]), "no successful points")
        return _save(fig, folder, "lost_reuse")
    x = np.arange(len(labels))
    rot = len(labels) > 4 or not categorical
    for i, (p, c, st) in enumerate(zip(pts, counts, stats)):
        ax = fig.add_subplot(gs[i // ncols, i % ncols])
        if len(labels):
            ax.bar(x, c, color="#d62728", width=0.55 if categorical else 0.9)
            ax.set_xticks(x)
            ax.set_xticklabels(labels, rotation=35 if rot else 0, ha="right" if rot else "center",
                               fontsize=7 if rot else 8)
            ax.set_xlim(-0.6, len(labels) - 0.4)
        if not st["with_loss"]:
            ax.text(0.5, 0.5, "no request lost reuse", ha="center", va="center",
                    transform=ax.transAxes, color="grey", fontsize=8)
        ax.set_title(f"{p.id}: {st['with_loss']:,} of {st['requests']:,} requests, "
                     f"{int(st['total']):,} tokens", fontsize=8.5, loc="left")
        ax.grid(alpha=0.3, axis="y")
        ax.set_ylim(0, max(1, int(c.max()) if len(c) else 1) * 1.08)
        ax.yaxis.get_major_locator().set_params(integer=True)
        if i % ncols == 0:
            ax.set_ylabel("requests")
        if i + ncols >= n:  # lowest panel of its column
            ax.set_xlabel("lost reuse per request (tokens)")
    return _save(fig, folder, "lost_reuse")


def _lost_matrix(pts, labels, counts, stats, categorical, folder: Path) -> list[Path]:
    from matplotlib.colors import LogNorm

    n, m = len(pts), max(len(labels), 1)
    W = 2.2 + 0.75 * m + 2.6
    H = 0.26 * n + 2.0
    fig = _new_figure(W, H)
    ax = fig.add_axes((2.0 / W - 1.3 / W, 1.25 / H, 0.75 * m / W, (H - 2.0) / H))
    ax.set_title(_LOST_TITLE.replace("\n", " ") + ";\ncells: requests per bin (darker = more)",
                 loc="left", fontsize=9)
    mat = np.array([c if len(c) else np.zeros(m, dtype=int) for c in counts], dtype=float)
    shown = np.where(mat > 0, mat, np.nan)
    vmax = max(float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0, 1.0)
    norm = LogNorm(vmin=0.7, vmax=vmax * 1.6)
    cmap = plt.get_cmap("Reds")
    ax.imshow(shown, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    for i in range(n):
        for j in range(m):
            if mat[i, j] > 0:
                r, g, b, _ = cmap(norm(mat[i, j]))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, f"{int(mat[i, j]):,}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.set_xticks(np.arange(m))
    rot = len(labels) > 4 or not categorical
    ax.set_xticklabels(labels or ["(none)"], rotation=35 if rot else 0,
                       ha="right" if rot else "center", fontsize=7.5)
    ax.set_yticks(np.arange(n))
    ax.set_yticklabels([p.id for p in pts], family="monospace", fontsize=7.5)
    ax.set_xlabel("lost reuse per request (tokens)")
    ax.set_ylabel("point")
    ax.set_xticks(np.arange(m + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1.0)
    ax.tick_params(which="minor", length=0)
    rx = ax.twinx()
    rx.set_ylim(ax.get_ylim())
    rx.set_yticks(np.arange(n))
    rx.set_yticklabels([f"{st['with_loss']:,} of {st['requests']:,} req, "
                        f"{int(st['total']):,} tok" for st in stats], fontsize=7)
    rx.tick_params(length=0)
    rx.set_ylabel("requests with loss, lost tokens")
    return _save(fig, folder, "lost_reuse")


# --------------------------------------------------------------------------- tables / CSVs


def _points_table(sweep: Sweep, front: set[str]):
    head = (["id", "label", "status"] + [_short_axis(a) for a in sweep.axes]
            + ["token hit", "request hit", "lost tokens", "Mamba GiB", "states/req",
               "TTFT p50 (s)", "TTFT p90 (s)", "TTFT p99 (s)", "output tok/s", "frontier"])
    rows = []
    for p in sweep.points:
        num = p.ok
        rows.append([p.id, p.label, p.status + (f" ({p.note})" if p.note else "")]
                    + [p.axes[a] for a in sweep.axes]
                    + ([_r(p.hit_pct, ".2f", " %"), _r(p.m("request_hit_rate") * 100, ".2f", " %"),
                        _r(p.m("lost_token_rate") * 100, ".2f", " %"), _r(p.mamba_gib, ".2f"),
                        _r(p.states_per_request, ".2f"), _r(p.ttft("ttft_p50_s"), ".3f"),
                        _r(p.ttft("ttft_p90_s"), ".3f"), _r(p.ttft("ttft_p99_s"), ".3f"),
                        _r(p.m("throughput_tok_s"), ",.1f"), "yes" if p.id in front else ""]
                       if num else [""] * 10))
    align = "lll" + "l" * len(sweep.axes) + "r" * 9 + "c"
    return head, rows, align


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    return path


def _csv_points(sweep: Sweep, folder: Path, front: set[str]) -> Path:
    header = (["point", "label", "status", "error", "note"] + sweep.axes
              + ["requests", "token_hit_rate_pct", "request_hit_rate_pct", "lost_token_rate_pct",
                 "mamba_state_bytes_peak", "mamba_state_gib", "states_per_request", "ttft_mean_s",
                 "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s",
                 "on_pareto_frontier"])
    rows = []
    for p in sweep.points:
        mb = p.m("mamba_state_bytes_peak")
        rows.append([p.id, p.label, p.status, p.error, p.note] + [p.axes[a] for a in sweep.axes]
                    + [str(int(p.m("requests"))) if _finite(p.m("requests")) else "",
                       _f(p.hit_pct, 4), _f(p.m("request_hit_rate") * 100, 4),
                       _f(p.m("lost_token_rate") * 100, 4),
                       str(int(mb)) if _finite(mb) else "", _f(p.mamba_gib, 4),
                       _f(p.states_per_request, 4), _f(p.ttft("ttft_mean_s"), 6),
                       _f(p.ttft("ttft_p50_s"), 6), _f(p.ttft("ttft_p90_s"), 6),
                       _f(p.ttft("ttft_p99_s"), 6), _f(p.m("throughput_tok_s"), 3),
                       ("true" if p.id in front else "false") if p.plotted else ""])
    return _write_csv(folder / "report_points.csv", header, rows)


# --------------------------------------------------------------------------- report blocks


@dataclass
class Table:
    head: list[str]
    rows: list[list[str]]
    align: str  # one of l/r/c per column


def _build_blocks(sweep: Sweep, folder: Path):
    """The report as a list of blocks shared by the MD and HTML writers, and the CSVs."""
    pts = sweep.plotted
    items = _items(pts)
    front_ids = pareto_frontier(items)
    front = set(front_ids)
    failed = [p for p in sweep.points if not p.ok]
    unplotted = [p for p in sweep.points if p.ok and not p.plotted]
    csvs: list[Path] = []
    B: list[tuple] = []

    scen = sorted({str(p.metrics.get("scenario")) for p in sweep.points if p.ok
                   and p.metrics.get("scenario")})
    B.append(("h1", f"Sweep report: {', '.join(scen) if scen else 'sweep'}"))
    summ = [f"{len(sweep.points)} point{'s' if len(sweep.points) != 1 else ''}: "
            f"{sum(p.ok for p in sweep.points)} ok, {len(failed)} failed"
            + (f", {len(unplotted)} ok but not plotted" if unplotted else "") + "."]
    for key, name in (("model", "model"), ("policy", "cache policy"),
                      ("block_size", "attention/Mamba block (tokens)")):
        vals = sorted({str(p.metrics.get(key)) for p in sweep.points
                       if p.ok and p.metrics.get(key) is not None}, key=_natural_key)
        if vals:
            summ.append(f"{name}: {', '.join(vals)}.")
    B.append(("p", " ".join(summ)))
    if sweep.axes:
        B.append(("ul", [f"axis `{a}`: " + ", ".join(sorted({p.axes[a] for p in sweep.points},
                                                              key=_natural_key))
                         for a in sweep.axes]))
    B.append(("p", "Memory is the peak Mamba-state memory per GPU (GiB = 2^30 bytes); "
                   "states/req is the mean number of Mamba states written per request "
                   "(requests.csv); hit and lost rates are shares of prompt tokens."))

    # points
    B.append(("h2", "Points"))
    head, rows, align = _points_table(sweep, front)
    B.append(("table", Table(head, rows, align)))
    csvs.append(_csv_points(sweep, folder, front))

    # pareto
    B.append(("h2", "Reuse-Pareto"))
    B.append(("img", "pareto.png", "Reuse-Pareto: token hit rate vs peak Mamba-state memory, "
                                   "and TTFT p50/p99 per point"))
    by_mem = sorted(pts, key=lambda p: (p.mamba_gib, -p.hit_pct, _natural_key(p.id)))
    prow = []
    crow = []
    for p in by_mem:
        dom = dominators(items, p.id) if p.id not in front else []
        crow.append([p.id, p.label, _f(p.mamba_gib, 4), str(int(p.m("mamba_state_bytes_peak"))),
                     _f(p.hit_pct, 4), _f(p.states_per_request, 4), _f(p.ttft("ttft_p50_s"), 6),
                     _f(p.ttft("ttft_p99_s"), 6), "true" if p.id in front else "false",
                     ";".join(dom)])
        if p.id in front:
            prow.append([p.id, p.label, _r(p.mamba_gib, ".2f"), _r(p.hit_pct, ".2f", " %"),
                         _r(p.states_per_request, ".2f"), _r(p.ttft("ttft_p50_s"), ".3f"),
                         _r(p.ttft("ttft_p99_s"), ".3f")])
    csvs.append(_write_csv(folder / "report_pareto.csv",
                           ["point", "label", "mamba_state_gib", "mamba_state_bytes_peak",
                            "token_hit_rate_pct", "states_per_request", "ttft_p50_s", "ttft_p99_s",
                            "on_frontier", "dominated_by"], crow))
    if prow:
        B.append(("p", f"Pareto frontier (maximum token hit rate, minimum Mamba memory), "
                       f"{len(prow)} of {len(pts)} plotted points, by memory:"))
        B.append(("table", Table(["id", "label", "Mamba GiB", "token hit", "states/req",
                                  "TTFT p50 (s)", "TTFT p99 (s)"], prow, "llrrrrr")))
        dominated = [p for p in by_mem if p.id not in front]
        if dominated:
            B.append(("p", "Dominated: " + "; ".join(
                f"{p.id} by {', '.join(dominators(items, p.id))}" for p in
                sorted(dominated, key=lambda p: _natural_key(p.id))) + "."))
    else:
        B.append(("p", "No successful points: no frontier."))

    # flag delta
    pairs = flag_pairs(sweep)
    if pairs is not None:
        flag, groups = pairs
        others = [a for a in sweep.axes if a != flag]
        B.append(("h2", f"Flag off vs on: {flag}"))
        B.append(("p", f"Each row pairs the point with `{_short_axis(flag)}=false` and the one "
                       f"with `{_short_axis(flag)}=true` at the same other-axis values; deltas "
                       f"are on minus off (relative to off). A positive hit delta means the flag "
                       f"reuses more; a positive TTFT or memory delta means it costs more."))
        drows, dcsv = [], []
        for g in groups:
            oth = [g.others[a] for a in others]
            ids = [g.off.id if g.off else "", g.on.id if g.on else ""]
            if not g.complete:
                why = ", ".join(f"{p.id} {p.status if not p.ok else 'not plotted'}"
                                for p in (g.off, g.on) if p is not None and not p.plotted)
                missing = [s for s, p in (("off", g.off), ("on", g.on)) if p is None]
                why = why or f"no {' / '.join(missing)} point"
                drows.append(oth + ids + [f"n/a ({why})"] + [""] * 3)
                dcsv.append(oth + ids + ["false"] + [""] * 16)
                continue
            a, b = g.off, g.on
            vals = {}
            for k, fa, fb in (("hit", a.hit_pct, b.hit_pct),
                              ("p50", a.ttft("ttft_p50_s"), b.ttft("ttft_p50_s")),
                              ("p99", a.ttft("ttft_p99_s"), b.ttft("ttft_p99_s")),
                              ("mem", a.mamba_gib, b.mamba_gib)):
                vals[k] = (fa, fb, fb - fa, _rel(fb, fa))
            h, t50, t99, mem = vals["hit"], vals["p50"], vals["p99"], vals["mem"]
            drows.append(oth + ids + [
                f"{h[0]:.2f} → {h[1]:.2f} %: {_signed(h[2], '.2f', ' pp')} "
                f"({_signed(h[3], '.1f', ' %')})",
                f"{_signed(t50[2], '.3f', ' s')} ({_signed(t50[3], '.1f', ' %')})",
                f"{_signed(t99[2], '.3f', ' s')} ({_signed(t99[3], '.1f', ' %')})",
                f"{_signed(mem[2], '.3f', ' GiB')} ({_signed(mem[3], '.1f', ' %')})"])
            dcsv.append(oth + ids + ["true"] + [
                _f(h[0], 4), _f(h[1], 4), _f(h[2], 4), _f(h[3], 4),
                _f(t50[0], 6), _f(t50[1], 6), _f(t50[2], 6), _f(t50[3], 4),
                _f(t99[0], 6), _f(t99[1], 6), _f(t99[2], 6), _f(t99[3], 4),
                _f(mem[0], 4), _f(mem[1], 4), _f(mem[2], 4), _f(mem[3], 4)])
        B.append(("table", Table([_short_axis(a) for a in others] + ["off", "on",
                                  "token hit off → on (Δ pp, rel.)", "TTFT p50 Δ (rel.)",
                                  "TTFT p99 Δ (rel.)", "Mamba memory Δ (rel.)"],
                                 drows, "l" * len(others) + "ll" + "rrrr")))
        csvs.append(_write_csv(
            folder / "report_flag_delta.csv",
            others + ["off_point", "on_point", "complete",
                      "token_hit_rate_off_pct", "token_hit_rate_on_pct", "token_hit_delta_pp",
                      "token_hit_delta_rel_pct",
                      "ttft_p50_off_s", "ttft_p50_on_s", "ttft_p50_delta_s", "ttft_p50_delta_rel_pct",
                      "ttft_p99_off_s", "ttft_p99_on_s", "ttft_p99_delta_s", "ttft_p99_delta_rel_pct",
                      "mamba_state_off_gib", "mamba_state_on_gib", "mamba_state_delta_gib",
                      "mamba_state_delta_rel_pct"], dcsv))
    elif len(sweep.boolean_axes) > 1:
        B.append(("p", f"No flag off/on section: {len(sweep.boolean_axes)} boolean axes "
                       f"({', '.join(sweep.boolean_axes)}); it needs exactly one."))

    # TTFT
    B.append(("h2", "Time to first token"))
    qrows, qcsv = [], []
    for p in pts:
        qrows.append([p.id, f"{len(p.requests):,}", _r(p.ttft("ttft_mean_s"), ".3f"),
                      _r(p.ttft("ttft_p50_s"), ".3f"), _r(p.ttft("ttft_p90_s"), ".3f"),
                      _r(p.ttft("ttft_p99_s"), ".3f")])
        qcsv.append([p.id, p.label, str(len(p.requests)), _f(p.ttft("ttft_mean_s"), 6),
                     _f(p.ttft("ttft_p50_s"), 6), _f(p.ttft("ttft_p90_s"), 6),
                     _f(p.ttft("ttft_p99_s"), 6)])
    csvs.append(_write_csv(folder / "report_ttft_quantiles.csv",
                           ["point", "label", "requests", "ttft_mean_s", "ttft_p50_s",
                            "ttft_p90_s", "ttft_p99_s"], qcsv))
    if qrows:
        B.append(("table", Table(["id", "requests", "mean (s)", "p50 (s)", "p90 (s)", "p99 (s)"],
                                 qrows, "lrrrrr")))
    B.append(("img", "ttft_cdf.png", "TTFT CDF per point"))
    B.append(("img", "ttft_vs_prompt.png", "median TTFT by prompt length per point"))

    # lost reuse
    B.append(("h2", "Lost reuse"))
    B.append(("p", "Tokens full attention held for a request but reconciliation with the Mamba "
                   "state dropped (requests.csv `lost_tokens`); requests with a loss only."))
    lrows, lcsv = [], []
    for p in pts:
        st = lost_reuse_stats(p)
        share = st["with_loss"] / st["requests"] * 100 if st["requests"] else math.nan
        lrows.append([p.id, f"{st['requests']:,}", f"{st['with_loss']:,}", _r(share, ".1f", " %"),
                      f"{int(st['total']):,}", _r(st["mean"], ",.0f"),
                      _r(p.m("lost_token_rate") * 100, ".2f", " %")])
        lcsv.append([p.id, p.label, str(st["requests"]), str(st["with_loss"]), _f(share, 4),
                     str(int(st["total"])), _f(st["mean"], 2), _f(p.m("lost_token_rate") * 100, 4)])
    csvs.append(_write_csv(folder / "report_lost_reuse.csv",
                           ["point", "label", "requests", "requests_with_loss",
                            "requests_with_loss_pct", "lost_tokens_total",
                            "lost_tokens_mean_per_affected_request", "lost_token_rate_pct"], lcsv))
    if lrows:
        B.append(("table", Table(["id", "requests", "with loss", "share", "lost tokens",
                                  "mean per affected", "of prompt tokens"], lrows, "lrrrrrr")))
    B.append(("img", "lost_reuse.png", "lost reuse per request"))

    # failed
    B.append(("h2", "Failed points"))
    if failed or unplotted:
        frows = [[p.id, p.label, p.status, p.error or "(no error given)"] for p in failed]
        frows += [[p.id, p.label, p.status, p.note] for p in unplotted]
        B.append(("p", "Left out of every figure and of the Pareto, TTFT and lost-reuse tables."))
        B.append(("table", Table(["id", "label", "status", "error"], frows, "llll")))
    else:
        B.append(("p", "None."))
    B.append(("p", "Numbers: `report_points.csv`, `report_pareto.csv`, "
                   "`report_ttft_quantiles.csv`, `report_lost_reuse.csv`"
                   + (", `report_flag_delta.csv`" if pairs is not None else "")
                   + "; figures also as SVG."))
    return B, csvs


def _md_cell(s: str) -> str:
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def render_md(blocks) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h1":
            out += [f"# {b[1]}", ""]
        elif kind == "h2":
            out += [f"## {b[1]}", ""]
        elif kind == "p":
            out += [b[1], ""]
        elif kind == "ul":
            out += [f"- {it}" for it in b[1]] + [""]
        elif kind == "img":
            out += [f"![{b[2]}]({b[1]})", ""]
        elif kind == "table":
            t: Table = b[1]
            sep = {"l": "---", "r": "---:", "c": ":---:"}
            out.append("| " + " | ".join(_md_cell(h) for h in t.head) + " |")
            out.append("|" + "|".join(sep[a] for a in t.align) + "|")
            for r in t.rows:
                out.append("| " + " | ".join(_md_cell(c) for c in r) + " |")
            out.append("")
    return "\n".join(out)


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1400px; padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; border-bottom: 2px solid #ddd; padding-bottom: .2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #eee; }
table { border-collapse: collapse; margin: .6em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ccc; padding: .25em .55em; }
th { background: #f3f3f3; }
tr:nth-child(even) td { background: #fafafa; }
td.r { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.c { text-align: center; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0 1.2em; }
code { background: #f3f3f3; padding: 0 .25em; border-radius: 3px; }
""".strip()


def _html_inline(s: str) -> str:
    """Escape, then render `code` spans as the Markdown does."""
    parts = html.escape(s, quote=False).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render_html(blocks, folder: Path) -> str:
    title = next((b[1] for b in blocks if b[0] == "h1"), "Sweep report")
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f"<title>{html.escape(title)}</title>", f"<style>\n{_CSS}\n</style>", "</head>",
           "<body>"]
    for b in blocks:
        kind = b[0]
        if kind in ("h1", "h2"):
            out.append(f"<{kind}>{_html_inline(b[1])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{_html_inline(b[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_html_inline(it)}</li>" for it in b[1]) + "</ul>")
        elif kind == "img":
            data = base64.b64encode((folder / b[1]).read_bytes()).decode("ascii")
            out.append(f'<img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">')
        elif kind == "table":
            t: Table = b[1]
            out.append("<table>")
            out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.head) + "</tr>")
            for r in t.rows:
                cells = []
                for a, c in zip(t.align, r):
                    cls = f' class="{a}"' if a in "rc" else ""
                    cells.append(f"<td{cls}>{html.escape(c)}</td>")
                out.append("<tr>" + "".join(cells) + "</tr>")
            out.append("</table>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- entry point


def write_sweep_report(sweep_dir: Path) -> list[Path]:
    """(Re)write the sweep report into ``sweep_dir``; returns the files written, sorted."""
    folder = Path(sweep_dir)
    sweep = load_sweep(folder)
    written: list[Path] = []
    stale = folder / "report_flag_delta.csv"
    with plt.rc_context(_RC):
        written += figure_pareto(sweep, folder)
        written += figure_ttft_cdf(sweep, folder)
        written += figure_ttft_vs_prompt(sweep, folder)
        written += figure_lost_reuse(sweep, folder)
    blocks, csvs = _build_blocks(sweep, folder)
    written += csvs
    if stale not in csvs and stale.exists():
        stale.unlink()  # from an earlier report of a different sweep in the same folder
    md = folder / "report.md"
    md.write_text(render_md(blocks), encoding="utf-8")
    hp = folder / "report.html"
    hp.write_text(render_html(blocks, folder), encoding="utf-8")
    written += [md, hp]
    return sorted(written)


def main(argv: list[str] | None = None) -> None:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m reports.sweep_report SWEEP_DIR", file=sys.stderr)
        raise SystemExit(2)
    for p in write_sweep_report(Path(args[0])):
        print(p)


if __name__ == "__main__":
    main()
