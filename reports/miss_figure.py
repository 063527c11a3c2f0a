"""Why requests missed: the run report's waterfall and the sweep reports' stacked bars.

Miss attribution (``sim/cache/attribution.py``) splits every prompt into ``hit`` and five
miss classes.  The waterfall starts from what an unlimited attention-only cache would
reuse (every prompt token but the compulsory ones), takes away one class per bar, and
ends at what this run reused (the hit).  Reads ``summary.json`` (``miss_*``) and, for
the capacity misses' evicting requests, ``requests.csv``; a run folder written before
attribution existed, or with ``attribution: false``, gets no section.
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from reports import style

# the classes between the unlimited cache's reuse and the hit, in waterfall order, with
# what each bar means and its colour (one meaning each, here and in the sweep bars)
STEPS = (
    ("in_flight", "in flight", "an admitted request had yet to compute it", "#9467bd"),
    ("capacity", "capacity", "cached, then evicted", "#d62728"),
    ("checkpoint", "no state (checkpoint)", "full attention held it, no usable Mamba state",
     "#ff7f0e"),
    ("speculative", "speculative", "lost to the EAGLE drop", "#bcbd22"),
)
COMPULSORY = ("compulsory", "compulsory", "never computed before", "#c8c8c8")
# a fleet with hindsight: what another replica held in every group at the arrival
ROUTED_AWAY = ("routed_away", "routed away", "another replica held it in every group",
               "#17becf")


def steps_of(s: dict) -> tuple:
    """The waterfall's classes for this run (a fleet with hindsight: routed away first)."""
    return ((ROUTED_AWAY, *STEPS) if style.finite(s.get("miss_routed_away_tokens"))
            else STEPS)
CAPTION = ("Why did requests miss? From what an unlimited attention-only cache would reuse "
           "(every prompt token computed before) to what this run reused: each bar takes "
           "away one miss class (tokens over all served requests).")
TOP_EVICTORS = 5


def has_attribution(s: dict) -> bool:
    return all(style.finite(s.get(f"miss_{c}_tokens")) for c, *_ in (*STEPS, COMPULSORY))


def waterfall_frame():
    """The waterfall before its data: (figure, axes)."""
    fig = style.figure(7.6, 4.2)
    with style.fixed_titles():
        return fig, fig.add_subplot()


def waterfall(s: dict, folder: Path, title: str, frame=None) -> style.Saved:
    """``miss_waterfall.png``: reusable -> minus each class -> hit; ``frame``: its
    ``waterfall_frame``, built ahead (else built here)."""
    reusable = s["prompt_tokens"] - s["miss_compulsory_tokens"]
    fig, ax = frame or waterfall_frame()
    labels = ["unlimited\nattention-only\ncache"]
    # the bars (one ``bar`` call: each call builds a container of its own) and the
    # number over each
    heights, bottoms, colours = [reusable], [0], [style.CONTEXT]
    ax.text(0, reusable, style.tokens_text(reusable), ha="center", va="bottom", fontsize=8)
    level = reusable
    steps = steps_of(s)
    for i, (key, name, _, colour) in enumerate(steps, start=1):
        v = s[f"miss_{key}_tokens"]
        heights.append(-v)
        bottoms.append(level)
        colours.append(colour)
        ax.text(i, level, f"-{style.tokens_text(v)}" if v else "0", ha="center", va="bottom",
                fontsize=8)
        level -= v
        labels.append(name)
    n = len(steps) + 1
    heights.append(s["hit_tokens"])
    bottoms.append(0)
    colours.append(style.HIT)
    ax.bar(range(n + 1), heights, bottom=bottoms, color=colours, width=0.62)
    ax.text(n, s["hit_tokens"], style.tokens_text(s["hit_tokens"]), ha="center", va="bottom",
            fontsize=8)
    labels.append("this run\nreused (hit)")
    ax.set_xticks(range(n + 1))
    ax.set_xticklabels(labels)
    ax.set_ylabel("prompt tokens")
    style.token_axis(ax.yaxis)
    ax.set_ylim(0, max(reusable, 1) * 1.12)
    ax.grid(alpha=0.3, axis="y")
    prompt = s["prompt_tokens"]
    ax.set_title(f"{title}\n{style.tokens_text(s['miss_compulsory_tokens'])} of "
                 f"{style.tokens_text(prompt)} prompt tokens were never computed before "
                 f"(compulsory, not drawn)", fontsize=9.5, loc="left")
    return style.save(fig, folder, "miss_waterfall", CAPTION, svg=False)


def top_evictors(rows) -> list[tuple[str, int, int]]:
    """(evicting request, capacity tokens its evictions cost, requests hit), most first."""
    tokens: Counter = Counter()
    victims: Counter = Counter()
    for r in rows:
        by = getattr(r, "capacity_evicted_by", "")
        if by and isinstance(r.capacity_tokens, int):
            tokens[by] += r.capacity_tokens
            victims[by] += 1
    return [(by, t, victims[by]) for by, t in
            sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_EVICTORS]]


