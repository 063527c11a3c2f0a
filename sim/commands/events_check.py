"""``sim events check FILE``: what a KV-aware router learns from a KV event stream, and
where that is wrong.

A router that trusts the stream keeps, per (group, hash), whether the key is cached: a
``BlockStored`` adds its keys, a ``BlockRemoved`` deletes them (one entry per key, as
routers' indexes do).  The cache itself holds a key in as many blocks as stored it and not
removed it yet.  The check replays the stream into both and reports:

* keys removed that were never stored (or removed more often than stored): a stream cut
  at its start, or lost events;
* keys published that were never stored: vLLM 0.33.0's ``report_mode: full``
  announcements name every position of a hit list -- null Mamba / sliding-window blocks,
  a partly hit tail block -- keys no block holds (``BlockStored`` from
  ``emit_cached_block_events``);
* keys removed while another block still holds them (a prefix stored twice, e.g. by a
  recompute after preemption): a router keeping one entry per key forgets them;
* the requests whose reuse such a router misjudges: at each request's first prefix lookup,
  the reuse the router computes from its index (attention groups: every block key up to the
  point; Mamba groups: the key at the point; on the grid of every group's block) against
  what it would compute from the cache's true keys, and what vLLM reused.

Our streams (``sim run --kv-events``) say which ``BlockStored`` is an announcement and
carry each request's lookup (``sim`` fields).  A stream captured from a real vLLM has
neither: an event that starts at the root (no parent) and names a key already cached is
taken for an announcement, and requests are not judged.
Reads JSONL (our lines, or msgspec's ``[ts, events, rank]`` arrays) or the msgpack frames
of ``kv_events.msgpack``.  An empty stream (no line or frame; blank lines only) is an
error, exit 2: it proves nothing, and is most often a capture that failed.
"""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from sim.errors import InputError


class EventStreamError(InputError):
    """An unreadable stream: one line naming the file and the line."""


EXAMPLES = 5


@dataclass
class Report:
    path: str
    batches: int = 0
    events: Counter = field(default_factory=Counter)
    annotated: bool = False
    removed_never_stored: int = 0
    removed_more_than_stored: int = 0
    published_never_stored: int = 0
    announcements_with_phantoms: int = 0
    removed_while_cached: int = 0
    lookups: int = 0
    misjudged: list[dict] = field(default_factory=list)
    examples: dict[str, list] = field(default_factory=dict)
    error: dict | None = None

    @property
    def problems(self) -> bool:
        return bool(self.removed_never_stored or self.removed_more_than_stored
                    or self.published_never_stored or self.removed_while_cached
                    or self.misjudged or self.error)

    def example(self, kind: str, item: Any) -> None:
        got = self.examples.setdefault(kind, [])
        if len(got) < EXAMPLES:
            got.append(item)

    def as_dict(self) -> dict:
        return {"file": self.path, "batches": self.batches, "events": dict(self.events),
                "annotated": self.annotated,
                "removed_never_stored": self.removed_never_stored,
                "removed_more_than_stored": self.removed_more_than_stored,
                "published_never_stored": self.published_never_stored,
                "announcements_with_phantoms": self.announcements_with_phantoms,
                "removed_while_cached": self.removed_while_cached,
                "lookups": self.lookups, "misjudged": self.misjudged,
                "examples": self.examples, "error": self.error}

    def text(self) -> str:
        ev = self.events
        lines = [f"{self.path}: {self.batches:,} batches, {sum(ev.values()):,} events "
                 f"(BlockStored {ev['BlockStored']:,}, BlockRemoved {ev['BlockRemoved']:,}, "
                 f"AllBlocksCleared {ev['AllBlocksCleared']:,})"]
        lines.append(f"  keys removed that were never stored: {self.removed_never_stored:,}"
                     + (f" (and {self.removed_more_than_stored:,} removed more often than "
                        f"stored)" if self.removed_more_than_stored else ""))
        lines.append(f"  keys published that were never stored: {self.published_never_stored:,}"
                     + (f" (in {self.announcements_with_phantoms:,} announced hits)"
                        if self.published_never_stored else ""))
        lines.append(f"  keys removed while another block still holds them: "
                     f"{self.removed_while_cached:,}")
        if not self.annotated:
            lines.append("  requests: not judged (the stream names no requests; "
                         "sim run --kv-events writes them)")
        else:
            lines.append(f"  requests a router trusting the stream misjudges: "
                         f"{len(self.misjudged):,} of {self.lookups:,}")
            for m in self.misjudged[:20]:
                lines.append(f"    {m['req']}: router {m['router']:,} tokens, cache "
                             f"{m['cache']:,} ({m['router'] - m['cache']:+,}); vLLM reused "
                             f"{m['vllm_hit']:,}")
            if len(self.misjudged) > 20:
                lines.append(f"    ... {len(self.misjudged) - 20:,} more (--json lists all)")
        if self.error:
            e = self.error
            lines.append(f"  vLLM raised {e.get('type')} announcing the hit of request "
                         f"{show(e.get('request'))} (group {e.get('group')}): its engine dies "
                         f"there and the stream ends")
        return "\n".join(lines)


