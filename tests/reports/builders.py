"""Hand-built run, sweep and compare folders for the report tests: every value in them is
chosen here, so a test can state what the report must show without running a simulation."""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from sim.rundir.records import REQUEST_COLUMNS

SUMMARY = {"scenario": "synthetic", "model": "m", "policy": "vllm", "block_size": 1024,
           "hash_block_size": 64, "num_gpu_blocks": 100, "requests": 3, "prompt_tokens": 3000,
           "hit_tokens": 0, "token_hit_rate": 0.5, "request_hit_rate": 0.5, "lost_tokens": 0,
           "lost_token_rate": 0.01, "ttft_mean_s": 0.2, "ttft_p50_s": 0.2, "ttft_p90_s": 0.3,
           "ttft_p99_s": 0.4, "output_tokens": 30, "makespan_s": 10.0, "throughput_tok_s": 3.0,
           "mamba_state_bytes_peak": 2**30, "kv_bytes_peak": 0, "evictions": 0,
           "preemptions": 0, "steps": 10, "wall_s": 0.0, "sim_requests_per_s": 0.0}


@dataclass
class Req:
    prompt: int = 1000
    hit: int = 0
    lost: int = 0
    ttft: float = 0.1
    states: int = 1


def request_row(i: int, r: Req) -> dict:
    row = dict.fromkeys(REQUEST_COLUMNS, "")
    row.update(request_id=f"r{i}", arrival_s=f"{i:.6f}", prompt_tokens=r.prompt,
               hit_tokens=r.hit, attention_hit_tokens=r.hit + r.lost, lost_tokens=r.lost,
               junction=0, recomputed_tokens=0, queue_s="0.000000", ttft_s=f"{r.ttft:.6f}",
               e2e_s=f"{r.ttft + 1:.6f}", output_tokens=10, preemptions=0,
               mamba_states_written=r.states)
    return row


def write_requests(path: Path, reqs: list[Req]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS, lineterminator="\n")
        w.writeheader()
        for i, r in enumerate(reqs):
            w.writerow(request_row(i, r))


@dataclass
class P:
    """One sweep point: its axis values, summary overrides and requests."""

    id: str
    axes: dict[str, str]
    reqs: list[Req] = field(default_factory=lambda: [Req()])
    status: str = "ok"
    summary: dict = field(default_factory=dict)


def write_sweep(folder: Path, points: list[P], name: str | None = None) -> Path:
    folder.mkdir(parents=True)
    axes = list(points[0].axes)
    # SUMMARY's columns, then any other key a point sets (None: an empty cell, as sim
    # sweep writes a null)
    keys = list(dict.fromkeys([*SUMMARY, *(k for p in points for k in p.summary)]))
    with open(folder / "points.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["point", "label", "status", "error", *axes, *keys])
        for p in points:
            label = ", ".join(f"{a.rsplit('.', 1)[-1]}={v}" for a, v in p.axes.items())
            if p.status != "ok":
                w.writerow([p.id, label, p.status, "boom", *p.axes.values()] + [""] * len(keys))
                continue
            s = {**SUMMARY, **p.summary}
            w.writerow([p.id, label, "ok", "", *p.axes.values(),
                        *("" if s.get(k) is None else s[k] for k in keys)])
            write_requests(folder / "points" / p.id / "requests.csv", p.reqs)
    if name is not None:
        (folder / "sweep.yaml").write_text(f"name: {name}\nbase: x.yaml\n")
    return folder


RUN = {"name": "toy", "description": "a hand-built run", "model": "m", "block_size": 1024,
       "policy": "vllm", "retention": 0, "shared_prefix_checkpoint": False,
       "lookahead_hashes": False, "speculative": "none", "gpu": "1 x H200", "workload": "toy"}


def write_run(folder: Path, reqs: list[Req], **summary) -> Path:
    folder.mkdir(parents=True)
    write_requests(folder / "requests.csv", reqs)
    s = {**SUMMARY, "requests": len(reqs), **summary}
    (folder / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    (folder / "run.json").write_text(json.dumps(RUN, indent=1) + "\n")
    return folder
