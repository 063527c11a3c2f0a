"""``sim run --kv-events``: the KV cache events vLLM 0.33.0 publishes, in the run folder.

The cache model queues vLLM's events where vLLM does (``sim/cache/events.py``); this module
writes them as vLLM's wire records, one batch per engine step:

* ``kv_events.jsonl``: a header line ``{"kv_events_header": {...}}`` (the groups, the hash
  unit, the switches), then one line per published batch ``{"seq", "ts", "events": [...],
  "data_parallel_rank": 0, "sim": {...}}``.  ``ts`` is the simulated time of the step (s),
  ``events`` are ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` with vLLM's
  field names (``block_hashes``, ``parent_block_hash``, ``token_ids``, ``block_size``,
  ``lora_id``, ``medium``, ``lora_name``, ``extra_keys``, ``group_idx``,
  ``lookahead_token_ids``; defaults omitted, as vLLM's encoder omits them).  ``sim`` is ours,
  for tools that judge the stream (``sim events check``): per event the request that queued a
  ``BlockStored`` and where it came from (full | partial | announce), and each request's first
  prefix lookup with its hit and its keys on the block grid.  If vLLM would have raised (an
  announced hit, ``IndexError``), a last line ``{"kv_events_error": {...}}`` says so; vLLM's
  engine dies there, so nothing after it is published (the replay itself goes on).
* ``kv_events.msgpack`` (``kv_events.msgpack: true``, needs the ``msgpack`` package): the
  frames vLLM's ZMQ publisher sends, one msgpack array ``[topic, seq, payload]`` of three
  byte strings per batch: ``seq`` is 8 bytes big-endian, ``payload`` the msgpack of
  ``KVEventBatch`` (``[ts, [events], data_parallel_rank]``), byte for byte what
  ``msgspec`` encodes.

Hashes are the simulator's 57-bit prefix keys (vLLM publishes 64-bit ints by default);
token ids are synthetic: token ``p`` of stream ``s`` is ``z(s) * 2**24 + p`` with
``z(s) = 2s`` for a named stream (``s >= 1``) and ``-2s - 1`` for a trace's hash-id stream
(``s <= -2``); literal token ids are themselves.  Equal prefixes have equal ids, so an indexer
that hashes token ids itself sees the same sharing.  They make most of the stream (every
group's ``BlockStored`` lists the tokens of its whole range): ``kv_events.token_ids: false``
leaves them empty.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable

from sim.cache.events import Event, KVEventLog, Removed, Stored
from sim.cache.hashing import LITERAL, PrefixKeys

JSONL = "kv_events.jsonl"
MSGPACK = "kv_events.msgpack"
MEDIUM = "GPU"
VLLM = "0.33.0"


def token_ids(keys: PrefixKeys, start: int, end: int) -> list[int]:
    """The synthetic token ids of tokens ``[start, end)`` (see the module docstring)."""
    out: list[int] = []
    end = min(end, keys.total)
    if start >= end:
        return out
    begins = keys.begins
    last = len(begins) - 1
    r = keys.locate(start + 1)
    p = start
    while p < end:
        stop = min(end, begins[r + 1] if r < last else keys.total)
        s = keys.streams[r]
        first = keys.starts[r] + (p - begins[r])
        if s == LITERAL:
            out.extend(range(first, first + stop - p))
        else:
            base = (2 * s if s > 0 else -2 * s - 1) << 24
            out.extend(range(base + first, base + first + stop - p))
        p = stop
        r += 1
    return out


def vllm_event(ev: Event, lookahead: int = 0, medium: str = MEDIUM,
               with_tokens: bool = True) -> dict[str, Any]:
    """One event as vLLM's record (``vllm/distributed/kv_events.py``): the tag first, then
    the fields in declaration order; those left at their default are omitted, as vLLM's
    msgspec encoder (``omit_defaults``) omits them.  ``with_tokens`` False leaves the token
    lists empty (a much smaller stream)."""
    if isinstance(ev, Stored):
        keys = ev.req.block_hashes
        seq = min(ev.seq_len, keys.total) if with_tokens else 0
        d: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": list(ev.keys),
            "parent_block_hash": ev.parent_key if ev.parent_key >= 0 else None,
            "token_ids": token_ids(keys, ev.tok_start, min(ev.tok_end, seq)),
            "block_size": ev.block_size,
            "lora_id": None,
            "medium": medium,
            "lora_name": None,
        }
        if ev.keys:
            d["extra_keys"] = [None] * len(ev.keys)
        d["group_idx"] = ev.group
        if lookahead:
            d["lookahead_token_ids"] = [token_ids(keys, e, min(e + lookahead, seq))
                                        for e in ev.ends]
        return d
    if isinstance(ev, Removed):
        return {"type": "BlockRemoved", "block_hashes": [ev.key], "medium": medium,
                "group_idx": ev.group}
    return {"type": "AllBlocksCleared"}


def pack_batch(packer, ts: float, recs: list[dict], rank: int = 0) -> bytes:
    """``KVEventBatch(ts, events, rank)`` as msgspec encodes it: an array, the events as maps
    (msgspec sizes a struct's map header by the fields it declares: a map16 for
    ``BlockStored``'s 16 fields and tag, a fixmap for the others)."""
    parts = [packer.pack_array_header(3), packer.pack(ts), packer.pack_array_header(len(recs))]
    for rec in recs:
        body = b"".join(packer.pack(k) + packer.pack(v) for k, v in rec.items())
        if rec["type"] == "BlockStored":
            parts.append(b"\xde" + len(rec).to_bytes(2, "big"))
        else:
            parts.append(packer.pack_map_header(len(rec)))
        parts.append(body)
    parts.append(packer.pack(rank))
    return b"".join(parts)


class RunEvents:
    """The event stream of one ``sim run``, spooled to temporary files while the replay
    runs (a long run publishes millions of events) and moved into the run folder by
    ``write``."""

    def __init__(self, kv, clock: Callable[[], int], report_mode: str | None = None,
                 fix_emit: bool = False, msgpack: bool = False, topic: str = "",
                 with_tokens: bool = True):
        c = kv.coordinator
        self.unit = c.hash_block_size
        self.lookahead = c.pool.lookahead
        sizes = [m.block_size for m in c.manager_of]
        self.grid = self.unit      # (lookups name their keys at every hash unit)
        self.log = KVEventLog(self._publish, clock=clock, report_mode=report_mode,
                              fix_emit=fix_emit)
        self.log.lookups = []
        kv.enable_kv_events(self.log)
        self.seq = 0
        self.events = 0
        self.with_tokens = with_tokens
        self.pending_lookups: list[dict] = []
        self._dir = tempfile.mkdtemp(prefix="hcs-kv-events-")
        # (removed with this object too: a replay that fails leaves nothing behind)
        weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._jsonl = open(os.path.join(self._dir, JSONL), "w")
        self._frames = None
        self._packer = None
        self.topic = topic.encode()
        if msgpack:
            import msgpack as _mp

            self._packer = _mp.Packer(use_bin_type=True)
            self._frames = open(os.path.join(self._dir, MSGPACK), "wb")
        header = {"vllm": VLLM, "hash_block_size": self.unit, "lookahead": self.lookahead,
                  "groups": [{"kind": s.kind, "block_size": b,
                              **({"window": s.window} if s.kind == "swa" else {})}
                             for s, b in zip(c.specs, sizes)],
                  "lookup_grid": self.grid, "report_mode": report_mode or "incremental",
                  "fix_emit": fix_emit, "medium": MEDIUM,
                  "token_ids": ("synthetic: token p of stream s is z(s) * 2**24 + p"
                                if with_tokens else "left out (kv_events.token_ids: false)")}
        self._line({"kv_events_header": header})

    # -- the log's sink: one batch per step ---------------------------------------------
    def _publish(self, step: int, events: list[Event]) -> None:
        self._take_lookups()
        ts = step * 1e-9
        recs = [vllm_event(e, self.lookahead, with_tokens=self.with_tokens) for e in events]
        sim: dict[str, Any] = {
            "req": [e.req.request_id if isinstance(e, Stored) else None for e in events],
            "source": [e.source if isinstance(e, Stored) else None for e in events]}
        if self.pending_lookups:
            sim["lookups"] = self.pending_lookups
            self.pending_lookups = []
        self._line({"seq": self.seq, "ts": ts, "events": recs, "data_parallel_rank": 0,
                    "sim": sim})
        if self._frames is not None and self._packer is not None:
            payload = pack_batch(self._packer, ts, recs)
            self._frames.write(self._packer.pack(
                [self.topic, self.seq.to_bytes(8, "big"), payload]))
        self.seq += 1
        self.events += len(events)

    def _take_lookups(self) -> None:
        """The lookups made since the last batch (a tool judges them against the stream
        published before them)."""
        got = self.log.lookups
        if not got:
            return
        self.log.lookups = []
        g = self.grid
        for req, hit in got:
            keys = req.block_hashes
            n = min((req.num_tokens - 1) // g, keys.count * self.unit // g)
            per = g // self.unit
            self.pending_lookups.append({
                "req": req.request_id, "hit": hit, "tokens": req.num_tokens,
                "keys": keys.keys_at([(j + 1) * per - 1 for j in range(n)])})

    def _line(self, obj: dict) -> None:
        self._jsonl.write(json.dumps(obj, separators=(",", ":")) + "\n")

    # -- the end of the replay ----------------------------------------------------------------
    def finish(self) -> None:
        """Publish the last step; note where vLLM would have died, if it would have."""
        log = self.log
        log.flush()
        self._take_lookups()
        tail: dict[str, Any] = {}
        if log.error is not None:
            err = dict(log.error)
            err["ts"] = err["step"] * 1e-9
            del err["step"]
            err["unpublished"] = [vllm_event(e, self.lookahead, with_tokens=self.with_tokens)
                                  for e in log.unpublished]
            tail["kv_events_error"] = err
        if self.pending_lookups:
            tail["sim"] = {"lookups": self.pending_lookups}
            self.pending_lookups = []
        if tail:
            self._line(tail)
        self._jsonl.close()
        if self._frames is not None:
            self._frames.close()

    def summary(self) -> str:
        """One line for the console."""
        s = f"{self.events:,} KV events in {self.seq:,} batches"
        if self.log.error is not None:
            e = self.log.error
            s += (f"; vLLM would have raised {e['type']} announcing the hit of request "
                  f"{e['request']!r} (group {e['group']}) and stopped publishing")
        return s

    def discard(self) -> None:
        """Close the stream and remove its temporary files now: a fleet's replicas write
        no stream of their own (their events reach the router's view), and a ``sim run``
        ends with ``os._exit``, which runs no finalizer."""
        if not self._jsonl.closed:
            self.finish()
        shutil.rmtree(self._dir, ignore_errors=True)

    def write(self, folder: Path) -> None:
        """Move the stream into ``folder`` (the run's temporary folder)."""
        if not self._jsonl.closed:
            self.finish()
        for name in (JSONL, MSGPACK):
            src = os.path.join(self._dir, name)
            if os.path.exists(src):
                shutil.move(src, Path(folder) / name)
        shutil.rmtree(self._dir, ignore_errors=True)


def attach(sc, kv, sched) -> RunEvents | None:
    """The event stream of a ``sim run`` when the scenario turns KV events on."""
    sec = getattr(sc, "kv_events", None)
    if sec is None or not sec.enable_kv_cache_events:
        return None
    return RunEvents(kv, lambda: sched.sched_time, report_mode=sec.report_mode,
                     fix_emit=sec.fix_emit, msgpack=sec.msgpack, topic=sec.topic,
                     with_tokens=sec.token_ids)
