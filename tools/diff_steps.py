#!/usr/bin/env python3
"""Random differential tester: our step engine against vLLM 0.33.0's real ``Scheduler``.

Usage::

    python tools/diff_steps.py --seed 1 --cases 200 [--profile default|edge]
                               [--oracle-python PATH] [--oracle-dir DIR] [--workers 2]
                               [--keep DIR] [--shrink] [--classify] [--show N] [--tables N]
                               [--assume NAME ...] [--ignore FIELD ...]
    python tools/diff_steps.py --replay DIR/NAME.oracle.json ... [--shrink]   # kept cases again
    python tools/diff_steps.py --mooncake data/traces/mooncake_fast25/conversation_trace.jsonl \
        --cases 300 --start 2000 [--num-blocks 300] [--junction-flag] [--step-ms 30]

``--mooncake TRACE`` compares one case instead: ``--cases`` real requests from ``--start`` on
the ``scenarios/mooncake-conversation.yaml`` cache layout (Nemotron-H-8B's 1 attention + 6 Mamba
groups, 1,088-token blocks, hash unit 64, EAGLE k=3 lookahead hashes, retention 0), arrivals
from the timestamps at ``--step-ms`` per step, a pool of ``--num-blocks`` shared by the groups
(small pools preempt), prompts of up to 126k tokens (``max_model_len`` is raised past them).

Each random case (seeded, reproducible: case *i* of seed *s* depends only on ``(s, i)``) is a
hybrid cache layout (``[full, mamba]`` mostly, also ``[full, mamba, mamba]`` and
``[full, swa:W, mamba]``), block / Mamba-block / hash sizes, scheduler limits (token budget,
``max_num_seqs``, ``long_prefill_token_threshold``), a small or large pool, speculative
decoding (EAGLE with the legacy drop or with lookahead hashes, or ngram; ``K`` 0-3 and an
``accepted_tokens`` int ``<= K``), retention ``null`` / ``0`` and the shared-prefix checkpoint
flag, plus 2-8 requests (concurrent or staggered) built from shared system prompts and private
suffixes, exact replays and multi-turn extensions of earlier prompts.

Both sides see identical literal token ids: token ``p`` of stream number ``k`` (streams
numbered in order of first use) is ``(k + 1) * 100000 + p``.

* ours: ``sim.steps.run_steps_data`` with ``prompt: [ids...]``;
* the oracle: ``run_case`` of ``sched_oracle.py`` (oracle folder, ``$VLLM_ORACLE_DIR``) in persistent
  oracle-venv workers (exactly what ``sched_oracle.py --file`` does, one start-up per
  worker), ``tokens: {"ids": [...]}``.

Compared per request: ``first_scheduled_step, hit, junction, chunk_ends, chunk_end_steps,
first_token_step, finish_step, preemptions`` (the oracle's list length) and ``output_tokens``
(the oracle's ``num_output_tokens``).  Case-level outcomes: both sides reject the
configuration (counted, not a mismatch), one side rejects (``construction``), the oracle
fails while running (``oracle_error``, e.g. ``max_steps``), our side crashes (``crash``) or
runs past ``--timeout`` seconds (``hang``).

Per mismatching case it prints our step case as YAML (``sim steps FILE`` reruns it; its
``expect`` holds the oracle's answers) with the prompts in stream notation (``sys0:96 p_r1:12``,
checked to give our engine the same answers as the literal ids), both answers, and for the
first ``--tables`` cases both per-step tables.  ``--keep DIR`` writes every mismatching case as
``NAME.yaml`` (stream notation), ``NAME.literal.yaml`` (the literal ids that were compared) and
``NAME.oracle.json`` (the oracle case and its full answer).  ``--shrink`` greedily minimises each
mismatching case (fewer requests, default config values, shorter prompts and outputs) while a
mismatch on the same field remains.  Exit status 1 on any mismatch, 0 otherwise; 0 with one
``skipped`` line when the oracle venv is absent.

Known mismatch classes can be looked past, to find the next one: ``--assume NAME`` (see
``ASSUMPTIONS``: a config key added on our side or a field label ignored -- ``sim`` itself is
never changed) and ``--ignore FIELD``.
``--classify`` labels every mismatching case with the known classes that account for it
(reruns only our side, so it is cheap).  A plain run assumes nothing.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.oracle_worker import (  # noqa: E402  (the worker, venv discovery: shared)
    DEFAULT_ORACLE_DIR,
    OraclePool,
    default_oracle_python,
    oracle_unavailable,
)

STREAM_STRIDE = 100_000
BIG_POOL = 1024
BIG_BUDGET = 8192
MAX_STEPS = 2000
FIELDS = ["first_scheduled_step", "hit", "junction", "chunk_ends", "chunk_end_steps",
          "first_token_step", "finish_step", "preemptions", "output_tokens"]
# our config key -> sched_oracle case key
ORACLE_KEYS = {"groups": "layout", "block_size": "block", "mamba_block_size": "mamba_block",
               "hash_block_size": "hash", "eagle": "eagle",
               "shared_prefix_checkpoint": "shared_prefix_checkpoint", "num_blocks": "num_blocks",
               "prefix_cache_retention_interval": "retention",
               "eagle_lookahead_hashes": "eagle_lookahead_hashes",
               "max_num_batched_tokens": "max_num_batched_tokens", "max_num_seqs": "max_num_seqs",
               "long_prefill_token_threshold": "long_prefill_token_threshold",
               "num_speculative_tokens": "num_speculative_tokens",
               "accepted_tokens": "accepted_tokens", "max_model_len": "max_model_len"}


# ---------------------------------------------------------------------------- cases --
# A case "spec": {"name", "config": {our config keys}, "requests": [{"id", "segments":
# [[stream, offset, length], ...], "arrival", "max_tokens", "kind"}]}.  Both sides derive
# from it.


def _divisors(n: int, lo: int = 1) -> list[int]:
    return [d for d in range(lo, n + 1) if n % d == 0]


def _need_blocks(cfg: dict, n_tokens: int) -> int:
    """Generous bound on the blocks one request of ``n_tokens`` (prompt + outputs) holds."""
    k = cfg.get("num_speculative_tokens", 1 if cfg.get("eagle") else 0)
    n = n_tokens + k + 2
    need = 1  # the null block
    for g in cfg["groups"]:
        if g == "mamba":
            need += 3 + k
        else:
            need += -(-n // cfg["block_size"]) + 1   # + a copy-on-write partial block
    return need


def gen_case(seed: int, idx: int, profile: str = "default") -> dict:
    """Case ``idx`` of ``seed``.  ``profile="edge"`` leans on the corners: speculative
    decoding almost always, small budgets and pools, replays whose prompt is one token past
    a hash boundary (a hit of all but one token), tight ``max_num_seqs``."""
    if profile == "length":
        return _length_case(seed, idx)
    if profile == "budget":
        return _budget_case(seed, idx)
    edge = profile == "edge"
    rng = random.Random(f"diff_steps:{seed}:{idx}" + (":edge" if edge else ""))
    block = rng.choice([16, 32, 64])
    mblock = block * rng.choice([1, 1, 2, 4])
    shape = rng.choices(["fm", "fmm", "fsm"], weights=[70, 15, 15])[0]
    if shape == "fm":
        groups = ["full", "mamba"]
    elif shape == "fmm":
        groups = ["full", "mamba", "mamba"]
    else:
        w = rng.choice([block // 2, block, 2 * block, 3 * block, rng.randint(8, 4 * block)])
        groups = ["full", f"swa:{w}", "mamba"]
    cfg: dict[str, Any] = {"groups": groups, "block_size": block}
    if mblock != block:
        cfg["mamba_block_size"] = mblock
    if rng.random() < 0.9:
        cfg["hash_block_size"] = rng.choice(_divisors(block, 4))
    sb = mblock  # scheduler block size (lcm)
    hash_unit = cfg.get("hash_block_size", block)

    # speculative decoding
    r = rng.random()
    if r < (0.45 if edge else 0.3):
        cfg["eagle"] = True
        if rng.random() < 0.5:
            cfg["eagle_lookahead_hashes"] = True
        k = rng.randint(1, 3)
    elif r < (0.9 if edge else 0.5):
        k = rng.randint(1, 3)   # ngram: spec decode without cache-side EAGLE effects
    else:
        k = 0
    if k:
        cfg["num_speculative_tokens"] = k
        cfg["accepted_tokens"] = rng.randint(0, k)
    if rng.random() < 0.5:
        cfg["prefix_cache_retention_interval"] = 0
    if rng.random() < 0.3:
        cfg["shared_prefix_checkpoint"] = True

    # scheduler limits
    r = rng.random()
    if r < (0.75 if edge else 0.4):
        cfg["max_num_batched_tokens"] = rng.randint(32, 256)
    elif r < 0.55:
        cfg["max_num_batched_tokens"] = rng.randint(257, 1024)
    else:
        cfg["max_num_batched_tokens"] = BIG_BUDGET
    cfg["max_num_seqs"] = 16 if rng.random() < 0.4 else rng.randint(1, 16)
    if rng.random() < 0.5:
        cfg["long_prefill_token_threshold"] = rng.randint(8, 256)
    if edge and rng.random() < 0.4:
        cfg["max_num_seqs"] = rng.randint(1, 3)
    small_pool = rng.random() < (0.7 if edge else 0.45)

    # prompts
    cap = min(600, 4 * sb)

    def sys_len() -> int:
        r = rng.random()
        if r < 0.35:
            n = sb * rng.randint(1, 3)
        elif r < 0.6:
            n = hash_unit * rng.randint(1, max(1, 3 * sb // hash_unit))
        else:
            n = rng.randint(4, 3 * sb)
        return max(1, min(n, cap - 8))

    systems = [sys_len() for _ in range(rng.randint(1, 3))]
    n_req = rng.randint(2, 8)
    pattern = rng.choice(["concurrent", "staggered", "random"])
    reqs: list[dict] = []
    t = 0
    for i in range(n_req):
        rid = f"r{i}"
        if pattern == "concurrent":
            arrival = 0 if rng.random() < 0.85 else rng.randint(1, 4)
        elif pattern == "staggered":
            t += rng.randint(0, 6)
            arrival = t
        else:
            arrival = rng.randint(0, 15)
        kind = rng.choices(["fresh", "replay", "turn", "private"],
                           weights=[40, 35, 15, 10] if edge else [60, 15, 15, 10])[0]
        if kind in ("replay", "turn") and not reqs:
            kind = "fresh"
        if kind == "fresh":
            s = rng.randrange(len(systems))
            segs = [[f"sys{s}", 0, systems[s]]]
            priv = rng.randint(0, sb)
            if edge and rng.random() < 0.5:   # prompt ends one token past a hash boundary
                priv = max(1, priv - (systems[s] + priv) % hash_unit + 1)
            if priv:
                segs.append([f"p_{rid}", 0, priv])
        elif kind == "private":
            segs = [[f"p_{rid}", 0, rng.randint(1, 2 * sb)]]
        else:
            prev = rng.choice(reqs)
            segs = copy.deepcopy(prev["segments"])
            if kind == "turn":
                segs.append([f"t_{rid}", 0, rng.randint(1, sb)])
                if rng.random() < 0.7:
                    arrival = max(arrival, prev["arrival"] + rng.randint(1, 20))
        total = sum(s[2] for s in segs)
        while total > cap and len(segs) > 1:      # keep prompts small enough
            drop = segs.pop()
            total -= drop[2]
        if total > cap:
            segs[0][2] = cap
        reqs.append({"id": rid, "segments": segs, "arrival": arrival,
                     "max_tokens": rng.randint(1, 40), "kind": kind})

    need = max(_need_blocks(cfg, sum(s[2] for s in q["segments"]) + q["max_tokens"]) for q in reqs)
    # the generous bound above still leaves a few cases where vLLM can never admit the
    # largest request (both sides then stall); keep a margin
    need += 2
    cfg["num_blocks"] = max(rng.randint(10, 40), need) if small_pool else max(BIG_POOL, need)
    return {"name": f"{'e' if edge else 's'}{seed}_c{idx}", "config": cfg, "requests": reqs}


def _length_case(seed: int, idx: int) -> dict:
    """``profile="length"``: an edge case whose ``max_model_len`` sits a few tokens above
    its longest prompt, so outputs stop at the length cap and speculative steps near it are
    cut short (drafts dropped).  Prompts of ``max_model_len`` tokens or more are left out:
    vLLM's API server rejects them before the scheduler sees them."""
    spec = gen_case(seed, idx, "edge")
    rng = random.Random(f"diff_steps:{seed}:{idx}:length")
    longest = max(sum(sg[2] for sg in q["segments"]) for q in spec["requests"])
    mml = longest + rng.randint(2, 24)
    spec["config"]["max_model_len"] = mml
    lpt = spec["config"].get("long_prefill_token_threshold", 0)
    if lpt > mml and rng.random() < 0.8:   # (the rest: both sides must reject the config)
        spec["config"]["long_prefill_token_threshold"] = rng.randint(8, mml)
    for q in spec["requests"]:
        q["max_tokens"] = rng.randint(1, 60)      # often past the cap
    spec["name"] = spec["name"].replace("e", "l", 1)
    return spec


