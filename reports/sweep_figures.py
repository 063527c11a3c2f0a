"""The per-point figures of a sweep: the TTFT CDF, TTFT by prompt length and lost reuse.

Points whose drawn data are identical (the same TTFT column, the same losses) are
drawn once and named together, and the caption says so: a curve hidden under another
is worse than no curve.  Up to ``MAX_LINES`` distinct curves share one panel, each
named by the axis values that tell it apart; beyond that the figure becomes small
multiples (each setting highlighted over the others in grey), and beyond
``MAX_PANELS`` an evenly spaced selection by TTFT p50 that the caption announces.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np

from reports import style
from reports.sweep_data import (
    Point,
    Sweep,
    group_ids,
    identical_groups,
    lost_reuse_stats,
    merge_note,
    natural_key,
)
from sim.rundir.stats import percentile

MAX_LINES = 6       # distinct series in one panel; more: small multiples
MAX_PANELS = 16     # small multiples; more: a selection
QS = (50, 90, 99)   # the percentile guides of the CDFs

CAPTIONS = {
    "ttft_cdf": "How long does a request wait for its first token under each setting?",
    "ttft_vs_prompt": "How does the wait for the first token grow with prompt length under "
                      "each setting?",
    "lost_reuse": "How much cached prefix does reconciliation with the Mamba state give up "
                  "per request, under each setting?",
}


def _caption(key: str, *notes: str) -> str:
    return " ".join([CAPTIONS[key], *[n for n in notes if n]])


def _names(sweep: Sweep, groups: list[list[Point]] | None = None) -> str:
    """The note under a figure that names settings by short axis names."""
    shown = None if groups is None else " ".join(sweep.group_label(g) for g in groups)
    return "; ".join(sweep.aliases(shown))


def _legend_text(sweep: Sweep, g: list[Point]) -> str:
    label = sweep.group_label(g)
    ids = f"({group_ids(g)})" if label != g[0].id else ""
    return "\n".join(textwrap.wrap(label, 40) + ([ids] if ids else []))


def _panel_title(sweep: Sweep, g: list[Point], extra: str = "") -> str:
    label = sweep.group_label(g)
    lines = textwrap.wrap(label, 46) if label != g[0].id else []
    return "\n".join(lines + [group_ids(g) + (f": {extra}" if extra else "")])


def _legend_outside(ax, title: str) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.06, 1.0), frameon=False, title=title,
                  fontsize=7.5, handlelength=2.2, borderaxespad=0.0, labelspacing=0.9)


def _select(groups: list[list[Point]]) -> tuple[list[list[Point]], str]:
    """At most MAX_PANELS groups, evenly spaced by TTFT p50 (best and worst included)."""
    if len(groups) <= MAX_PANELS:
        return groups, ""
    order = sorted(groups, key=lambda g: (g[0].ttft("ttft_p50_s"), natural_key(g[0].id)))
    idx = sorted({round(i * (len(order) - 1) / (MAX_PANELS - 1)) for i in range(MAX_PANELS)})
    chosen = sorted((order[i] for i in idx), key=lambda g: natural_key(g[0].id))
    return chosen, (f"{len(chosen)} of {len(groups)} settings shown, evenly spaced by TTFT "
                    f"p50 from best to worst; every point is in the tables.")


def _multiples(k: int, title: str, title_lines: int):
    """A grid of k panels sharing both axes; returns (fig, axes)."""
    ncols = 2 if k <= 4 else (3 if k <= 9 else 4)
    nrows = math.ceil(k / ncols)
    pw, ph = style.PANEL
    gap_w, gap_h = 0.35, 0.25 + 0.15 * title_lines
    top, bottom, left = 0.45 + 0.15 * title_lines, 0.55, 0.75
    W = left + ncols * pw + (ncols - 1) * gap_w + 0.2
    H = top + nrows * ph + (nrows - 1) * gap_h + bottom
    fig = style.figure(W, H)
    gs = fig.add_gridspec(nrows, ncols, left=left / W, right=1 - 0.2 / W, top=1 - top / H,
                          bottom=bottom / H, wspace=gap_w / pw, hspace=gap_h / ph)
    fig.suptitle(title, fontsize=11, y=1 - 0.06 / H, va="top")
    axes = []
    for i in range(k):
        ax = fig.add_subplot(gs[i // ncols, i % ncols], sharex=axes[0] if axes else None,
                             sharey=axes[0] if axes else None)
        ax.tick_params(labelbottom=i + ncols >= k, labelleft=i % ncols == 0)
        axes.append(ax)
    return fig, axes


def _cdf(v: np.ndarray):
    v = np.sort(v)
    v = v[v > 0]
    y = np.arange(1, len(v) + 1) / max(len(v), 1)
    return np.concatenate([v[:1], v]), np.concatenate([[0.0], y])


def _cdf_axes(ax, lo: float, hi: float, guides_right: bool) -> None:
    ax.set_xscale("log")
    if hi > lo:
        ax.set_xlim(lo / 1.15, hi * 1.15)
        style.log_axis(ax.xaxis, lo / 1.15, hi * 1.15)
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    for q in QS:
        ax.axhline(q / 100, color=style.NOTE, lw=0.6, ls=":")
    if guides_right:
        rx = ax.twinx()
        rx.set_ylim(ax.get_ylim())
        rx.set_yticks([q / 100 for q in QS])
        rx.set_yticklabels([f"p{q}" for q in QS], fontsize=7, color=style.NOTE)
        rx.tick_params(length=0)


def figure_ttft_cdf(sweep: Sweep, folder: Path) -> style.Saved:
    pts = sweep.plotted
    groups = identical_groups(pts, lambda p: np.sort(p.requests.ttft_s).tobytes())
    title = f"{sweep.name}: time to first token per setting (empirical CDF)"
    xlabel, ylabel = "time to first token (s, log scale)", "fraction of requests"
    if not pts:
        fig = style.figure(*style.SINGLE)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left")
        style.empty(ax, "no successful points")
        return style.save(fig, folder, "ttft_cdf", CAPTIONS["ttft_cdf"])
    curves = [_cdf(g[0].requests.ttft_s) for g in groups]
    drawn = [c for c in curves if len(c[0]) > 1]
    lo = min((float(c[0][0]) for c in drawn), default=1.0)
    hi = max((float(c[0][-1]) for c in drawn), default=1.0)
    merged = merge_note(groups)
    if len(groups) <= MAX_LINES:
        fig = style.figure(*style.SINGLE)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left")
        for i, (g, (x, y)) in enumerate(zip(groups, curves)):
            c, ls, _ = style.series_style(i, len(groups))
            if len(x) > 1:
                ax.plot(x, y, drawstyle="steps-post", color=c, ls=ls, lw=1.4,
                        label=_legend_text(sweep, g))
        _cdf_axes(ax, lo, hi, guides_right=True)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _legend_outside(ax, "setting (points)")
        return style.save(fig, folder, "ttft_cdf", _caption("ttft_cdf", merged),
                          note=_names(sweep, groups))
    shown, chosen = _select(groups)
    fig, axes = _multiples(len(shown), title, 3)
    for ax, g in zip(axes, shown):
        for x, y in curves:
            if len(x) > 1:
                ax.plot(x, y, drawstyle="steps-post", color=style.CONTEXT, lw=0.8, zorder=1)
        x, y = curves[groups.index(g)]
        if len(x) > 1:
            ax.plot(x, y, drawstyle="steps-post", color=style.HIT, lw=1.6, zorder=3)
        p50 = percentile(g[0].requests.ttft_s, 50)
        ax.set_title(_panel_title(sweep, g, f"p50 {p50:.3f} s"), loc="left", fontsize=7.5)
        _cdf_axes(ax, lo, hi, guides_right=False)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    return style.save(fig, folder, "ttft_cdf", _caption("ttft_cdf", merged, chosen,
                                                        "Grey: the other settings."),
                      note=_names(sweep, groups))


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
            out.append((percentile(pr[sel], 50), percentile(t[sel], 50), int(sel.sum())))
    return out


def figure_ttft_vs_prompt(sweep: Sweep, folder: Path) -> style.Saved:
    pts = sweep.plotted
    base = f"{sweep.name}: time to first token by prompt length"
    if not pts:
        fig = style.figure(*style.SINGLE)
        ax = fig.add_subplot()
        ax.set_title(base, loc="left")
        style.empty(ax, "no successful points")
        return style.save(fig, folder, "ttft_vs_prompt", CAPTIONS["ttft_vs_prompt"])
    groups = identical_groups(pts, lambda p: (p.requests.prompt_tokens.tobytes(),
                                              p.requests.ttft_s.tobytes()))
    edges = _prompt_bins(pts)
    # a bin's median needs 3 requests, unless no point has such a bin (tiny sweeps)
    min_count = 3 if any(binned_median_ttft(g[0], edges, 3) for g in groups) else 1
    how = (f"lines: median per log-spaced prompt bin (>= {min_count} "
           f"request{'s' if min_count > 1 else ''}); dots: requests")
    meds = [[m for m in binned_median_ttft(g[0], edges, min_count) if m[1] > 0] for g in groups]
    scatter = len(groups) <= 4
    ttfts = [t for m in meds for _, t, _ in m]
    dots = pts if scatter or len(groups) > MAX_LINES else []
    for p in dots:
        t = p.requests.ttft_s
        ttfts += [float(t[t > 0].min()), float(t[t > 0].max())] if (t > 0).any() else []
    ylo, yhi = (min(ttfts), max(ttfts)) if ttfts else (1.0, 1.0)

    def axes_units(ax):
        ax.set_xscale("log")
        ax.set_yscale("log")
        xl = (edges[0] / 1.1, edges[-1] * 1.1)
        ax.set_xlim(*xl)
        style.log_axis(ax.xaxis, *xl, tokens=True)
        if yhi > ylo:
            yl = (ylo / 1.25, yhi * 1.25)
            ax.set_ylim(*yl)
            style.log_axis(ax.yaxis, *yl)
        ax.grid(alpha=0.3)

    xlabel, ylabel = "prompt length (tokens, log scale)", "time to first token (s, log scale)"
    merged = merge_note(groups)
    if len(groups) <= MAX_LINES:
        fig = style.figure(*style.SINGLE)
        ax = fig.add_subplot()
        ax.set_title(f"{base}\n{how if scatter else how.split(';')[0]}", loc="left")
        for i, (g, med) in enumerate(zip(groups, meds)):
            c, ls, mk = style.series_style(i, len(groups))
            if scatter:
                ok = g[0].requests.ttft_s > 0
                ax.scatter(g[0].requests.prompt_tokens[ok], g[0].requests.ttft_s[ok], s=5,
                           color=c, alpha=0.2, linewidths=0, zorder=1)
            if med:
                ax.plot([m[0] for m in med], [m[1] for m in med], color=c, ls=ls, marker=mk,
                        markersize=3.5, lw=1.3, label=_legend_text(sweep, g), zorder=3)
        axes_units(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _legend_outside(ax, "setting (points)")
        return style.save(fig, folder, "ttft_vs_prompt", _caption("ttft_vs_prompt", merged),
                          note=_names(sweep, groups))
    shown, chosen = _select(groups)
    fig, axes = _multiples(len(shown), f"{base}\n{how}", 3)
    for ax, g in zip(axes, shown):
        for med in meds:
            if med:
                ax.plot([m[0] for m in med], [m[1] for m in med], color=style.CONTEXT, lw=0.8,
                        zorder=1)
        ok = g[0].requests.ttft_s > 0
        ax.scatter(g[0].requests.prompt_tokens[ok], g[0].requests.ttft_s[ok], s=4,
                   color=style.HIT, alpha=0.18, linewidths=0, zorder=2)
        med = meds[groups.index(g)]
        if med:
            ax.plot([m[0] for m in med], [m[1] for m in med], color=style.HIT, marker="o",
                    markersize=3, lw=1.5, zorder=3)
        ax.set_title(_panel_title(sweep, g), loc="left", fontsize=7.5)
        axes_units(ax)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    return style.save(fig, folder, "ttft_vs_prompt",
                      _caption("ttft_vs_prompt", merged, chosen, "Grey: the other settings' "
                               "medians."), note=_names(sweep, groups))


# --------------------------------------------------------------------------- lost reuse


def lost_bins(nzs: list[np.ndarray]):
    """Shared bins for the lost-reuse histograms: one per distinct value when there are at
    most 10 across the sweep (losses are usually whole blocks), else about 15 bins of a
