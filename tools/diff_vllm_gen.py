"""The cases of ``tools/diff_vllm.py``: its random profiles and the simpler variants it
tries when shrinking a mismatch.

A case ("spec") is ``{"config": <our config keys>, "requests": [[(stream, offset, length),
...], ...]}``, request 0 the producer; both sides derive from it (``sim.oracle.kv_case``).
Case ``index`` of ``seed`` depends only on ``(seed, index)`` and the profile.
"""
from __future__ import annotations

import copy
import math
import random
from typing import Any

from sim.oracle.keys import draw_prefill_checkpoints
from sim.oracle.segments import Segment, normalise, prompt_len, truncate

BIG_BUDGET = 1 << 20


# ------------------------------------------------------------------------ generator --
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


PROFILES = ("default", "stress", "tiny", "groups", "ckpt")
# profiles the pytest wrapper would skip (none: every profile must match vLLM in CI)
OPT_IN_PROFILES: tuple[str, ...] = ()
# "groups": runs of several identical groups (one manager serves a run; see sim/cache/managers.py)
MULTI_MEMBER_LAYOUTS = (["full", "mamba", "mamba", "mamba"], ["full", "full", "mamba", "mamba"],
                        ["full", "swa:W", "swa:W", "mamba"], ["mamba", "mamba", "full"],
                        ["full", "mamba", "full", "mamba", "mamba"],
                        ["full"] + ["mamba"] * 6)


def gen_config(rng: random.Random, profile: str = "default") -> dict:
    """``default``: the layouts and value mixes of the brief.  ``stress``: small pools
    (eviction) most of the time, further multi-group layouts, block sizes that are not powers
    of two, Mamba blocks that are not a multiple of the attention block, lookahead without
    EAGLE and lookahead above the scheduler block.  ``tiny``: the stress mix with blocks of
    2-6 tokens, prompts of a few blocks and pools of a few dozen blocks, many requests.
    ``groups``: the stress mix on layouts with runs of several identical groups."""
    stress = profile in ("stress", "tiny", "groups")
    r = rng.random()
    if profile == "tiny":
        block = rng.choice([2, 2, 3, 4, 4, 6])
    else:
        block = rng.choice([2, 4, 8, 16, 32, 64] + ([6, 12, 24, 48] if stress else []))
    if profile == "groups":
        layout = list(rng.choice(MULTI_MEMBER_LAYOUTS))
    elif profile == "stress" and rng.random() < 0.4:
        layout = rng.choice([["full", "swa:W"], ["swa:W", "mamba"], ["mamba", "mamba"],
                             ["full", "full", "mamba"], ["mamba", "swa:W", "full"],
                             ["mamba", "full", "mamba"]])
    elif r < 0.66:
        layout = ["full", "mamba"]
    elif r < 0.77:
        layout = ["full", "mamba", "mamba"]
    elif r < 0.89:
        layout = ["full", "swa:W", "mamba"]
    else:
        layout = ["mamba", "full"]
    mult = rng.choice([1, 1, 1, 2, 4] + ([8, 1.5, 3, 2.5] if stress else []))
    mblock = int(block * mult)
    if mblock != block * mult:
        mult, mblock = 2, block * 2
    if "swa:W" in layout:
        w = rng.choice([block, 2 * block, 3 * block + rng.randint(1, block), rng.randint(1, 4 * block),
                        4 * mblock])
        layout = [f"swa:{max(1, w)}" if g == "swa:W" else g for g in layout]
    sizes = [block, mblock] if "mamba" in layout else [block]
    g = math.gcd(*sizes)
    sched = math.lcm(*sizes)
    r = rng.random()
    if r < 0.3:
        hash_bs = None
    elif r < 0.5:
        hash_bs = g
    else:
        hash_bs = rng.choice([d for d in _divisors(g) if d < g] or [g])
    eagle = rng.random() < 0.5
    lookahead = 0
    if eagle:
        r = rng.random()
        lookahead = 0 if r < 0.6 else (1 if r < 0.9 else 2)
    if stress:
        r = rng.random()
        if r < 0.05:
            lookahead = rng.choice([1, 2])  # with or without EAGLE
        elif r < 0.08:
            lookahead = rng.choice([3, 4, 5])
    r = rng.random()
    retention = None if r < 0.5 else (0 if r < 0.8 else sched * rng.randint(1, 4))
    r = rng.random()
    if r < 0.65:
        schedule: Any = "scheduler"
    elif r < 0.75:
        schedule = "blocks"
    elif r < 0.83:
        schedule = "whole"
    elif r < 0.9:
        schedule = "seed"
    else:
        schedule = "ENDS"  # filled in once the prompts are known
    lpt = 0 if rng.random() < 0.75 else rng.randint(1, 3 * sched)
    budget = BIG_BUDGET if rng.random() < 0.75 else rng.choice(
        [rng.randint(1, 3 * sched), sched * rng.randint(1, 3), rng.randint(1, max(1, block))])
    r = rng.random()
    report_mode = None if r < 0.78 else ("full" if r < 0.95 else "incremental")
    small_pool = 0.2 if profile == "default" else 0.7
    num_blocks = rng.randint(256, 1024) if rng.random() >= small_pool else rng.randint(16, 64)
    if profile == "tiny" and num_blocks < 256:
        num_blocks = rng.randint(6, 40)
    if stress and rng.random() < 0.05:
        num_blocks = rng.randint(2, 16)
    cfg: dict[str, Any] = {"groups": layout, "block_size": block}
    if "mamba" in layout and (mult > 1 or rng.random() < 0.3):
        cfg["mamba_block_size"] = mblock
    if hash_bs is not None:
        cfg["hash_block_size"] = hash_bs
    cfg.update({
        "eagle": eagle, "shared_prefix_checkpoint": rng.random() < 0.4,
        "mamba_cache_mode": "align", "num_blocks": num_blocks, "schedule": schedule,
        "long_prefill_token_threshold": lpt, "max_num_batched_tokens": budget,
        "report_mode": report_mode, "prefix_cache_retention_interval": retention,
        "num_hash_lookahead_tokens": lookahead,
    })
    # A few deliberately invalid configurations exercise validation agreement.
    r = rng.random()
    if r < 0.015:
        cfg["hash_block_size"] = g + 1 if g > 1 else 3
    elif r < 0.03:
        cfg["prefix_cache_retention_interval"] = sched + rng.randint(1, max(1, sched - 1))
    return cfg


