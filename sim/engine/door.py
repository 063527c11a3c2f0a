"""A fleet's door: each arrival as its router sees it, routed, and its way back out.

The fleet (``sim/cluster/fleet.py``) builds one ``Door`` over its replicas and hands it to
the shared arrivals (``Arrivals.router``): for every arrival it makes the router's
``RouteRequest`` (and, for a router that reads caches, the ``Prompt`` whose keys it
builds once per hash configuration), asks the router, names the inlet, and afterwards
records where the request went and keeps the replicas' load counters and the router's
own.  A ``FinishWatch`` per replica hears its finished requests.  The routers themselves
are plain Python (``sim/cluster/routers``); this is the part every arrival crosses, so it
is compiled with the engine (no Python frame of its own an arrival).
"""
from __future__ import annotations

from typing import Any

from mypy_extensions import i64

from sim.engine.active_sequences import ActiveSequences
from sim.engine.record import prompt_of


class RouteRequest:
    """One arrival as the router sees it (what a front end knows of it)."""

    def __init__(self, request_id: str, session: str | None, segments: Any,
                 prompt_tokens: int, output_tokens: int, arrival_ns: int, index: int,
                 prompt: Any = None, predicted: int = -1, best: Any = None) -> None:
        # (a router counting Dynamo's load sets ``blocks`` and ``prefill`` as it chooses:
        # the door adds the request to its book once the replica took it)
        self.blocks: Any = None     # its prompt's block keys (a vec), the book's blocks
        self.prefill: int = 0       # the prompt tokens the chosen worker computes
        self.request_id = request_id
        self.session = session
        self.segments = segments    # the workload record's segments (or its hash-id record)
        self.prompt_tokens = prompt_tokens   # (-1 for a router that reads no replica)
        self.output_tokens = output_tokens
        self.arrival_ns = arrival_ns         # (-1 likewise: routed as the trace is read)
        self.index = index                   # the fleet's arrival order
        self.prompt = prompt        # a ``Prompt``: keys per hash configuration
        self.predicted = predicted  # the hit (tokens) the router believed its replica gives
        self.best = best            # hindsight: (best hit, its replica, best of others, own)

    def __repr__(self) -> str:
        return (f"RouteRequest({self.request_id!r}, session={self.session!r}, "
                f"prompt_tokens={self.prompt_tokens}, index={self.index})")


class Prompt:
    """One arrival's prompt as the routers need it: its keys, built once per distinct
    hash configuration among the replicas (``keys_for``), and its length.  (Replicas of
    one configuration are the rule: the first configuration's keys are kept in fields,
    any other's in a dict made when needed.)"""

    def __init__(self, trace: Any, streams: Any, tokens: int = -1) -> None:
        self.trace = trace
        self.streams = streams
        self.tokens: int = tokens if tokens >= 0 else trace.prompt_tokens
        self.unit0: i64 = -1        # the first configuration asked: (hash unit, lookahead)
        self.lookahead0: i64 = -1
        self.keys0: Any = None      # ... and the keys built under it
        self._keys: dict[tuple[int, int], Any] | None = None   # any other configuration's

    def keys_for(self, kv: Any) -> Any:
        """The prompt's ``PrefixKeys`` under ``kv``'s hash unit and lookahead."""
        h = kv.hasher
        unit: i64 = h.unit
        la: i64 = h.lookahead
        if unit == self.unit0 and la == self.lookahead0:
            return self.keys0
        if self.keys0 is None:
            got = self.streams.keys_of(prompt_of(self.trace.segments), h)
            self.unit0 = unit
            self.lookahead0 = la
            self.keys0 = got
            return got
        if self._keys is None:
            self._keys = {}
        k = (int(unit), int(la))
        got = self._keys.get(k)
        if got is None:
            got = self.streams.keys_of(prompt_of(self.trace.segments), h)
            self._keys[k] = got
        return got

    def built(self, config: tuple[int, int]) -> Any:
        """The keys ``keys_for`` built under ``(hash unit, lookahead)``; None if none."""
        if config[0] == self.unit0 and config[1] == self.lookahead0:
            return self.keys0
        if self._keys is None:
            return None
        return self._keys.get(config)


def prompt_tokens_of(trace: Any) -> int:
    """A workload record's prompt tokens (``TraceRequest.prompt_tokens`` without its
    Python property: a block-hash record's ``n_in``, else the segments' lengths)."""
    segs = trace.segments
    if isinstance(segs, list) or isinstance(segs, tuple):
        n = 0
        for seg in segs:
            n += int(seg[2])
        return n
    return int(segs.n_in)


def _put(a: Any, k: int, v: int) -> None:
    """``a[k] = v`` in an ``array('q')``, growing it (with -1) to hold it."""
    while len(a) <= k:
        a.append(-1)
    a[k] = v