# ------------------------------------------------------------------------ reading --
def _batches(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, batch) for every line / frame; a batch is a dict with ``events``
    (and maybe ``ts``, ``sim``), or a header / trailer dict."""
    try:
        if path.suffix == ".msgpack":
            yield from _frames(path)
            return
        from sim.config.loader import open_input

        with open_input(path, EventStreamError, text=True) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise EventStreamError(f"{path}:{n}: not JSON ({e.msg})") from None
                if isinstance(obj, list):      # msgspec's array form of an EventBatch
                    if len(obj) < 2 or not isinstance(obj[1], list):
                        raise EventStreamError(f"{path}:{n}: expected [ts, events, ...]")
                    obj = {"ts": obj[0], "events": obj[1]}
                if not isinstance(obj, dict):
                    raise EventStreamError(f"{path}:{n}: expected an object or an array")
                yield n, obj
    except OSError as e:
        raise EventStreamError(f"{path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise EventStreamError(f"{path}: not UTF-8 text (a .msgpack file is read as frames)"
                               ) from None


def _frames(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        import msgpack
    except ImportError:
        raise EventStreamError(f"{path}: reading msgpack frames needs the msgpack package "
                               f"(pip install msgpack)") from None
    from sim.config.loader import open_input

    with open_input(path, EventStreamError) as f:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
        for n, frame in enumerate(unpacker, 1):
            try:
                _topic, _seq, payload = frame
                batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                yield n, {"ts": batch[0], "events": batch[1]}
            except (ValueError, TypeError, IndexError, msgpack.UnpackException):
                raise EventStreamError(f"{path}: frame {n}: expected [topic, seq, payload] "
                                       f"with a KVEventBatch payload") from None


def _key(h: Any) -> Any:
    return tuple(h) if isinstance(h, list) else h


# ------------------------------------------------------------------------ judging --
class _Groups:
    """The layout from our header: how a router computes reuse from keys on the grid."""

    def __init__(self, header: dict):
        self.groups = [(g.get("kind", "full"), int(g["block_size"]), g.get("window"))
                       for g in header.get("groups", [])]
        self.grid = int(header.get("lookup_grid") or 1)

    def reuse(self, keys: list, present) -> int:
        """The longest prefix (on the grid, below the prompt's last token) that every group
        can resume from, as vLLM's lookup decides it from keys: an attention group holds the
        key of every block up to the one it falls in (or, inside its first missing block,
        the key at it: a partial entry), a Mamba group the key at it, a sliding-window group
        the keys of the blocks in its window."""
        g = self.grid
        n = len(keys)
        top = n * g
        runs = []          # per attention group: (its block, its run of block keys, tokens)
        for gid, (kind, b, _) in enumerate(self.groups):
            if kind != "full":
                continue
            j = b
            while j <= top and present(gid, keys[j // g - 1]):
                j += b
            runs.append((gid, b, j - b))
            top = min(top, j - g)      # at most inside the first block it misses
        p = top // g * g
        while p > 0:
            ok = True
            for gid, b, run in runs:
                if -(-p // b) * b > run and not present(gid, keys[p // g - 1]):
                    ok = False
                    break
            if ok:
                for gid, (kind, b, window) in enumerate(self.groups):
                    if kind == "mamba" and not present(gid, keys[p // g - 1]):
                        ok = False
                        break
                    if kind == "swa":
                        lo = max(b, (p - (window or b)) // b * b + b)
                        if any(not present(gid, keys[q // g - 1]) for q in range(lo, p + 1, b)):
                            ok = False
                            break
            if ok:
                return p
            p -= g
        return 0


def _guess_sources(events: list, i: int, sources: list, cached: Counter,
                   num_groups: int) -> None:
    """Without our annotations, where ``events[i]`` (a ``BlockStored``) came from.  vLLM
    announces a hit (``report_mode: full``) group after group: a run of root events (no
    parent) over the same tokens, one for each of the ``num_groups`` groups, each naming a
    key for every block of the tokens (null blocks included, where a store skips them),
    some group a key a block holds (it is a hit; a Mamba group's list may name none).
    Anything else is a store."""
    ev = events[i]
    if ev.get("parent_block_hash") is not None:
        sources[i] = "store"
        return
    j = i + 1
    groups = {ev.get("group_idx") or 0}
    while j < len(events):
        e = events[j]
        g = e.get("group_idx") or 0
        if (e.get("type") != "BlockStored" or e.get("parent_block_hash") is not None
                or e.get("token_ids") != ev.get("token_ids") or g in groups):
            break
        groups.add(g)
        j += 1
    def every_block(e: dict) -> bool:
        n, b = len(e.get("token_ids") or []), e.get("block_size") or 1
        k = len(e.get("block_hashes") or [])
        return not n or (k - 1) * b < n <= k * b

    hit = j - i >= num_groups and all(every_block(e) for e in events[i:j]) and any(
        cached[((e.get("group_idx") or 0), _key(h))] > 0
        for e in events[i:j] for h in e.get("block_hashes") or [])
    for k in range(i, j):
        sources[k] = "announce" if hit else "store"


def check_stream(path: str | Path) -> Report:
    path = Path(path)
    rep = Report(str(path))
    cached: Counter = Counter()       # (group, hash) -> blocks holding it
    ever: set = set()                 # (group, hash) stored at some point
    router: set = set()               # what a router trusting the stream holds
    groups: _Groups | None = None
    num_groups = 1                    # the groups seen so far

    def judge(lookups: list[dict]) -> None:
        for lk in lookups:
            rep.lookups += 1
            if groups is None:
                continue
            keys = lk.get("keys") or []
            r = groups.reuse(keys, lambda gid, h: (gid, _key(h)) in router)
            c = groups.reuse(keys, lambda gid, h: cached[(gid, _key(h))] > 0)
            if r != c:
                rep.misjudged.append({"req": lk.get("req"), "router": r, "cache": c,
                                      "vllm_hit": lk.get("hit", 0)})

    seen = 0
    for n, obj in _batches(path):
        seen += 1
        if "kv_events_header" in obj:
            groups = _Groups(obj["kv_events_header"])
            num_groups = max(num_groups, len(groups.groups))
            continue
        sim = obj.get("sim") or {}
        if sim:
            rep.annotated = True
        judge(sim.get("lookups") or [])
        if "kv_events_error" in obj:
            rep.error = obj["kv_events_error"]
        events = obj.get("events")
        if events is None:
            continue
        if not isinstance(events, list):
            raise EventStreamError(f"{path}:{n}: events: expected a list")
        rep.batches += 1
        sources = list(sim.get("source") or [None] * len(events))
        for i, ev in enumerate(events):
            if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
                raise EventStreamError(f"{path}:{n}: event {i}: expected an object with a type")
            t = ev["type"]
            rep.events[t] += 1
            gid = ev.get("group_idx") or 0
            num_groups = max(num_groups, gid + 1)
            hashes = [_key(h) for h in ev.get("block_hashes") or []]
            if t == "BlockStored":
                src = sources[i] if i < len(sources) else None
                if src is None:
                    _guess_sources(events, i, sources, cached, num_groups)
                    src = sources[i]
                phantoms = 0
                for h in hashes:
                    k = (gid, h)
                    router.add(k)
                    if src == "announce":
                        if cached[k] == 0:
                            phantoms += 1
                            rep.example("published_never_stored", {"line": n, "group": gid,
                                                                   "hash": h})
                    else:
                        cached[k] += 1
                        ever.add(k)
                rep.published_never_stored += phantoms
                rep.announcements_with_phantoms += phantoms > 0
            elif t == "BlockRemoved":
                for h in hashes:
                    k = (gid, h)
                    router.discard(k)
                    if cached[k] == 0:
                        if k in ever:
                            rep.removed_more_than_stored += 1
                        else:
                            rep.removed_never_stored += 1
                            rep.example("removed_never_stored", {"line": n, "group": gid,
                                                                 "hash": h})
                        continue
                    cached[k] -= 1
                    if cached[k] > 0:
                        rep.removed_while_cached += 1
                        rep.example("removed_while_cached", {"line": n, "group": gid, "hash": h})
            elif t == "AllBlocksCleared":
                cached.clear()
                router.clear()
            else:
                raise EventStreamError(f"{path}:{n}: event {i}: unknown type {show(t)}")
    if not seen:
        # nothing to judge is not a sound stream: a capture that failed, a file cut to
        # nothing, the wrong file (sim run --kv-events writes a header line at least)
        raise EventStreamError(f"{path}: empty: no event batch (nor header) to check; a "
                               f"stream sim run --kv-events wrote starts with its header")
    return rep