def miss_markdown(folder: Path, s: dict, rows, name: str, draw: bool = True) -> list[str]:
    """The report's "Why requests missed" section (empty without attribution); ``draw``:
    also draw its figure (else it is drawn elsewhere: ``reports/run_report.py`` draw)."""
    if not has_attribution(s):
        return []
    if draw:
        with style.rc():
            waterfall(s, folder, f"{name}: why requests missed")
    prompt = s["prompt_tokens"]

    def share(v):
        return f"{v / prompt:.2%}" if prompt else "n/a"

    lines = ["## Why requests missed", "",
             "| class | tokens | share of prompt tokens | meaning |", "|---|---:|---:|---|",
             f"| hit | {s['hit_tokens']:,} | {share(s['hit_tokens'])} | reused |"]
    for key, label, meaning, _ in (*reversed(steps_of(s)), COMPULSORY):
        v = s[f"miss_{key}_tokens"]
        lines.append(f"| {label} | {v:,} | {share(v)} | {meaning} |")
    lines += ["",
              f"An unlimited attention-only cache would reuse {share(s['reusable_tokens'])} of "
              f"the prompt tokens; this run reused {share(s['hit_tokens'])}. Per request: "
              f"`requests.csv` (`*_tokens`, `checkpoint_reason`, `capacity_evicted_by`).", ""]
    reasons = Counter(r.checkpoint_reason for r in rows
                      if getattr(r, "checkpoint_reason", "") and r.checkpoint_tokens)
    if reasons:
        lines += ["Checkpoint misses by reason (requests): " + ", ".join(
            f"{k} {v:,}" for k, v in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
            + ".", ""]
    top = top_evictors(rows)
    if top:
        lines += ["Requests whose allocations evicted the most reuse (capacity misses):", "",
                  "| evicting request | capacity tokens lost | requests that missed |",
                  "|---|---:|---:|"]
        lines += [f"| {by} | {t:,} | {n:,} |" for by, t, n in top]
        lines.append("")
    lines += [f"![{CAPTION}](miss_waterfall.png)", ""]
    return lines


# ------------------------------------------------------------------- sweep reports --

def zoom_start(least_hit: float) -> float:
    """Where the sweep bars' share axis starts: 0, or where every point hits at least
    a quarter of its prompt tokens, a round 0.05 a little below the least hit share, so
    that the miss classes (what tells the points apart) fill the figure instead of its
    last quarter."""
    if not least_hit >= 0.25:
        return 0.0
    return max(0.0, math.floor((least_hit - 0.03) * 20) / 20)


def sweep_bars(points: list[tuple[str, dict]], folder: Path, title: str,
               stem: str = "miss_classes", head: str | None = None) -> style.Saved | None:
    """``miss_classes.png``: one stacked bar per sweep point (its label, its summary),
    hit then each miss class as a share of the prompt tokens; None when no point has
    attribution.  ``head``: the labels are the rows of a monospace key (point id and the
    varying axes' values, ``Sweep.value_table``) and this its header, drawn above them.
    Where every point hits much of its prompt the axis starts near the least hit share
    (``zoom_start``, said in the axis label), each hit share written on its bar."""
    pts = [(label, s) for label, s in points if has_attribution(s) and s.get("prompt_tokens")]
    if not pts:
        return None
    away = [ROUTED_AWAY] if any(style.finite(s.get("miss_routed_away_tokens"))
                                for _, s in pts) else []
    classes = [("hit", "hit", "", style.HIT), *reversed(STEPS), *away, COMPULSORY]
    hits = [(s.get("hit_tokens") or 0) / s["prompt_tokens"] for _, s in pts]
    lo = zoom_start(min(hits))
    with style.rc():
        fig = style.figure(8.0, 1.4 + 0.3 * len(pts) + (0.2 if head else 0.0))
        ax = fig.add_subplot()
        y = list(range(len(pts)))
        left = [0.0] * len(pts)
        for key, label, _, colour in classes:
            field = "hit_tokens" if key == "hit" else f"miss_{key}_tokens"
            vals = [(s.get(field) or 0) / s["prompt_tokens"] for _, s in pts]
            ax.barh(y, vals, left=left, color=colour, height=0.7, label=label)
            left = [b + v for b, v in zip(left, vals)]
        for yi, h in zip(y, hits):
            inside = h - lo >= 0.07 * (1.0 - lo)
            ax.text(lo + 0.006 * (1.0 - lo), yi, f"{h:.1%}", ha="left", va="center",
                    fontsize=7, color="white" if inside else "black", zorder=5)
        ax.set_yticks(y)
        mono = {"family": "monospace"} if head else {}
        ax.set_yticklabels([label for label, _ in pts], fontsize=7.5, **mono)
        ax.invert_yaxis()                      # the first point on top
        if head:
            # the key's header over its rows (the tick labels, right-aligned as they are)
            tick = ax.yaxis.get_major_ticks()[0]
            ax.annotate(head, (0.0, 1.0), xycoords="axes fraction",
                        xytext=(-(tick.get_pad() + tick.get_tick_padding()), 3),
                        textcoords="offset points", ha="right", va="bottom", fontsize=7.5,
                        fontweight="bold", **mono)
        ax.set_xlabel("share of prompt tokens" if lo == 0 else
                      f"share of prompt tokens (the axis starts at {lo:.2f}: every point "
                      f"hits at least {min(hits):.1%})")
        ax.set_xlim(lo, 1.0)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5)
        ax.set_title(title, fontsize=10, loc="left", pad=16 if head else 6)
        return style.save(fig, folder, stem,
                          "Why did each sweep point miss? Per point, its prompt tokens split "
                          "into hit and the miss classes (shares add up to 1).")