def _budget_case(seed: int, idx: int) -> dict:
    """``profile="budget"``: several requests decoding at once with K = 1-3 drafts under a
    token budget smaller than their decode steps, so some decode steps are cut short and
    verify fewer drafts than were proposed."""
    rng = random.Random(f"diff_steps:{seed}:{idx}:budget")
    K = rng.randint(1, 3)
    n = rng.randint(2, 5)
    cfg: dict[str, Any] = {"groups": ["full", "mamba"], "block_size": 16,
                           "hash_block_size": rng.choice([4, 8, 16]),
                           "num_speculative_tokens": K, "accepted_tokens": rng.randint(0, K),
                           "max_num_batched_tokens": rng.randint(n, n * (1 + K) - 1),
                           "max_num_seqs": n, "num_blocks": 200}
    if rng.random() < 0.6:
        cfg["eagle"] = True
        if rng.random() < 0.5:
            cfg["eagle_lookahead_hashes"] = True
    if rng.random() < 0.3:
        cfg["max_model_len"] = 64 + rng.randint(0, 40)
    reqs = [{"id": f"r{i}", "segments": [[f"s{i % 2}", 0, rng.randint(1, 12)],
                                          [f"p_r{i}", 0, rng.randint(1, 8)]],
             "arrival": rng.randint(0, 3), "max_tokens": rng.randint(4, 40), "kind": "fresh"}
            for i in range(n)]
    return {"name": f"b{seed}_c{idx}", "config": cfg, "requests": reqs}


