"""The per-run report: ``report.md`` with a TTFT CDF and a hit-length histogram.

Figures are drawn with matplotlib's Agg backend with fixed metadata so the same
run writes the same bytes.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_PNG_META = {"Software": None}


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=_PNG_META)
    plt.close(fig)


def ttft_cdf(rows, path: Path, title: str) -> None:
    vals = sorted(r.ttft_s for r in rows)
    n = len(vals)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if n:
        ax.plot(vals, [(i + 1) / n for i in range(n)], drawstyle="steps-post", color="#1f77b4")
        for q, ls in ((0.5, ":"), (0.9, "--"), (0.99, "-.")):
            v = vals[min(int(q * (n - 1) + 0.5), n - 1)]
            ax.axvline(v, color="grey", ls=ls, lw=0.8, label=f"p{int(q * 100)} = {v:.3f} s")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def hit_histogram(rows, path: Path, title: str, block: int) -> None:
    """Left: reconciled hit per request (one bin per attention/Mamba block).
    Right: tokens full attention held but reconciliation gave up."""
    hits = [r.hit_tokens for r in rows]
    lost = [r.lost_tokens for r in rows]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10.5, 3.8))
    top = max(max(hits, default=0), 1)
    edges = list(range(0, top + 2 * block, block))
    ax.hist(hits, bins=edges, color="#1f77b4", edgecolor="white")
    ax.set_xlabel(f"reused prefix per request (tokens; bins of one {block}-token block)")
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3)
    ax.set_title("reconciled hit", fontsize=10)
    nz = [v for v in lost if v > 0]
    distinct = sorted(set(nz))
    if 0 < len(distinct) <= 12:
        # few distinct losses (typically whole blocks minus a unit): one bar each
        counts = [nz.count(v) for v in distinct]
        bx.bar([f"{v:,}" for v in distinct], counts, color="#d62728")
    elif nz:
        bx.hist(nz, bins=40, color="#d62728", edgecolor="white")
    bx.set_xlabel("lost reuse per request (tokens, requests with loss only)")
    bx.set_ylabel("requests")
    bx.grid(alpha=0.3)
    bx.set_title(f"lost to reconciliation: {len(nz):,} of {len(lost):,} requests", fontsize=10)
    fig.suptitle(title, fontsize=11)
    _save(fig, path)


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def read_rows(folder: Path) -> list:
    """The served requests of ``requests.csv`` (``sim.records.RequestRecord``, by column
    name); those refused on arrival have no measurements (see summary.json)."""
    from sim.records import read_request_records

    return [r for r in read_request_records(Path(folder) / "requests.csv") if not r.rejected]


def _rejected(s: dict) -> str:
    """Requests refused on arrival (a prompt of max_model_len tokens or more, or a
    request the pool can never hold), when there were any; run folders written before
    the field existed have none."""
    n = s.get("rejected_requests", 0)
    return f" served, {n:,} rejected (requests.csv `rejected`)" if n else ""


# what the report reads from summary.json (numbers) and run.json (present)
SUMMARY_NUMBERS = ("requests", "hash_block_size", "num_gpu_blocks", "token_hit_rate", "hit_tokens",
                   "prompt_tokens", "request_hit_rate", "lost_token_rate", "lost_tokens",
                   "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions",
                   "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s")
RUN_KEYS = ("name", "description", "model", "block_size", "policy", "retention",
            "shared_prefix_checkpoint", "lookahead_hashes", "speculative", "gpu", "workload")


def load_run_folder(folder: Path) -> tuple[dict, dict, list]:
    """summary.json, run.json and requests.csv of a run folder, checked before anything is
    drawn: a corrupt or foreign file is one ``InputError`` naming it."""
    import csv
    import math

    from sim.config.errors import InputError
    from sim.config.loader import load_file

    folder = Path(folder)
    s = load_file(folder / "summary.json", fmt="json")
    h = load_file(folder / "run.json", fmt="json")
    for path, data in ((folder / "summary.json", s), (folder / "run.json", h)):
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a JSON object (as sim run writes it)")
    for k in SUMMARY_NUMBERS:
        v = s.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"{folder / 'summary.json'}: {k}: "
                             f"{'missing' if k not in s else f'expected a finite number, got {v!r}'}")
    for k in RUN_KEYS:
        if k not in h:
            raise InputError(f"{folder / 'run.json'}: {k}: missing")
    if isinstance(h["block_size"], bool) or not isinstance(h["block_size"], int) \
            or h["block_size"] < 1:
        raise InputError(f"{folder / 'run.json'}: block_size: expected an integer >= 1, "
                         f"got {h['block_size']!r}")
    req = folder / "requests.csv"
    try:
        rows = read_rows(folder)
    except OSError as e:
        raise InputError(f"{req}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{req}: not UTF-8 text") from None
    except (ValueError, IndexError, StopIteration, TypeError, csv.Error) as e:
        raise InputError(f"{req}: not a run's requests table "
                         f"({type(e).__name__}: {str(e) or 'empty file'})") from None
    for r in rows:
        # the figures read hit_tokens, lost_tokens and ttft_s
        if not all(isinstance(v, (int, float)) and math.isfinite(v)
                   for v in (r.hit_tokens, r.lost_tokens, r.ttft_s)):
            raise InputError(f"{req}: request {r.request_id}: not a row of sim run's "
                             f"requests table")
    return s, h, rows


def write_report(folder: Path) -> None:
    """Rebuild report.md and its figures from a run folder (requests.csv,
    summary.json, run.json)."""
    folder = Path(folder)
    s, h, rows = load_run_folder(folder)
    name = h["name"]
    ttft_cdf(rows, folder / "ttft_cdf.png", f"{name}: TTFT CDF ({s['requests']:,} requests)")
    hit_histogram(rows, folder / "hit_hist.png", f"{name}: prefix hit per request", h["block_size"])
    lines = [
        f"# Run report: {name}",
        "",
        h["description"] or "",
        "",
        "| | |",
        "|---|---|",
        f"| model | {h['model']} (block {h['block_size']} tokens, hash unit {s['hash_block_size']}) |",
        f"| cache policy | {h['policy']}: retention {h['retention']}, shared-prefix checkpoint "
        f"{'on' if h['shared_prefix_checkpoint'] else 'off'}, lookahead hashes "
        f"{'on' if h['lookahead_hashes'] else 'off'} |",
        f"| speculative | {h['speculative']} |",
        f"| GPU | {h['gpu']}, {s['num_gpu_blocks']:,} pool blocks |",
        f"| workload | {h['workload']} |",
        "",
        "## Reuse",
        "",
        "| metric | value |",
        "|---|---|",
        f"| requests | {s['requests']:,}{_rejected(s)} |",
        f"| token hit rate | {s['token_hit_rate']:.2%} ({s['hit_tokens']:,} of {s['prompt_tokens']:,}) |",
        f"| request hit rate | {s['request_hit_rate']:.2%} |",
        f"| lost to reconciliation | {s['lost_token_rate']:.2%} of prompt tokens ({s['lost_tokens']:,}) |",
        f"| Mamba state memory, peak | {_gib(s['mamba_state_bytes_peak'])} |",
        f"| attention KV memory, peak | {_gib(s['kv_bytes_peak'])} |",
        f"| evicted cache keys | {s['evictions']:,} |",
        f"| preemptions | {s['preemptions']:,} |",
        "",
        "## Latency",
        "",
        "| TTFT mean | p50 | p90 | p99 | output tok/s |",
        "|---|---|---|---|---|",
        f"| {s['ttft_mean_s']:.3f} s | {s['ttft_p50_s']:.3f} s | {s['ttft_p90_s']:.3f} s | "
        f"{s['ttft_p99_s']:.3f} s | {s['throughput_tok_s']:,.0f} |",
        "",
        "![TTFT CDF](ttft_cdf.png)",
        "",
        "![hit histogram](hit_hist.png)",
        "",
        "Per-request values: `requests.csv`; every figure above: `summary.json`.",
        "",
    ]
    (folder / "report.md").write_text("\n".join(lines))
