"""A fleet's replicas side by side: the run report's per-replica panel.

Reads ``summary.json``'s ``per_replica`` (``sim/cluster/outputs.py``) alone: requests routed
to each replica (its load), each replica's token hit rate, and its TTFT p50 and p99; a run
folder without a fleet gets no section.
"""
from __future__ import annotations

from pathlib import Path

from reports import style

CAPTION = ("Where did the router send the requests, and what did each replica reuse and "
           "how fast did it answer? One bar per replica.")


def has_fleet(s: dict) -> bool:
    return bool(s.get("per_replica"))


def replicas_frame():
    """The panel before its data: (figure, (load, hit rate, TTFT) axes)."""
    fig = style.figure(9.0, 3.0)
    with style.fixed_titles():
        return fig, tuple(fig.subplots(1, 3))


def replicas_figure(s: dict, folder: Path, title: str, frame=None) -> style.Saved:
    """``replicas.png``: per replica, requests served (and refused), token hit rate, and
    TTFT p50 / p99; ``frame``: its ``replicas_frame``, built ahead (else built here)."""
    per = s["per_replica"]
    x = [p["replica"] for p in per]
    fig, (ax, bx, cx) = frame or replicas_frame()
    served = [p["requests"] for p in per]
    refused = [p["rejected_requests"] for p in per]
    ax.bar(x, served, color=style.HIT, width=0.7, label="served")
    if any(refused):
        ax.bar(x, refused, bottom=served, color=style.LOSS, width=0.7, label="refused")
        ax.legend(fontsize=7)
    ax.set_title(f"requests (imbalance {s.get('imbalance_requests', 0):.2f}x)", fontsize=9)
    bx.bar(x, [100 * p["token_hit_rate"] for p in per], color=style.HIT, width=0.7)
    bx.axhline(100 * s["token_hit_rate"], color=style.NOTE, ls="--", lw=0.8,
               label=f"fleet {s['token_hit_rate']:.1%}")
    bx.legend(fontsize=7)
    bx.set_title("token hit rate (%)", fontsize=9)
    w = 0.38
    cx.bar([i - w / 2 for i in x], [p["ttft_p50_s"] for p in per], width=w, color=style.HIT,
           label="p50")
    cx.bar([i + w / 2 for i in x], [p["ttft_p99_s"] for p in per], width=w, color=style.P99,
           label="p99")
    cx.legend(fontsize=7)
    cx.set_title("TTFT (s)", fontsize=9)
    for a in (ax, bx, cx):
        a.set_xlabel("replica")
        a.set_xticks(x if len(x) <= 16 else x[::max(1, len(x) // 16)])
        a.grid(alpha=0.3, axis="y")
    style.integer_axis(ax.yaxis)
    fig.suptitle(title, fontsize=10, y=1.04)
    return style.save(fig, folder, "replicas", CAPTION, svg=False)


ROUTED_CAPTION = ("What did the router believe the replica it chose would reuse, and what "
                  "did the request reuse there? One point per request (jittered); above the "
                  "diagonal the router over-promised.")


def read_routed(folder: Path) -> tuple[list[int], list[int]] | None:
    """(believed, reused) hit tokens of every served request of a fleet run folder whose
    router predicts (requests.csv ``routed_hit_tokens``), else None."""
    import csv

    path = Path(folder) / "requests.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        rd = csv.DictReader(f)
        if "routed_hit_tokens" not in (rd.fieldnames or ()):
            return None
        got = [(int(r["routed_hit_tokens"]), int(r["hit_tokens"])) for r in rd
               if not r["rejected"] and r["routed_hit_tokens"] != ""]
    return [b for b, _ in got], [h for _, h in got]


def routed_figure(believed: list[int], reused: list[int], folder: Path, title: str):
    """``routed_hits.png``: believed against reused hit tokens, one point a request."""
    import numpy as np

    fig = style.figure(5.6, 4.4)
    ax = fig.add_subplot()
    b = np.asarray(believed, dtype=float)
    r = np.asarray(reused, dtype=float)
    top = max(float(b.max(initial=0)), float(r.max(initial=0)), 1.0) * 1.05
    rng = np.random.default_rng(0)
    j = top * 0.006
    over = b > r
    ax.scatter(r[~over] + rng.uniform(-j, j, (~over).sum()),
               b[~over] + rng.uniform(-j, j, (~over).sum()), s=6, alpha=0.4, color=style.HIT,
               label=f"as believed or better ({(~over).sum():,})")
    ax.scatter(r[over] + rng.uniform(-j, j, over.sum()), b[over] + rng.uniform(-j, j, over.sum()),
               s=6, alpha=0.5, color=style.LOSS, label=f"over-promised ({over.sum():,})")
    ax.plot([0, top], [0, top], color=style.NOTE, lw=0.8, ls="--")
    ax.set_xlim(-top * 0.02, top)
    ax.set_ylim(-top * 0.02, top)
    ax.set_xlabel("reused at admission (tokens)")
    ax.set_ylabel("believed by the router (tokens)")
    style.token_axis(ax.xaxis)
    style.token_axis(ax.yaxis)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=10)
    return style.save(fig, folder, "routed_hits", ROUTED_CAPTION, svg=False)


def fleet_markdown(folder: Path, s: dict, h: dict, draw: bool = True) -> list[str]:
    """The report's fleet section (none without a fleet)."""
    if not has_fleet(s):
        return []
    if draw:
        with style.rc():
            replicas_figure(s, folder, f"{h['name']}: {s['replicas']} replicas behind "
                                       f"{s['router']}")
    out = ["## Fleet", "",
           f"{s['replicas']} replicas behind the `{s['router']}` router; imbalance (max / "
           f"mean) {s['imbalance_requests']:.2f}x in requests, "
           f"{s['imbalance_prompt_tokens']:.2f}x in prompt tokens. Per replica: "
           f"`replicas.csv`.", "",
           f"![{CAPTION}](replicas.png)", ""]
    if "over_predicted_share" in s:
        out += [f"The router over-promised on {s['over_predicted_share']:.1%} of requests "
                f"(by {s['mean_over_prediction_tokens']:,.0f} tokens on average there) and "
                f"under-promised on {s['under_predicted_share']:.1%}.", ""]
        routed = read_routed(folder)
        if routed is not None and draw:
            with style.rc():
                routed_figure(*routed, folder, f"{h['name']}: {s['router']}, believed vs "
                                               f"reused")
        if routed is not None:
            out += [f"![{ROUTED_CAPTION}](routed_hits.png)", ""]
    if "regret_tokens" in s:
        out += [f"In hindsight (every replica asked at each arrival) the best replicas held "
                f"{s['best_token_hit_rate']:.2%} of the prompt tokens against "
                f"{s['token_hit_rate']:.2%} reused: regret {s['regret_token_rate']:.2%}; "
                f"{s['routed_away_token_rate']:.2%} missed although another replica held them "
                f"in every group (requests.csv `routed_away_tokens`).", ""]
    return out