round width.
    Returns (bin labels, per-series count arrays, edges or None when categorical)."""
    allnz = np.concatenate(nzs) if nzs else np.zeros(0)
    distinct = np.unique(allnz)
    if len(distinct) == 0:
        return [], [np.zeros(0, dtype=int) for _ in nzs], None
    if len(distinct) <= 10:
        counts = [np.array([int((nz == v).sum()) for v in distinct]) for nz in nzs]
        return [f"{int(v):,}" for v in distinct], counts, None
    width = style.nice_step(float(distinct[-1]) / 15)
    edges = np.arange(0.0, float(distinct[-1]) + width, width)
    if edges[-1] <= distinct[-1]:
        edges = np.append(edges, edges[-1] + width)
    counts = [np.histogram(nz, bins=edges)[0].astype(int) for nz in nzs]
    labels = [f"{int(a):,}–{int(b):,}" for a, b in zip(edges[:-1], edges[1:])]
    return labels, counts, edges


def _lost(p: Point) -> np.ndarray:
    return p.requests.lost_tokens[p.requests.lost_tokens > 0]


def figure_lost_reuse(sweep: Sweep, folder: Path) -> style.Saved:
    """Histogram of lost tokens per request on shared bins: small multiples (one per
    distinct setting) up to 8 points, beyond that one row per point (a heat map with the
    counts written in)."""
    pts = sweep.plotted
    title = f"{sweep.name}: lost reuse per request (requests with a loss only)"
    if len(pts) > 8:
        return _lost_matrix(sweep, pts, title, folder)
    groups = identical_groups(pts, lambda p: np.sort(_lost(p)).tobytes())
    labels, counts, edges = lost_bins([_lost(g[0]) for g in groups])
    k = max(len(groups), 1)
    fig, axes = _multiples(k, "\n".join(textwrap.wrap(title, 95)), 3)
    if not pts:
        style.empty(axes[0], "no successful points")
        return style.save(fig, folder, "lost_reuse", CAPTIONS["lost_reuse"])
    for ax, g, c in zip(axes, groups, counts):
        st = lost_reuse_stats(g[0])
        if edges is None and labels:
            x = np.arange(len(labels))
            ax.bar(x, c, color=style.LOSS, width=0.55)
            ax.set_xticks(x)
            rot = len(labels) > 4
            ax.set_xticklabels(labels, rotation=35 if rot else 0, ha="right" if rot else "center",
                               fontsize=7 if rot else 8)
            ax.set_xlim(-0.6, len(labels) - 0.4)
        elif edges is not None:
            ax.bar(edges[:-1], c, width=np.diff(edges), align="edge", color=style.LOSS,
                   edgecolor="white", linewidth=0.5)
            ax.set_xlim(0, edges[-1])
            style.token_axis(ax.xaxis)
        if not st["with_loss"]:
            ax.text(0.5, 0.5, "no request lost reuse", ha="center", va="center",
                    transform=ax.transAxes, color=style.NOTE, fontsize=8)
        ax.set_title(_panel_title(sweep, g, f"{st['with_loss']:,} of {st['requests']:,} "
                                            f"requests, {int(st['total']):,} tokens"),
                     loc="left", fontsize=7.5)
        ax.grid(alpha=0.3, axis="y")
        ax.set_ylim(0, max(1, max(int(cc.max()) if len(cc) else 1 for cc in counts)) * 1.08)
        style.integer_axis(ax.yaxis)
    fig.supxlabel("lost reuse per request (tokens" + ("" if edges is None else
                                                       f", bins of {edges[1]:,.0f}") + ")",
                  fontsize=9)
    fig.supylabel("requests", fontsize=9)
    return style.save(fig, folder, "lost_reuse",
                      _caption("lost_reuse", merge_note(groups, "histograms")),
                      note=_names(sweep, groups))


def _lost_matrix(sweep: Sweep, pts: list[Point], title: str, folder: Path) -> style.Saved:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm
    from matplotlib.transforms import offset_copy

    labels, counts, edges = lost_bins([_lost(p) for p in pts])
    stats = [lost_reuse_stats(p) for p in pts]
    head, rows = sweep.value_table(pts)
    n, m = len(pts), max(len(labels), 1)
    left = 0.3 + 0.062 * max(len(r) for r in [head, *rows])     # the key as tick labels
    right = 2.4
    W = left + 0.75 * m + right
    H = 0.26 * n + 2.2
    fig = style.figure(W, H)
    ax = fig.add_axes((left / W, 1.25 / H, 0.75 * m / W, (H - 2.2) / H))
    fig.suptitle("\n".join(textwrap.wrap(title, int(W / 0.075))) +
                 "\ncells: requests per bin (darker = more)", fontsize=9.5, x=0.02, ha="left",
                 y=1 - 0.05 / H, va="top")
    mat = np.array([c if len(c) else np.zeros(m, dtype=int) for c in counts], dtype=float)
    shown = np.where(mat > 0, mat, np.nan)
    vmax = max(float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0, 1.0)
    norm = LogNorm(vmin=0.7, vmax=vmax * 1.6)
    cmap = colormaps["Reds"]
    ax.imshow(shown, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest")
    for i in range(n):
        for j in range(m):
            if mat[i, j] > 0:
                r, g, b, _ = cmap(norm(mat[i, j]))
                dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
                ax.text(j, i, f"{int(mat[i, j]):,}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")
    ax.set_xticks(np.arange(m))
    rot = len(labels) > 4 or edges is not None
    ax.set_xticklabels(labels or ["(none)"], rotation=35 if rot else 0,
                       ha="right" if rot else "center", fontsize=7.5)
    ax.set_yticks(np.arange(n))
    ax.set_yticklabels(rows, family="monospace", fontsize=7.5)
    # the key's header over the tick labels (which sit tick length + pad = 7 pt left)
    at = offset_copy(ax.transAxes, fig=fig, x=-7, y=2, units="points")
    ax.text(0, 1.0, head, transform=at, ha="right", va="bottom",
            family="monospace", fontsize=7.5, fontweight="bold")
    ax.set_xlabel("lost reuse per request (tokens)")
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
    rx.set_ylabel("requests with a loss, tokens lost")
    return style.save(fig, folder, "lost_reuse", CAPTIONS["lost_reuse"],
                      note=_names(sweep))
