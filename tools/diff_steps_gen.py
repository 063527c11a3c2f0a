"""The cases of ``tools/diff_steps.py``: its random profiles, a Mooncake trace slice as one
case, and the simpler variants it tries when shrinking a mismatch.

A case ("spec") is ``{"name", "config": {our config keys}, "requests": [{"id", "segments":
[[stream, offset, length], ...], "arrival", "max_tokens", "kind"}]}``; both sides derive from
it (``sim.oracle.step_case``).  Case ``idx`` of ``seed`` depends only on ``(seed, idx)`` and
the profile.
"""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from sim.oracle.keys import draw_prefill_checkpoints

BIG_POOL = 1024
BIG_BUDGET = 8192
PROFILES = ("default", "edge", "length", "budget", "ckpt", "events", "offload")
# profiles whose cases carry the CPU tier (compared against offload_oracle.py)
OFFLOAD_PROFILES = ("offload",)
# profiles the pytest wrappers would skip (none: every profile must match vLLM in CI)
OPT_IN_PROFILES: tuple[str, ...] = ()


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


def _gen_requests(rng: random.Random, systems: list[int], sb: int, hash_unit: int, cap: int,
                  edge: bool) -> list[dict]:
    """``gen_case``'s requests: fresh, replayed, next-turn and private prompts over the
    case's system prompts, arriving together, staggered or at random (the same draws in
    the same order as ever: a seed's cases do not change)."""
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
    return reqs


def gen_case(seed: int, idx: int, profile: str = "default") -> dict:
    """Case ``idx`` of ``seed``.  ``profile="edge"`` leans on the corners: speculative
    decoding almost always, small budgets and pools, replays whose prompt is one token past
    a hash boundary (a hit of all but one token), tight ``max_num_seqs``."""
    if profile == "length":
        return _length_case(seed, idx)
    if profile == "budget":
        return _budget_case(seed, idx)
    if profile == "ckpt":
        return _ckpt_case(seed, idx)
    if profile == "events":
        return _events_case(seed, idx)
    if profile == "offload":
        return _offload_case(seed, idx)
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
    reqs = _gen_requests(rng, systems, sb, hash_unit, cap, edge)

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


def _ckpt_case(seed: int, idx: int) -> dict:
    """``profile="ckpt"``: the default case of the same index with vLLM's internal prefill
    checkpoints (``MambaSpec``'s ``num_prefill_checkpoint_blocks`` /
    ``prefill_checkpoint_alignment``; MambaMixer2 sets 1 and 1) on in ~70 % of cases, their
    alignment 1 (sometimes left to its default), sometimes the hash unit or 16; the rest say 0
    or leave the keys out.  A small pool grows by the checkpoint block each Mamba group
    reserves per chunk."""
    spec = gen_case(seed, idx)
    rng = random.Random(f"diff_steps:{seed}:{idx}:ckpt")
    cfg = spec["config"]
    if draw_prefill_checkpoints(rng, cfg, cfg.get("hash_block_size", cfg["block_size"])):
        n_mamba = cfg["groups"].count("mamba")
        need = max(_need_blocks(cfg, sum(s[2] for s in q["segments"]) + q["max_tokens"])
                   for q in spec["requests"]) + 2 + n_mamba
        cfg["num_blocks"] = max(cfg["num_blocks"], need)
    spec["name"] = spec["name"].replace("s", "k", 1)
    return spec


def _events_case(seed: int, idx: int) -> dict:
    """``profile="events"``: a default, edge or ckpt case with vLLM's KV cache events on
    (``enable_kv_cache_events``; compared step by step in the oracle's canonical form), and
    ``kv_cache_report_mode: full`` for every request (~40 %), for some of them (~30 %) or
    for none, so hits are announced (phantom keys, the ``IndexError`` shape)."""
    rng = random.Random(f"diff_steps:{seed}:{idx}:events")
    spec = gen_case(seed, idx, rng.choice(["default", "edge", "ckpt"]))
    spec["config"]["enable_kv_cache_events"] = True
    r = rng.random()
    if r < 0.4:
        spec["config"]["report_mode"] = "full"
    elif r < 0.7:
        for q in spec["requests"]:
            if rng.random() < 0.5:
                q["report_mode"] = "full"
    spec["name"] = "v" + spec["name"][1:]
    return spec