def _sizes(cfg: dict) -> tuple[int, int, int]:
    block = cfg["block_size"]
    mblock = (cfg.get("mamba_block_size") or block) if "mamba" in cfg["groups"] else block
    sched = math.lcm(block, mblock)
    h = cfg.get("hash_block_size") or math.gcd(block, mblock)
    return sched, h, block


def pick_len(rng: random.Random, sched: int, h: int, max_units: float = 6.0, lo: int = 1) -> int:
    hi = max(lo, int(max_units * sched))
    r = rng.random()
    if r < 0.3:
        n = rng.randint(lo, hi)
    elif r < 0.65:
        n = rng.randint(1, max(1, int(max_units))) * sched + rng.choice([-h, -1, 0, 0, 1, h])
    else:
        n = rng.randint(1, max(1, hi // h)) * h + rng.choice([-1, 0, 0, 1])
    return max(lo, min(n, hi))


def gen_requests(rng: random.Random, cfg: dict, profile: str = "default") -> list[list[Segment]]:
    sched, h, _ = _sizes(cfg)
    # Keep prompts short enough to be cheap (and to fit a small pool most of the time).
    cap = 2500
    max_units = min(6.0 if profile != "tiny" else 4.0, cap / (2 * sched))
    names = iter(f"C{i}" if i else "C" for i in range(100))
    turns = iter(f"T{i}" for i in range(1, 100))
    sys_len = pick_len(rng, sched, h, max_units)
    priv = 0 if rng.random() < 0.15 else pick_len(rng, sched, h, max_units / 2)
    reqs: list[list[Segment]] = [normalise([("S", 0, sys_len), ("P", 0, priv)])]
    counts = {"default": [1, 1, 2, 2, 3, 4], "stress": [2, 3, 4, 5, 6], "groups": [2, 3, 4, 5, 6],
              "tiny": [2, 3, 4, 5, 6, 7, 8]}[profile]
    for _ in range(rng.choice(counts)):
        kind = rng.choices(["shared", "replay", "prefix", "extend", "multiturn", "fresh", "splice"],
                           [35, 12, 15, 12, 18, 8, 0 if profile == "default" else 10])[0]
        base = rng.choice(reqs)
        if kind == "shared":
            r = rng.random()
            n = sys_len if r < 0.6 else pick_len(rng, sched, h, max_units)
            segs = [("S", 0, n), (next(names), 0, pick_len(rng, sched, h, max_units / 2))]
        elif kind == "replay":
            segs = list(base)
        elif kind == "prefix":
            n = prompt_len(base)
            segs = truncate(base, max(1, min(n, pick_len(rng, sched, h, max(1.0, n / sched)))))
        elif kind == "extend":
            segs = list(base) + [(next(names), 0, pick_len(rng, sched, h, max_units / 2))]
        elif kind == "multiturn":
            segs = list(reqs[-1]) + [(next(turns), 0, pick_len(rng, sched, h, max_units / 3))]
        elif kind == "splice":
            # a prefix of one request, then a piece of another from the middle of its stream
            other = rng.choice(reqs)
            name, off, ln = rng.choice(other)
            cut = rng.randint(0, ln - 1)
            segs = truncate(base, rng.randint(1, prompt_len(base))) + [(name, off + cut, ln - cut)]
        else:
            segs = [(next(names), 0, pick_len(rng, sched, h, max_units))]
        if prompt_len(segs) > cap:
            segs = truncate(segs, cap)
        reqs.append(normalise(segs))
    return reqs


def gen_case(seed: int, index: int, profile: str = "default") -> dict:
    """Case ``index`` of ``seed`` in ``profile`` (see ``gen_config``; ``ckpt``: the default
    case of the same index with internal prefill checkpoints, ``with_checkpoints``)."""
    if profile == "ckpt":
        return with_checkpoints(gen_case(seed, index), seed, index)
    tag = "" if profile == "default" else f":{profile}"
    rng = random.Random(f"diff_vllm:{seed}:{index}{tag}")
    cfg = gen_config(rng, profile)
    reqs = gen_requests(rng, cfg, profile)
    if cfg["schedule"] == "ENDS":
        n = max(prompt_len(r) for r in reqs)
        k = rng.randint(1, 5)
        cfg["schedule"] = sorted(set(rng.randint(1, max(1, n)) for _ in range(k)))
    if cfg["num_blocks"] < 256:
        # A small pool: mostly big enough for the producer (eviction across requests), sometimes
        # not (both sides must fail the same way).
        sched, _h, block = _sizes(cfg)
        need = len(cfg["groups"]) * (prompt_len(reqs[0]) // block + 3)
        if rng.random() < 0.85 and cfg["num_blocks"] < need:
            cfg["num_blocks"] = min(1024, need + rng.randint(0, 16))
    return {"config": cfg, "requests": reqs}


def with_checkpoints(spec: dict, seed: int, index: int) -> dict:
    """Profile ``ckpt``: vLLM's internal prefill checkpoints (``MambaSpec``'s
    ``num_prefill_checkpoint_blocks`` / ``prefill_checkpoint_alignment``, which MambaMixer2
    sets to 1 and 1) on in ~70 % of cases; their alignment is 1 (sometimes left to its
    default), sometimes the hash unit or 16.  The rest say 0 or leave the keys out."""
    rng = random.Random(f"diff_vllm:{seed}:{index}:ckpt")
    cfg = spec["config"]
    draw_prefill_checkpoints(rng, cfg, _sizes(cfg)[1])
    return spec


# ------------------------------------------------------------------------- shrinking --
def shrink_candidates(spec: dict) -> list[dict]:
    """Simpler variants of a case: fewer requests, default config values, smaller blocks
    with every length scaled down, shorter streams."""
    cands: list[dict] = []
    cfg = spec["config"]
    reqs = spec["requests"]

    def with_cfg(**kw) -> None:
        s = copy.deepcopy(spec)
        for k, v in kw.items():
            if v is None and k in ("mamba_block_size", "hash_block_size"):
                s["config"].pop(k, None)
            else:
                s["config"][k] = v
        cands.append(s)

    # 1. fewer requests (keep the producer and at least one consumer)
    for i in range(len(reqs) - 1, 0, -1):
        if len(reqs) > 2:
            s = copy.deepcopy(spec)
            del s["requests"][i]
            cands.append(s)
    # 2. default config values
    if cfg.get("report_mode") is not None:
        with_cfg(report_mode=None)
    if cfg.get("prefix_cache_retention_interval") is not None:
        with_cfg(prefix_cache_retention_interval=None)
    if cfg.get("long_prefill_token_threshold"):
        with_cfg(long_prefill_token_threshold=0)
    if cfg.get("max_num_batched_tokens") != BIG_BUDGET:
        with_cfg(max_num_batched_tokens=BIG_BUDGET)
    if cfg.get("schedule") != "scheduler":
        with_cfg(schedule="scheduler")
        if isinstance(cfg.get("schedule"), list) and len(cfg["schedule"]) > 1:
            for k in range(len(cfg["schedule"])):
                with_cfg(schedule=cfg["schedule"][:k] + cfg["schedule"][k + 1:])
    if cfg.get("num_prefill_checkpoint_blocks"):
        with_cfg(num_prefill_checkpoint_blocks=0)
    if cfg.get("prefill_checkpoint_alignment", 1) != 1:
        with_cfg(prefill_checkpoint_alignment=1)
    if cfg.get("shared_prefix_checkpoint"):
        with_cfg(shared_prefix_checkpoint=False)
    if cfg.get("num_hash_lookahead_tokens"):
        with_cfg(num_hash_lookahead_tokens=0)
        if cfg["num_hash_lookahead_tokens"] > 1:
            with_cfg(num_hash_lookahead_tokens=1)
    if cfg.get("eagle") and not cfg.get("num_hash_lookahead_tokens"):
        with_cfg(eagle=False)
    if cfg.get("num_blocks") != 256:
        with_cfg(num_blocks=256)
    if cfg.get("groups") != ["full", "mamba"]:
        with_cfg(groups=["full", "mamba"])
        if len(cfg["groups"]) == 3:
            for k in range(3):
                g = cfg["groups"][:k] + cfg["groups"][k + 1:]
                if "mamba" in g:
                    with_cfg(groups=g)
    if cfg.get("hash_block_size") is not None:
        with_cfg(hash_block_size=None)
    mb = cfg.get("mamba_block_size")
    if mb is not None:
        with_cfg(mamba_block_size=None)
        if mb // cfg["block_size"] == 4:
            with_cfg(mamba_block_size=mb // 2)
    # 3. smaller block sizes with every length scaled down
    b = cfg["block_size"]
    if b >= 4:
        s = copy.deepcopy(spec)
        sc = s["config"]
        ok = True
        for k in ("block_size", "mamba_block_size", "hash_block_size",
                  "prefix_cache_retention_interval"):
            v = sc.get(k)
            if v:
                if v % 2:
                    ok = False
                sc[k] = v // 2
        for g_i, g in enumerate(sc["groups"]):
            if g.startswith("swa:"):
                sc["groups"][g_i] = f"swa:{max(1, int(g[4:]) // 2)}"
        for k in ("long_prefill_token_threshold", "max_num_batched_tokens"):
            if sc.get(k) and sc[k] != BIG_BUDGET:
                sc[k] = max(1, sc[k] // 2)
        if isinstance(sc.get("schedule"), list):
            sc["schedule"] = sorted({max(1, e // 2) for e in sc["schedule"]})
        s["requests"] = [normalise([(n, o // 2, (o + ln) // 2 - o // 2) for n, o, ln in segs])
                         for segs in s["requests"]]
        if ok and all(s["requests"]):
            cands.append(s)
    # 4. shorter streams: shorten every segment of one stream ending at the same length
    ends: dict[tuple[str, int], None] = {}
    for segs in reqs:
        for n, o, ln in segs:
            ends[(n, o + ln)] = None
    unit = cfg.get("hash_block_size") or 1
    for (name, end) in ends:
        for new_end in sorted({0, end // 2, end - unit, end - 1}):
            if new_end < 0 or new_end >= end:
                continue
            s = copy.deepcopy(spec)
            new_reqs = []
            for segs in s["requests"]:
                out = []
                for n, o, ln in segs:
                    if n == name and o + ln == end:
                        ln = max(0, new_end - o)
                    out.append((n, o, ln))
                new_reqs.append(normalise(out))
            if all(new_reqs):
                s["requests"] = new_reqs
                cands.append(s)
    return cands
