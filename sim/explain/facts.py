"""What one prefix lookup saw, read off the live cache at the moment of the lookup.

``gather`` is called with the pool exactly as the scheduler's (or the case runner's)
``get_computed_blocks`` sees it, and changes nothing: it repeats the lookup, asks every
KV-cache group alone how far it reaches (vLLM's ``find_longest_cache_hit`` per group,
``coordinator.find_per_group``), asks it again without the EAGLE drop and again capped at
the shortest group's reach (which group set the reconciled hit), lists the Mamba states
this prefix has in the pool (``kv.cached_positions``) and classifies every position on
the Mamba lookup grid between the nearest state and the attention's reach: why no state
is there.  The classification needs two things the pool alone does not know, handed in
by the caller: how far earlier requests computed this prefix (``Reach``) and which
request's allocation evicted a key, when (the pool's ``EvictionLog``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from sim.cache.block_pool import make_key

#: why no Mamba state sits at a position (``Gap.reason``), in the order they are tested
REASONS = ("evicted", "never_computed", "in_flight", "align_grid", "retention", "no_chunk_end")
#: why a full-attention group's cached run stops where it does (``GroupFacts.stop``)
STOPS = ("prompt_end", "evicted", "never_computed", "in_flight", "not_cached")
#: grid positions classified at most (a 2M-token prompt on a 64-token grid: 31k)
MAX_GAPS = 50_000


class Reach(Protocol):
    """How far requests looked up before this one computed its prefix."""

    def reach(self, req) -> tuple[int, str | None, int, str | None]:
        """(tokens of ``req``'s prefix some earlier request computed, that request's id,
        tokens of it a request still computing its prompt will have computed, its id)."""


@dataclass
class Gap:
    """A position on the Mamba lookup grid with no state, and why."""

    position: int
    reason: str                       # one of REASONS
    evicted_by: str | None = None     # reason evicted: the request whose allocation evicted it
    evicted_at_ns: int | None = None  # ... and when (engine clock; None in case files)


@dataclass
class GroupFacts:
    """One KV-cache group's view of the prefix."""

    group: int
    kind: str                   # full | swa:W | mamba
    block_size: int
    alone: int | None           # its hit looked up alone (with its own EAGLE drop); None: raised
    without_drop: int | None    # an EAGLE-drop attention group: its hit before the drop
    capped: int | None          # its hit when asked for at most the shortest group's reach
    stop: dict | None = None    # full attention: the next block's position and why it missed


@dataclass
class MambaFacts:
    """The Mamba states of this prefix and why none sits closer to the attention's reach."""

    group: int
    block_size: int
    grid: int                   # positions a state can be hit at (hash unit or block)
    states: list[int]           # cached state positions of this prefix, up to the hit cap
    reach: int                  # what the attention groups reached (the most Mamba is asked for)
    nearest: int                # the nearest state at or below ``reach`` (0: none)
    gaps: list[Gap] = field(default_factory=list)   # (nearest, reach] on the grid, top first


@dataclass
class Facts:
    """Everything ``sim explain`` says about one lookup (``render.as_dict`` documents it)."""

    request_id: str
    prompt_tokens: int
    hit: int
    junction: int
    max_hit: int                # prompt - 1: the last token is always computed
    hashed_tokens: int          # tokens covered by the request's keys (lookahead holds some back)
    hash_unit: int
    align: int                  # the grid a reconciled hit lands on
    lookahead: int              # num_hash_lookahead_tokens (EAGLE with lookahead hashes)
    eagle_drop: bool            # the legacy EAGLE drop is on
    junction_applies: bool      # the junction flag would act here (EAGLE, partial hits, no MTP)
    retention: int | None
    caching: bool               # prefix caching on
    cache: str                  # vllm | ideal (an unlimited cache, no groups rules) | off
    groups: list[GroupFacts]
    per_group_error: str | None
    capped_by: list[int]        # group ids whose lookup set the reconciled hit
    mamba: MambaFacts | None
    computed: int               # tokens of this prefix some earlier request computed
    computed_by: str | None
    in_flight: int              # tokens of it a request still computing its prompt will reach
    in_flight_by: str | None
    settings: dict = field(default_factory=dict)   # the three switches the what-ifs flip
    time_ns: int | None = None  # the lookup's engine time (runs)


Evicted = Callable[[int], "tuple[int, str] | None"]


def gather(kv, req, history: Reach, evicted: Evicted | None) -> Facts:
    """The facts of ``req``'s lookup on ``kv`` as it is now (nothing is changed)."""
    c = kv.coordinator
    keys = req.block_hashes
    h = kv.hash_block_size
    max_hit = req.num_tokens - 1
    lookup = kv.get_computed_blocks(req)    # (an IndexError here: the caller reports it)
    computed, computed_by, in_flight, in_flight_by = history.reach(req)
    groups, err = _groups(kv, req, max_hit)
    facts = Facts(
        request_id=req.request_id, prompt_tokens=req.num_prompt_tokens, hit=lookup.hit,
        junction=lookup.junction, max_hit=max_hit, hashed_tokens=keys.count * h, hash_unit=h,
        align=c.align, lookahead=keys.lookahead, eagle_drop=bool(c.drop_eagle_group_ids),
        junction_applies=bool(c.eagle_group_ids) and c.partial_hits and c.reprefillable == 0,
        retention=c.retention,
        caching=bool(kv.enable_caching),
        cache="off" if not kv.enable_caching else "vllm" if c.spec_groups else "ideal",
        groups=groups, per_group_error=err, capped_by=[],
        mamba=None, computed=computed, computed_by=computed_by, in_flight=in_flight,
        in_flight_by=in_flight_by,
        settings={"enable_mamba_shared_prefix_checkpoint": kv.cfg.shared_prefix_checkpoint,
                  "prefix_cache_retention_interval": kv.cfg.prefix_cache_retention_interval,
                  "hash_block_size": h, "scheduler_block_size": c.scheduler_block_size})
    if not facts.caching or err is not None or not c.spec_groups:
        return facts          # (caching off, the ideal cache, or vLLM's probe raised)
    facts.capped_by = _capping(facts)
    for g in groups:
        if g.kind == "full":
            g.stop = _attention_stop(kv, req, g, facts, evicted)
    facts.mamba = _mamba(kv, req, facts, evicted)
    return facts