def _offload_case(seed: int, idx: int) -> dict:
    """``profile="offload"``: the CPU tier on (vLLM's OffloadingConnector, compared against
    ``offload_oracle.py``).  Layouts shaped like Nemotron-H (attention first, then 1-3 Mamba
    groups; block 16/32/64, any hash unit dividing it) or Qwen3-Next (three Mamba groups,
    then attention; block 64, hash 16 or 64: partial tails), EAGLE in about half (its
    attention group flagged in most), a chunk of 1 block or 2-4, 4 to 512 host chunks (LRU or
    ARC), transfers of 0-3 steps, sometimes decode chunks stored too, the shared-prefix
    checkpoint or internal prefill checkpoints (MambaMixer2's) sometimes; 1-2 producers of
    shared prompts, fillers evicting them from a tight GPU pool, then consumers replaying
    or extending them (some arriving together: loads deferred while another loads), and
    sometimes a second turn on top of a consumer."""
    rng = random.Random(f"diff_steps:{seed}:{idx}:offload")
    shape = rng.choice(["nemo", "nemo", "qwen"])
    if shape == "nemo":
        block = rng.choice([16, 32, 64])
        groups = ["full"] + ["mamba"] * rng.choice([1, 1, 2, 3])
        unit = rng.choice([d for d in (4, 8, 16, 32, 64) if block % d == 0])
        attn = [0]
    else:
        block = 64
        groups = ["mamba", "mamba", "mamba", "full"]
        unit = rng.choice([16, 64])
        attn = [3]
    cfg: dict[str, Any] = {"groups": groups, "block_size": block, "hash_block_size": unit}
    if rng.random() < 0.5:
        cfg["prefix_cache_retention_interval"] = 0
    if rng.random() < 0.2:
        cfg["shared_prefix_checkpoint"] = True
    ckpt = rng.random() < 0.4 and draw_prefill_checkpoints(rng, cfg, unit)
    k = 0
    if rng.random() < 0.5:
        k = rng.randint(1, 2)
        cfg["eagle"] = True
        cfg["num_speculative_tokens"] = k
        cfg["accepted_tokens"] = rng.randint(0, k)
        if rng.random() < 0.5:
            cfg["eagle_lookahead_hashes"] = True   # (a connector keeps the legacy hashes)
        if rng.random() < 0.75:
            cfg["eagle_groups"] = attn
    r = rng.random()
    bpc = 1
    if r < 0.2:
        bpc = rng.choice([2, 4])
        cfg["blocks_per_chunk"] = bpc
    elif r < 0.35:
        bpc = rng.choice([1, 2])
        cfg["offload_block_size"] = block * bpc
    chunks = rng.choice([4, 8, 16, 32]) if rng.random() < 0.3 else rng.choice([64, 128, 512])
    cfg["kv_offloading_size_bytes"] = chunks * 4096 * bpc
    cfg["kv_bytes_per_block"] = 4096
    cfg["page_size_alignment"] = 4096
    cfg["eviction_policy"] = rng.choice(["lru", "arc"])
    cfg["transfer_steps"] = rng.choice([0, 1, 1, 2, 3])
    if rng.random() < 0.15:
        cfg["offload_prompt_only"] = False
    cfg["max_num_batched_tokens"] = rng.choice([64, 128, 256, 1024, BIG_BUDGET])
    cfg["max_num_seqs"] = rng.choice([2, 4, 16])
    chunk = block * bpc
    systems = [chunk * rng.randint(1, 4) + rng.choice([0, 0, unit, rng.randint(1, block - 1)])
               for _ in range(rng.randint(1, 2))]
    reqs: list[dict] = []
    t = 0
    for i, n in enumerate(systems):
        reqs.append({"id": f"prod{i}", "segments": [[f"sys{i}", 0, n],
                                                    [f"p{i}", 0, rng.randint(1, block)]],
                     "arrival": t, "max_tokens": rng.randint(1, 8), "kind": "fresh"})
        t += rng.randint(0, 3)
    for j in range(rng.randint(1, 3)):
        t += rng.randint(1, 4)
        reqs.append({"id": f"fill{j}", "segments": [[f"f{j}", 0, rng.randint(2, 5) * block]],
                     "arrival": t, "max_tokens": rng.randint(1, 6), "kind": "private"})
    t += rng.randint(1, 6)
    for c in range(rng.randint(1, 3)):
        i = rng.randrange(len(systems))
        segs: list[list] = [[f"sys{i}", 0, systems[i]]]
        if rng.random() < 0.5:
            segs.append([f"p{i}", 0, rng.randint(1, block)])
        segs.append([f"c{c}", 0, rng.randint(1, 2 * block)])
        reqs.append({"id": f"cons{c}", "segments": segs,
                     "arrival": t + (0 if rng.random() < 0.5 else rng.randint(1, 3)),
                     "max_tokens": rng.randint(1, 10), "kind": "replay"})
    if rng.random() < 0.3:
        prev = rng.choice([q for q in reqs if q["kind"] == "replay"])
        segs = copy.deepcopy(prev["segments"]) + [["t0", 0, rng.randint(1, block)]]
        reqs.append({"id": "turn0", "segments": segs,
                     "arrival": prev["arrival"] + rng.randint(2, 20),
                     "max_tokens": rng.randint(1, 6), "kind": "turn"})
    longest = max(sum(sg[2] for sg in q["segments"]) + q["max_tokens"] for q in reqs)
    need = (-(-(longest + k + 2) // block) + 2) + groups.count("mamba") * (3 + k + ckpt) + 1
    cfg["num_blocks"] = need + rng.randint(0, need // 2)
    return {"name": f"o{seed}_c{idx}_{shape}", "config": cfg, "requests": reqs,
            "max_steps": 600}


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


# ------------------------------------------------------------------------- shrink --
def shrink_candidates(spec: dict) -> list[dict]:
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
                "mamba_block_size": None, "num_prefill_checkpoint_blocks": None,
                "prefill_checkpoint_alignment": None}
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


def size(spec: dict) -> tuple:
    """Shrinking only moves to strictly smaller cases (requests, tokens, config, outputs)."""
    return (len(spec["requests"]), sum(s[2] for q in spec["requests"] for s in q["segments"]),
            len(json.dumps(spec["config"])), sum(q["max_tokens"] + q["arrival"]
                                                  for q in spec["requests"]))