class Door:
    """The router's side of the shared arrivals (``Arrivals.router``): names the inlet of
    each arrival, then records where it went and keeps the load counters.

    Per replica, in the fleet's order: ``inlets`` (its engine's), ``views`` (its load
    counters), ``key_config`` (its (hash unit, lookahead)).  By arrival index, each an
    ``array('q')`` (``arrays`` makes an empty one): ``replica_of`` (given, shared with the
    fleet), ``predicted``, ``best``, ``best_at``, ``others``, ``at_arrival``.  ``oracle``:
    the oracle view asked for every replica's hit at each arrival (``cluster.hindsight``),
    or None."""

    def __init__(self, router: Any, inlets: list, views: list, key_config: list,
                 replica_of: Any, streams: Any, keeps_counters: bool, needs_prompt: bool,
                 predicts: bool, oracle: Any, arrays: Any) -> None:
        self.router = router
        self.inlets = inlets
        self.views = views
        self.key_config = key_config
        self.replica_of = replica_of
        self.streams = streams
        self.keeps_counters = keeps_counters
        self.routed: dict[int, RouteRequest] = {}
        self.pending: RouteRequest | None = None
        self.needs_prompt = needs_prompt
        self.placed_hook: Any = getattr(router, "placed", None)
        # a router that counts Dynamo's load (``counts_load``) has its book fed here: each
        # request the replica took, with the ``blocks`` and ``prefill`` its choice set,
        # and each finish (no Python call of the router's on either)
        self.book: ActiveSequences | None = (router.book if getattr(router, "counts_load",
                                                                     False) else None)
        # what the router believed its replica would reuse (-1: no belief), by arrival
        self.predicts = predicts
        self.predicted: Any = arrays()
        # hindsight: the best replica's hit at the arrival and where, the best of the
        # replicas not chosen, the chosen replica's own
        self.oracle = oracle
        self.best: Any = arrays()
        self.best_at: Any = arrays()
        self.others: Any = arrays()
        self.at_arrival: Any = arrays()

    def route(self, t: int, trace: Any) -> Any:
        tokens = prompt_tokens_of(trace)       # (a sum over the segments: once)
        req = RouteRequest(trace.request_id, trace.session, trace.segments, tokens,
                           trace.output_tokens, t, -1)
        if self.needs_prompt:
            req.prompt = Prompt(trace, self.streams, tokens)
        hits: list[int] | None = None
        oracle = self.oracle
        if oracle is not None:
            hits = [int(oracle.hybrid_hit(k, req.prompt)) for k in range(len(self.inlets))]
        i: int = self.router.choose(req)
        if hits is not None:
            b = 0
            for k in range(len(hits)):
                if hits[k] > hits[b]:
                    b = k
            others = 0
            for k in range(len(hits)):
                if k != i and hits[k] > others:
                    others = hits[k]
            req.best = (hits[b], b, others, hits[i])
        self.pending = req
        inlet = self.inlets[i]
        if self.needs_prompt and inlet.maker is not None:
            # the keys the router built under this replica's configuration become the
            # request's (the same registry built them: the replica would build equal ones)
            keys = req.prompt.built(self.key_config[i])
            if keys is not None:
                inlet.maker.next_keys = keys
        return inlet

    def placed(self, inlet: Any, r: Any, ok: bool) -> None:
        i: int = inlet.replica
        req = self.pending
        self.pending = None
        k: int = r.index
        # (k, the arrival's index, is each array's length but where a record was routed
        # before: ``_put`` only then)
        ro = self.replica_of
        if len(ro) == k:
            ro.append(i)
        else:
            _put(ro, k, i)
        if self.predicts:
            p = req.predicted if req is not None else -1
            pr = self.predicted
            if len(pr) == k:
                pr.append(p)
            else:
                _put(pr, k, p)
        if self.oracle is not None and req is not None:
            best, at, others, mine = req.best
            _put(self.best, k, best)
            _put(self.best_at, k, at)
            _put(self.others, k, others)
            _put(self.at_arrival, k, mine)
        view = self.views[i]
        view.routed += 1
        if req is not None:
            req.index = k
        if ok:
            view.outstanding_tokens += r.cache.num_prompt_tokens + r.max_tokens
            if self.keeps_counters and req is not None:
                self.routed[k] = req
        book = self.book
        if book is not None and ok and req is not None:
            book.add(i, k, r, req.prefill, req.blocks)
        hook = self.placed_hook
        if hook is not None and req is not None:
            hook(i, req, r, ok)


class FinishWatch:
    """An engine's finish observer: a replica's finished requests leave its load counters
    and reach the router's."""

    def __init__(self, door: Door, replica: i64) -> None:
        self.door = door
        self.replica = replica
        self.view: Any = door.views[replica]

    def on_finish(self, req: Any, now: int) -> None:
        """The replica's load counters, then the router's (its request as routed)."""
        view = self.view
        view.outstanding_tokens -= req.cache.num_prompt_tokens + req.max_tokens
        view.finished += 1
        door = self.door
        book = door.book
        if book is not None:
            book.finish(self.replica, req.index)
        if door.keeps_counters:
            got = door.routed.pop(req.index, None)
            if got is not None:
                door.router.finished(self.replica, got)