def _groups(kv, req, max_hit: int) -> tuple[list[GroupFacts], str | None]:
    c = kv.coordinator
    try:
        alone = kv.per_group_hits(req)
    except IndexError as e:      # vLLM's per-group probe raises on some EAGLE shapes
        alone, err = None, f"{type(e).__name__}: {e}"
    else:
        err = None
    specs = c.specs
    out = [GroupFacts(gid, s.label, c.manager_of[gid].block_size,
                      alone[gid] if alone is not None else None, None, None)
           for gid, s in enumerate(specs)]
    if alone is None or not c.spec_groups:
        return out, err
    keys = req.block_hashes
    floor = min(alone)
    for g in c.spec_groups:
        gid = g.group_ids[0]
        m = c.manager_of[gid]
        capped = c.find_per_group(keys, floor, (g.spec.kind,))[gid]
        nodrop = None
        if g.use_eagle and g.spec.kind != "mamba":
            nodrop = m.find(keys, max_hit, g.group_ids, False, c.align)[1]
        for member in g.group_ids:
            out[member].capped = capped
            out[member].without_drop = nodrop
    return out, err


def ceiling(f: Facts) -> int:
    """The longest hit this prompt allows: below its last token, within its keys, on the
    hit grid."""
    return min(f.max_hit, f.hashed_tokens) // f.align * f.align


def _capping(f: Facts) -> list[int]:
    """The groups whose lookup set the reconciled hit: those reaching exactly the hit when
    asked for at most the shortest group's reach, the one(s) reaching least alone first;
    none when the hit is as long as the prompt allows."""
    if f.hit >= ceiling(f) and f.hit > 0:
        return []
    at_hit = [g for g in f.groups if g.capped == f.hit]
    if not at_hit:
        low = min(g.capped for g in f.groups if g.capped is not None)
        return [g.group for g in f.groups if g.capped == low]
    least = min(g.alone for g in at_hit if g.alone is not None)
    return [g.group for g in at_hit if g.alone == least]


def _evicted_gap(key: int, evicted: Evicted | None) -> tuple[int, str] | None:
    return evicted(key) if evicted is not None else None


def _attention_stop(kv, req, g: GroupFacts, f: Facts, evicted: Evicted | None) -> dict:
    """Where a full-attention group's run of cached blocks ends and why the next block
    missed: the prompt ends there, it was evicted (by whom, when), no earlier request
    computed it, or it was computed but is not cached (in flight)."""
    reached = g.without_drop if g.without_drop is not None else (g.alone or 0)
    bs = g.block_size
    nxt = (reached // bs + 1) * bs
    keys = req.block_hashes
    if nxt > f.max_hit or nxt > f.hashed_tokens:
        return {"position": nxt, "reason": "prompt_end"}
    key = make_key(keys.key(nxt // f.hash_unit - 1), g.group)
    got = _evicted_gap(key, evicted)
    if got is not None:
        return {"position": nxt, "reason": "evicted", "evicted_at_ns": got[0],
                "evicted_by": got[1]}
    if f.computed < nxt <= f.in_flight:
        return {"position": nxt, "reason": "in_flight", "by": f.in_flight_by}
    if f.computed < nxt:
        return {"position": nxt, "reason": "never_computed"}
    return {"position": nxt, "reason": "not_cached"}


def _mamba(kv, req, f: Facts, evicted: Evicted | None) -> MambaFacts | None:
    mamba = [g for g in f.groups if g.kind == "mamba"]
    if not mamba:
        return None
    gid = mamba[0].group
    bs = mamba[0].block_size
    states = [p for p in kv.cached_positions(req, gid) if p <= f.max_hit]
    attention = [g.alone for g in f.groups if g.kind != "mamba" and g.alone is not None]
    reach = min(attention) if attention else ceiling(f)
    nearest = max((p for p in states if p <= reach), default=0)
    grid = f.align
    mf = MambaFacts(gid, bs, grid, states, reach, nearest)
    keys = req.block_hashes
    h = f.hash_unit
    top = reach // grid * grid
    stop = max(nearest, top - grid * MAX_GAPS)
    ret = f.retention
    for p in range(top, stop, -grid):
        idx = p // h - 1
        got = _evicted_gap(make_key(keys.key(idx), gid), evicted) if idx < keys.count else None
        if got is not None:
            mf.gaps.append(Gap(p, "evicted", got[1], got[0]))
        elif p > f.computed:
            mf.gaps.append(Gap(p, "in_flight" if p <= f.in_flight else "never_computed"))
        elif p % bs:
            mf.gaps.append(Gap(p, "align_grid"))
        elif ret is not None and (ret == 0 or p % ret):
            mf.gaps.append(Gap(p, "retention"))
        else:
            mf.gaps.append(Gap(p, "no_chunk_end"))
    return mf