def mooncake_case(path: Path, n: int, start: int = 0, step_ms: float = 30.0,
                  num_blocks: int = 400, accepted: int = 2, junction_flag: bool = False) -> dict:
    """Requests ``start .. start + n`` of a Mooncake trace as one step case, on the
    ``scenarios/mooncake-conversation.yaml`` cache layout: Nemotron-H-8B's one attention and
    six Mamba groups, 1,088-token blocks, hash unit 64, EAGLE k=3 with lookahead hashes
    (``accepted`` drafts kept per step), retention 0, budget 8,192, 256 sequences.  Prompts
    are the trace's hash-id segments exactly as ``sim run`` reads them; a request arrives at
    step ``floor((timestamp - first timestamp) / step_ms)``; ``num_blocks`` (shared by the
    seven groups) is small enough to force evictions and preemptions; ``max_model_len`` is
    raised above the longest request (the trace holds prompts of up to 126k tokens).
    ``junction_flag`` turns on the shared-prefix (junction) checkpoint."""
    from workloads.base import segment_name
    from workloads.traces import MooncakeConfig

    reqs: list[dict] = []
    t0 = None
    for i, tr in enumerate(MooncakeConfig(str(path), num_requests=start + n).requests()):
        if i < start:
            continue
        ms = tr.arrival_s * 1000.0
        t0 = ms if t0 is None else t0
        reqs.append({"id": tr.request_id,
                     "segments": [[segment_name(n), o, k] for n, o, k in tr.segments],
                     "arrival": int((ms - t0) // step_ms), "max_tokens": tr.output_tokens,
                     "kind": "trace"})
    cfg = {"groups": ["full"] + ["mamba"] * 6, "block_size": 1088, "hash_block_size": 64,
           "eagle": True, "eagle_lookahead_hashes": True, "num_speculative_tokens": 3,
           "accepted_tokens": accepted, "prefix_cache_retention_interval": 0,
           "max_num_batched_tokens": 8192, "max_num_seqs": 256, "num_blocks": num_blocks}
    if junction_flag:
        cfg["shared_prefix_checkpoint"] = True
    # vLLM's API server rejects prompts longer than max_model_len; the step oracle adds
    # requests behind it, so keep every request inside the model length
    longest = max(sum(sg[2] for sg in q["segments"]) + q["max_tokens"] for q in reqs)
    cfg["max_model_len"] = max(65536, -(-(longest + 64) // 4096) * 4096)
    last = max(q["arrival"] for q in reqs)
    work = sum(sum(sg[2] for sg in q["segments"]) // 4096 + q["max_tokens"] for q in reqs)
    return {"name": f"mooncake_{start}_{start + n}" + ("_flag" if junction_flag else ""),
            "config": cfg, "requests": reqs,
            "max_steps": last + work + 1000}


# ------------------------------------------------------------------------- tokens --
def stream_numbers(spec: dict) -> dict[str, int]:
    nums: dict[str, int] = {}
    for q in spec["requests"]:
        for name, _, _ in q["segments"]:
            nums.setdefault(name, len(nums))
    return nums


def token_ids(spec: dict, q: dict, nums: dict[str, int] | None = None) -> list[int]:
    nums = nums or stream_numbers(spec)
    out: list[int] = []
    for name, off, n in q["segments"]:
        base = (nums[name] + 1) * STREAM_STRIDE
        out.extend(range(base + off, base + off + n))
    return out


def prompt_notation(q: dict) -> str:
    return " ".join(f"{n}@{o}:{ln}" if o else f"{n}:{ln}" for n, o, ln in q["segments"])


# Known-gap workarounds for our side only (``--ours-extra``), so that a known mismatch class
# does not hide others; the YAML printed then carries the same keys.
OURS_EXTRA: dict[str, Any] = {}


def ours_config(spec: dict) -> dict:
    cfg = dict(spec["config"])
    for k, v in OURS_EXTRA.items():
        if k == "mamba_num_speculative_blocks" and v == "K":
            k_spec = cfg.get("num_speculative_tokens", 1 if cfg.get("eagle") else 0)
            if k_spec:
                cfg[k] = k_spec
        else:
            cfg[k] = v
    return cfg


def to_ours(spec: dict, literal: bool = True) -> dict:
    nums = stream_numbers(spec)
    reqs = [{"id": q["id"],
             "prompt": token_ids(spec, q, nums) if literal else prompt_notation(q),
             "arrival_step": q["arrival"], "max_tokens": q["max_tokens"]}
            for q in spec["requests"]]
    return {"config": ours_config(spec), "requests": reqs}


def to_oracle(spec: dict) -> dict:
    nums = stream_numbers(spec)
    case = {ORACLE_KEYS[k]: v for k, v in spec["config"].items()}
    case["id"] = spec["name"]
    case["max_steps"] = spec.get("max_steps", MAX_STEPS)
    case["requests"] = [{"id": q["id"], "tokens": {"ids": token_ids(spec, q, nums)},
                         "arrival": q["arrival"], "max_tokens": q["max_tokens"]}
                        for q in spec["requests"]]
    return case


# ----------------------------------------------------------------------- our side --
class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise _Timeout()


def run_ours(spec: dict, timeout: float = 20.0, literal: bool = True,
             trace: list | None = None) -> dict:
    """{"results": [...]} | {"case_error": msg} | {"crash": tb} | {"hang": seconds}.

    With ``trace`` (a list), our scheduler's per-step decisions are appended to it (the
    scheduler is wrapped for this run only; nothing in ``sim`` changes).
    """
    from sim.cache.case import CaseError
    import sim.steps as steps_mod

    data = to_ours(spec, literal)
    orig = steps_mod.Scheduler
    cls = orig
    if trace is not None:
        cls = _tracing_scheduler(cls, trace)
    steps_mod.Scheduler = cls
    use_alarm = timeout and threading.current_thread() is threading.main_thread()
    if use_alarm:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return {"results": steps_mod.run_steps_data(data, spec["name"])}
    except _Timeout:
        return {"hang": timeout}
    except CaseError as e:
        return {"case_error": str(e)}
    except Exception:  # noqa: BLE001 - a crash of our engine is itself a finding
        return {"crash": traceback.format_exc(limit=8)}
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        steps_mod.Scheduler = orig


def _tracing_scheduler(base, trace: list):
    class Tracing(base):
        def schedule(self, now):
            before = {id(r): r.preemptions for r in self.running}
            items = super().schedule(now)
            victims = [r.rid for r in self.waiting if id(r) in before
                       and r.preemptions > before[id(r)]]
            trace.append({"step": int(now), "scheduled": {it.req.rid: it.num_tokens for it in items},
                          "spec_tokens": {it.req.rid: it.spec_tokens for it in items
                                          if it.spec_tokens},
                          "running": len(self.running), "waiting": len(self.waiting),
                          "preempted": victims})
            return items

        def jump_decode(self, items, k):
            trace.append({"step": int(self.sched_time), "jump": k})
            return super().jump_decode(items, k)

        def update_from_output(self, items, now):
            fin = super().update_from_output(items, now)
            if fin and trace:
                trace[-1]["finished"] = [r.rid for r in fin]
            return fin

    return Tracing


# ---------------------------------------------------------------------- comparing --
def oracle_value(rec: dict, fld: str):
    if fld == "preemptions":
        return len(rec.get("preemptions") or [])
    if fld == "output_tokens":
        return rec.get("num_output_tokens")
    return rec.get(fld)


def compare(spec: dict, ours: dict, ans: dict) -> tuple[str, list[tuple[str, str, Any, Any]]]:
    """(status, [(field, request, ours, oracle)]); status: compared | both_reject."""
    built = "config" in ans
    if not built:
        if "case_error" in ours:
            return "both_reject", []
        return "compared", [("construction", "-", "accepted" if "results" in ours else
                             _short(ours), ans.get("error"))]
    if "case_error" in ours:
        return "compared", [("construction", "-", f"CaseError: {ours['case_error']}", "accepted")]
    if "crash" in ours:
        return "compared", [("crash", "-", ours["crash"].strip().splitlines()[-1],
                             ans.get("error"))]
    if "hang" in ours and "max_steps" in str(ans.get("error")):
        # vLLM never admits some request either (the pool cannot hold it): both stall
        return "both_stall", []
    if "hang" in ours:
        return "compared", [("hang", "-", f"no result after {ours['hang']} s", ans.get("error"))]
    res = ours["results"]
    ours_err = [r for r in res if "error" in r]
    if ans.get("error") or ours_err:
        o = ours_err[0]["error"] if ours_err else None
        if ans.get("error") and ours_err:
            return "compared", [("error", ours_err[0]["id"], o, ans["error"])]
        return "compared", [("oracle_error" if ans.get("error") else "error", "-", o,
                             ans.get("error"))]
    orecs = {r["id"]: r for r in ans["requests"]}
    mm = []
    for r in res:
        o = orecs[r["id"]]
        for f in FIELDS:
            a, b = r.get(f), oracle_value(o, f)
            if a != b:
                mm.append((_label(f, r, o, a, b), r["id"], a, b))
    return "compared", [m for m in mm if m[0] not in IGNORE]


# Fields (or labels) left out of the comparison (``--ignore``), to look past a known class.
IGNORE: set[str] = set()

# ``--assume NAME``: look past a known mismatch class (exploration only; a plain run uses none).
ASSUMPTIONS = {
    "spec-blocks": "our config gets mamba_num_speculative_blocks = num_speculative_tokens "
                   "(vLLM's MambaSpec holds one state block per draft token)",
    "replay-chunks": "ignore chunk_ends@replay / chunk_end_steps@replay (our chunk list goes on "
                     "through the re-prefill after a preemption inside the first prefill)",
}
ASSUME: set[str] = set()


def assume(names) -> None:
    for n in names:
        if n not in ASSUMPTIONS:
            raise SystemExit(f"--assume: unknown {n!r} (known: {', '.join(ASSUMPTIONS)})")
        ASSUME.add(n)
        if n == "spec-blocks":
            OURS_EXTRA["mamba_num_speculative_blocks"] = "K"
        elif n == "replay-chunks":
            IGNORE.update({"chunk_ends@replay", "chunk_end_steps@replay"})


def _padded_admissions(ans: dict) -> list[str]:
    """Requests the oracle admitted with placeholder drafts: vLLM pads a newly scheduled
    request with one token left (a hit of all but one token) to ``1 + K`` tokens when no
    running request is prefilling this step (``pad_spec_decode`` in ``Scheduler.schedule``);
    named in the label of a case nothing else explains."""
    first = {r["id"]: r.get("first_scheduled_step") for r in ans.get("requests") or []}
    out = []
    for st in ans.get("steps") or []:
        for rid, n in (st.get("spec_tokens") or {}).items():
            if first.get(rid) == st.get("step") and n:
                out.append(rid)
    return out


def explain(spec: dict, ans: dict) -> str:
    """Which known classes (``--assume`` names) account for this case's mismatches: the
    single ones that each make it match, else a minimal set found greedily, else
    ``unexplained`` (with ``pad-spec-decode`` when the oracle padded an admission)."""
    saved = (set(ASSUME), dict(OURS_EXTRA), set(IGNORE))

    def matches(names) -> bool:
        ASSUME.clear(), OURS_EXTRA.clear(), IGNORE.clear()
        ASSUME.update(saved[0]), OURS_EXTRA.update(saved[1]), IGNORE.update(saved[2])
        assume(names)
        return not compare(spec, run_ours(spec, timeout=5), ans)[1]

    try:
        names = [n for n in ASSUMPTIONS if n not in saved[0]]
        alone = [n for n in names if matches({n})]
        if alone:
            return " | ".join(alone)
        cur = set(names)
        if not matches(cur):
            pad = _padded_admissions(ans)
            return "unexplained" + (f" (pad-spec-decode: {','.join(pad)})" if pad else "")
        for n in names:
            if matches(cur - {n}):
                cur.discard(n)
        pad = _padded_admissions(ans)
        return " + ".join(sorted(cur)) + (f" (oracle also padded {','.join(pad)})" if pad else "")
    finally:
        ASSUME.clear(), OURS_EXTRA.clear(), IGNORE.clear()
        ASSUME.update(saved[0]), OURS_EXTRA.update(saved[1]), IGNORE.update(saved[2])


def _label(f: str, r: dict, o: dict, a, b) -> str:
    """The field, with ``@replay`` where the only difference is that our chunk list goes on
    through the re-prefill after a preemption inside the first prefill (the oracle's
    ``chunk_ends`` stop at the first preemption)."""
    if (f in ("chunk_ends", "chunk_end_steps") and o.get("preemptions") and r.get("preemptions")
            and isinstance(a, list) and isinstance(b, list) and len(a) > len(b)
            and a[:len(b)] == b):
        return f + "@replay"
    return f


def _short(ours: dict) -> str:
    for k in ("case_error", "crash", "hang"):
        if k in ours:
            return f"{k}: {str(ours[k]).strip().splitlines()[-1]}"
    return "accepted"


# ------------------------------------------------------------------------ display --
def ours_yaml(spec: dict, ans: dict | None, literal: bool = False, note: str = "") -> str:
    data = to_ours(spec, literal)
    desc = "; ".join(f"{q['id']} ({q['kind']}): {prompt_notation(q)}" for q in spec["requests"])
    doc: dict[str, Any] = {"source": f"tools/diff_steps.py case {spec['name']}" + note,
                           "description": desc}
    doc.update(data)
    if ans and ans.get("requests"):
        doc["expect"] = {r["id"]: {f: oracle_value(r, f) for f in FIELDS}
                         for r in ans["requests"]}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def step_table(steps: list[dict], limit: int = 80) -> str:
    lines = []
    for s in steps[:limit]:
        if s.get("idle"):
            lines.append(f"  {s['step']:>4}  (idle)")
            continue
        if "jump" in s:
            lines.append(f"  {s['step']:>4}  ... pure-decode jump over {s['jump']} steps")
            continue
        sch = " ".join(f"{k}:{v}" + (f"(+{s['spec_tokens'][k]}sp)" if s.get("spec_tokens", {})
                                       .get(k) else "")
                       for k, v in s["scheduled"].items())
        extra = ""
        if s.get("arrivals"):
            extra += f" arr={','.join(s['arrivals'])}"
        if s.get("preempted"):
            extra += f" PREEMPT={','.join(s['preempted'])}"
        if s.get("finished"):
            extra += f" fin={','.join(s['finished'])}"
        if "kv_usage" in s:
            extra += f" kv={s['kv_usage']}"
        lines.append(f"  {s['step']:>4}  R{s['running']} W{s['waiting']}  [{sch}]{extra}")
    if len(steps) > limit:
        lines.append(f"  ... {len(steps) - limit} more steps")
    return "\n".join(lines)


def describe(spec: dict, ours: dict, ans: dict, mm: list, tables: bool) -> str:
    same = ""
    if "results" in ours:
        alt = run_ours(spec, literal=False)
        if alt.get("results") != ours["results"]:
            same = " (NOTE: stream notation gives our engine different answers; use --keep's .literal.yaml)"
    out = [f"=== {spec['name']}: " + ", ".join(sorted({m[0] for m in mm})), "--- our step case"
           " (sim steps FILE; prompts in stream notation)" + same,
           ours_yaml(spec, ans).rstrip()]
    out.append("--- mismatches (field request: ours | oracle)")
    for f, rid, a, b in mm:
        out.append(f"  {f:<22} {rid:<4} {a!r} | {b!r}")
    if "results" in ours:
        out.append("--- ours:   " + json.dumps([{k: v for k, v in r.items() if k != 'arrival_step'}
                                              for r in ours["results"]]))
    else:
        out.append("--- ours:   " + _short(ours))
    if ans.get("requests"):
        out.append("--- oracle: " + json.dumps([{k: oracle_value(r, k) for k in ["id"] + FIELDS}
                                              for r in ans["requests"]]))
    if ans.get("error"):
        out.append(f"--- oracle error: {ans['error']} {ans.get('traceback_tail', '')}")
    if tables and ans.get("steps"):
        out.append("--- oracle steps (step  running/waiting after schedule()  [id:tokens])")
        out.append(step_table(ans["steps"]))
        tr: list = []
        run_ours(spec, trace=tr)
        if tr:
            out.append("--- our steps")
            out.append(step_table(tr))
    return "\n".join(out)


def keep_case(keep: Path, spec: dict, ours: dict, ans: dict, mm: list) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    (keep / f"{spec['name']}.yaml").write_text(ours_yaml(spec, ans))
    (keep / f"{spec['name']}.literal.yaml").write_text(ours_yaml(spec, ans, literal=True))
    (keep / f"{spec['name']}.oracle.json").write_text(json.dumps(
        {"spec": spec, "oracle_case": to_oracle(spec), "oracle_answer": ans,
         "ours": ours, "mismatches": mm}, indent=1, default=str))


# ------------------------------------------------------------------------- shrink --
def _candidates(spec: dict) -> list[dict]:
    """Simpler variants of a case, most aggressive first."""
    out = []
    reqs = spec["requests"]

    def var(fn):
        c = copy.deepcopy(spec)
        if fn(c) is not False:
            out.append(c)

    for i in range(len(reqs)):
        if len(reqs) > 1:
            var(lambda c, i=i: c["requests"].pop(i))
    cfg = spec["config"]
    defaults = {"long_prefill_token_threshold": None, "max_num_batched_tokens": None,
                "max_num_seqs": None, "prefix_cache_retention_interval": None,
                "shared_prefix_checkpoint": None, "eagle_lookahead_hashes": None,
                "mamba_block_size": None}
    for k in defaults:
        if k in cfg:
            var(lambda c, k=k: c["config"].pop(k))
    if cfg.get("num_blocks", BIG_POOL) < BIG_POOL:
        var(lambda c: c["config"].__setitem__("num_blocks", BIG_POOL))
    if cfg.get("num_speculative_tokens") or cfg.get("eagle"):
        def nospec(c):
            for k in ("eagle", "eagle_lookahead_hashes", "num_speculative_tokens", "accepted_tokens"):
                c["config"].pop(k, None)
        var(nospec)
        if cfg.get("eagle") and cfg.get("num_speculative_tokens", 1) > 1:
            def k1(c):
                c["config"]["num_speculative_tokens"] = 1
                c["config"]["accepted_tokens"] = min(c["config"].get("accepted_tokens", 0), 1)
            var(k1)
        if cfg.get("accepted_tokens"):
            var(lambda c: c["config"].__setitem__("accepted_tokens", 0))
        if cfg.get("eagle"):
            var(lambda c: c["config"].pop("eagle"))
    if len(cfg["groups"]) > 2:
        var(lambda c: c["config"].__setitem__("groups", ["full", "mamba"]))
    if cfg.get("hash_block_size") not in (None, cfg["block_size"]):
        var(lambda c: c["config"].__setitem__("hash_block_size", c["config"]["block_size"]))
    budget = cfg.get("max_num_batched_tokens")
    if budget and budget < BIG_BUDGET and budget > 16:
        var(lambda c: c["config"].__setitem__("max_num_batched_tokens", budget // 2))
    if cfg.get("num_blocks", BIG_POOL) < BIG_POOL and cfg["num_blocks"] > 4:
        var(lambda c: c["config"].__setitem__("num_blocks", cfg["num_blocks"] - 1))
        var(lambda c: c["config"].__setitem__("num_blocks", cfg["num_blocks"] + 1))
    for i, q in enumerate(reqs):
        if q["max_tokens"] > 1:
            var(lambda c, i=i: c["requests"][i].__setitem__("max_tokens", 1))
            var(lambda c, i=i, q=q: c["requests"][i].__setitem__("max_tokens", q["max_tokens"] // 2))
            var(lambda c, i=i, q=q: c["requests"][i].__setitem__("max_tokens", q["max_tokens"] - 1))
        if q["arrival"] > 0:
            var(lambda c, i=i: c["requests"][i].__setitem__("arrival", 0))
            var(lambda c, i=i, q=q: c["requests"][i].__setitem__("arrival", q["arrival"] - 1))
    # segments: drop or shorten, consistently in every request holding the same stream
    names = sorted({s[0] for q in reqs for s in q["segments"]})
    for name in names:
        lens = {s[2] for q in reqs for s in q["segments"] if s[0] == name}
        n = max(lens)
        unit = cfg.get("hash_block_size") or cfg["block_size"]

        def shorten(c, name=name, new=0):
            for q in c["requests"]:
                q["segments"] = [[s[0], s[1], min(s[2], new)] if s[0] == name else s
                                 for s in q["segments"]]
                q["segments"] = [s for s in q["segments"] if s[2] > 0]
            c["requests"] = [q for q in c["requests"] if q["segments"]]
            return bool(c["requests"])

        for new in (0, n // 2, n - unit, n - 1, (n - 1) // unit * unit):
            if 0 <= new < n:
                var(lambda c, shorten=shorten, new=new: shorten(c, new=new))
    if cfg["block_size"] > 16:
        def smaller(c):
            f = c["config"]["block_size"] // 16
            c["config"]["block_size"] = 16
            if "mamba_block_size" in c["config"]:
                c["config"]["mamba_block_size"] //= f
            if "hash_block_size" in c["config"]:
                c["config"]["hash_block_size"] = max(1, c["config"]["hash_block_size"] // f)
            for q in c["requests"]:
                q["segments"] = [[s[0], s[1] // f, max(1, s[2] // f)] for s in q["segments"]]
        var(smaller)
    return out


def _size(spec: dict) -> tuple:
    return (len(spec["requests"]), sum(s[2] for q in spec["requests"] for s in q["segments"]),
            len(json.dumps(spec["config"])), sum(q["max_tokens"] + q["arrival"]
                                                  for q in spec["requests"]))


def shrink(spec: dict, fld: str, pool: OraclePool, max_rounds: int = 300) -> dict:
    cur = spec
    for _ in range(max_rounds):
        cands = [c for c in _candidates(cur) if _size(c) < _size(cur)]
        if not cands:
            break
        answers = pool.run([to_oracle(c) for c in cands])
        for c, ans in zip(cands, answers):
            ours = run_ours(c, timeout=10)
            _, mm = compare(c, ours, ans)
            if any(m[0] == fld for m in mm):
                cur = c
                break
        else:
            break
    cur = copy.deepcopy(cur)
    cur["name"] = spec["name"] + "_min"
    return cur


# --------------------------------------------------------------------------- main --
def run_diff(specs: list[dict], pool: OraclePool, timeout: float = 20.0,
             progress: bool = False, compared: list | None = None) -> dict:
    """Run ``specs`` on both sides; ``compared`` (a list) collects (spec, oracle answer) of
    every case both sides ran."""
    t0 = time.time()
    answers = pool.run([to_oracle(s) for s in specs])
    t1 = time.time()
    summ: dict[str, Any] = {"cases": 0, "requests": 0, "both_reject": 0, "both_stall": 0,
                            "bad_cases": [],
                            "by_field": Counter(), "cases_by_field": Counter(),
                            "oracle_s": round(t1 - t0, 1)}
    for spec, ans in zip(specs, answers):
        ours = run_ours(spec, timeout=timeout)
        status, mm = compare(spec, ours, ans)
        if status in ("both_reject", "both_stall"):
            summ[status] += 1
            continue
        summ["cases"] += 1
        summ["requests"] += len(spec["requests"])
        if compared is not None:
            compared.append((spec, ans))
        if mm:
            summ["bad_cases"].append((spec, ours, ans, mm))
            for f in {m[0] for m in mm}:
                summ["cases_by_field"][f] += 1
            for m in mm:
                summ["by_field"][m[0]] += 1
    summ["ours_s"] = round(time.time() - t1, 1)
    return summ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--profile", choices=["default", "edge", "length", "budget"],
                    default="default",
                    help="case distribution (edge: spec decode, small budgets/pools, "
                         "near-full replays; length: edge cases with max_model_len a few "
                         "tokens above the longest prompt; budget: concurrent speculative "
                         "decodes under a budget that cuts some of them short)")
    ap.add_argument("--write-golden", type=Path, default=None, metavar="DIR",
                    help="write every compared case as a step case whose expect block is "
                         "the oracle's answer (golden files for tests/golden_steps)")
    ap.add_argument("--mooncake", type=Path, default=None, metavar="TRACE",
                    help="instead of random cases: one case from a Mooncake trace (e.g. "
                         "data/traces/mooncake_fast25/conversation_trace.jsonl) on the "
                         "mooncake-conversation cache layout (7 groups); --cases = requests, "
                         "--start = first request")
    ap.add_argument("--step-ms", type=float, default=30.0,
                    help="with --mooncake: trace milliseconds per scheduler step")
    ap.add_argument("--num-blocks", type=int, default=400,
                    help="with --mooncake: pool size shared by the 7 groups")
    ap.add_argument("--junction-flag", action="store_true",
                    help="with --mooncake: enable the shared-prefix (junction) checkpoint")
    ap.add_argument("--oracle-python", type=Path, default=None)
    ap.add_argument("--oracle-dir", type=Path, default=DEFAULT_ORACLE_DIR)
    ap.add_argument("--workers", type=int, default=2, help="oracle processes in parallel")
    ap.add_argument("--keep", type=Path, default=None, help="write mismatching cases here")
    ap.add_argument("--shrink", action="store_true", help="minimise each mismatching case")
    ap.add_argument("--show", type=int, default=20, help="print at most N mismatching cases")
    ap.add_argument("--tables", type=int, default=3, help="step tables for the first N of them")
    ap.add_argument("--timeout", type=float, default=20.0, help="our side, seconds per case")
    ap.add_argument("--replay", type=Path, nargs="+", default=None,
                    help="rerun cases from kept NAME.oracle.json files (their 'spec')")
    ap.add_argument("--ours-extra", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config key for OUR side only (YAML value; "
                         "mamba_num_speculative_blocks=K means num_speculative_tokens), to "
                         "look past a known mismatch class")
    ap.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                    help="leave FIELD (or a label such as chunk_ends@replay) out of the "
                         "comparison, to look past a known mismatch class")
    ap.add_argument("--assume", action="append", default=[], metavar="NAME",
                    help="look past a known mismatch class: " + "; ".join(
                        f"{k}: {v}" for k, v in ASSUMPTIONS.items()))
    ap.add_argument("--classify", action="store_true",
                    help="label each mismatching case with the known classes (--assume "
                         "names) that account for it (reruns only our side)")
    args = ap.parse_args(argv)
    assume(args.assume)
    IGNORE.update(args.ignore)
    for kv in args.ours_extra:
        k, _, v = kv.partition("=")
        OURS_EXTRA[k] = yaml.safe_load(v)

    py = Path(args.oracle_python or default_oracle_python())
    why = oracle_unavailable("sched_oracle", py, args.oracle_dir)
    if why:
        print(f"skipped: {why}")
        return 0
    oracle_dir = args.oracle_dir.resolve()
    if args.replay:
        specs = [json.loads(p.read_text())["spec"] for p in args.replay]
    elif args.mooncake:
        specs = [mooncake_case(args.mooncake, args.cases, args.start, args.step_ms,
                               args.num_blocks, junction_flag=args.junction_flag)]
    else:
        specs = [gen_case(args.seed, i, args.profile)
                 for i in range(args.start, args.start + args.cases)]
    pool = OraclePool(Path(py), oracle_dir, "sched_oracle",
                      n=min(args.workers, max(1, len(specs) // 4)))
    try:
        compared: list = [] if args.write_golden else None
        summ = run_diff(specs, pool, args.timeout, compared=compared)
        if args.write_golden:
            args.write_golden.mkdir(parents=True, exist_ok=True)
            for spec, ans in compared:
                (args.write_golden / f"oracle_{spec['name']}.yaml").write_text(
                    "# Written by tools/diff_steps.py --write-golden: expect = vLLM 0.33.0's "
                    "real Scheduler (sched_oracle.py).\n" + ours_yaml(spec, ans))
        bad = summ["bad_cases"]
        what = (f"{len(specs)} replayed case(s)" if args.replay else
                f"seed {args.seed}, profile {args.profile}, "
                f"cases {args.start}..{args.start + len(specs) - 1}")
        print(f"vllm {pool.version} sched_oracle vs sim.steps: {what}"
              + (f"; assuming {', '.join(sorted(ASSUME))}" if ASSUME else "")
              + (f"; ignoring {', '.join(sorted(IGNORE))}" if IGNORE - {
                  "chunk_ends@replay", "chunk_end_steps@replay"} else ""))
        print(f"compared {summ['cases']} cases, {summ['requests']} requests "
              f"({summ['both_reject']} configurations rejected by both sides, "
              f"{summ['both_stall']} cases where both never admit a request); "
              f"oracle {summ['oracle_s']} s, ours {summ['ours_s']} s")
        print(f"mismatching cases: {len(bad)}")
        if bad:
            print("mismatching cases by field: " + ", ".join(
                f"{f} {n}" for f, n in summ["cases_by_field"].most_common()))
            print("mismatching request fields: " + ", ".join(
                f"{f} {n}" for f, n in summ["by_field"].most_common()))
        if bad and args.classify:
            labels = Counter()
            per_case = []
            for spec, ours, ans, mm in bad:
                if "config" not in ans or any(m[0] in ("construction", "crash", "hang")
                                              for m in mm):
                    lab = "case-level: " + mm[0][0]
                else:
                    lab = explain(spec, ans)
                labels[lab] += 1
                per_case.append(f"  {spec['name']}: {lab}")
            print("mismatching cases by known class (which --assume makes them match):")
            for lab, n in labels.most_common():
                print(f"  {n:4d}  {lab}")
            print("\n".join(per_case))
        for j, (spec, ours, ans, mm) in enumerate(bad):
            if args.keep:
                keep_case(args.keep, spec, ours, ans, mm)
            if j < args.show:
                print()
                print(describe(spec, ours, ans, mm, tables=j < args.tables))
            if args.shrink:
                small = shrink(spec, mm[0][0], pool)
                ans2 = pool.run([to_oracle(small)])[0]
                ours2 = run_ours(small)
                _, mm2 = compare(small, ours2, ans2)
                print()
                print(f"--- shrunk {spec['name']} (on field {mm[0][0]}):")
                print(describe(small, ours2, ans2, mm2, tables=True))
                if args.keep:
                    keep_case(args.keep, small, ours2, ans2, mm2)
        if len(bad) > args.show:
            print(f"\n({len(bad) - args.show} more mismatching cases not shown"
                  + (f"; all kept in {args.keep}" if args.keep else "; use --keep DIR") + ")")
    finally:
        pool.close()
    return 1 if summ["bad_cases"] else 0


if __name__ == "__main__":
    sys.exit(main())
