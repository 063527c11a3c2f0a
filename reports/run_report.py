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
    vals = sorted(r[11] for r in rows)
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
    hits = [r[5] for r in rows]
    lost = [r[7] for r in rows]
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


def header_from_scenario(sc, dep) -> dict:
    """What the report says about the deployment; stored as ``run.json`` in the run
    folder so ``sim report`` can rebuild the report from the folder alone."""
    from workloads import describe

    return {
        "name": sc.name, "description": sc.description.strip(), "model": sc.model.name,
        "block_size": dep.layout.block_size, "policy": sc.cache.policy,
        "retention": sc.cache.prefix_cache_retention_interval,
        "shared_prefix_checkpoint": sc.cache.enable_mamba_shared_prefix_checkpoint,
        "lookahead_hashes": not sc.cache.disable_lookahead_block_hashes,
        "speculative": f"{sc.speculative.method or 'none'} k={sc.speculative.num_speculative_tokens}, "
                       f"mean accepted {sc.speculative.mean_accepted_tokens}",
        "gpu": f"{sc.gpu.count} x {sc.gpu.type}",
        "workload": describe(sc.workload),
    }


def read_rows(folder: Path) -> list[tuple]:
    """requests.csv back into the engine's row tuples (index first)."""
    import csv

    rows = []
    with open(Path(folder) / "requests.csv", newline="") as f:
        rd = csv.reader(f)
        header = next(rd)
        ints = {"prompt_tokens", "hit_tokens", "attention_hit_tokens", "lost_tokens", "junction",
                "recomputed_tokens", "output_tokens", "preemptions", "mamba_states_written"}
        refused = header.index("rejected") if "rejected" in header else -1
        for i, rec in enumerate(rd):
            if refused >= 0 and rec[refused]:
                continue        # refused on arrival: no measurements (see summary.json)
            vals = []
            for name, v in zip(header, rec):
                if name == "rejected":
                    continue
                if name in ("request_id", "session"):
                    vals.append(v)
                elif name in ints:
                    vals.append(int(v))
                else:
                    vals.append(float(v))
            rows.append((i, *vals))
    return rows


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


def load_run_folder(folder: Path) -> tuple[dict, dict, list[tuple]]:
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
    except (ValueError, IndexError, StopIteration, csv.Error) as e:
        raise InputError(f"{req}: not a run's requests table "
                         f"({type(e).__name__}: {str(e) or 'empty file'})") from None
    for i, r in enumerate(rows):
        # the figures read hit (5), lost (7) and TTFT (11) by position
        if len(r) < 13 or not all(isinstance(r[k], (int, float)) and math.isfinite(r[k])
                                  for k in (5, 7, 11)):
            raise InputError(f"{req}:{r[0] + 2}: not a row of sim run's requests table")
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
