"""The per-request glue of ``sim run``: building each arriving request and
recording each finished one (compiled: both run once per request, and
interpreted closures cost several thousand CPU instructions each time).

``RequestMaker.make`` and ``Recorder.finish`` are what ``Engine`` calls as
``make_request`` and ``on_finish``."""
from __future__ import annotations

from typing import Any, Final

from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry
from sim.engine.scheduler import SimRequest

NS: Final = 1e-9   # engine times are integer nanoseconds


class RequestMaker:
    """Builds a ``SimRequest`` from a workload record (``workloads.base.TraceRequest``)."""

    def __init__(self, kv: KVCacheManager, streams: StreamRegistry):
        self.kv = kv
        self.streams = streams
        self.sessions: dict[int, str | None] = {}   # arrival index -> session, until it finishes

    def make(self, trace: Any, index: int) -> SimRequest:
        rid: str = trace.request_id
        keys = self.streams.keys_of(trace.segments, self.kv.hasher)
        r = SimRequest(self.kv.make_request(rid, keys), trace.output_tokens, index)
        r.out_stream = self.streams.id(f"out/{rid}")
        self.sessions[index] = trace.session
        return r


class Recorder:
    """One ``requests.csv`` row per finished request: a plain tuple, the arrival index
    first, then the columns of ``sim.records.RequestRecord`` in order (a served row stops
    before ``rejected``); ``sim/run.py`` makes the records once the replay is over."""

    def __init__(self, maker: RequestMaker):
        self.maker = maker
        self.rows: list[tuple] = []
        self.rejected_rows: list[tuple] = []

    def reject(self, r: SimRequest) -> None:
        """The row of a request refused on arrival: what it asked for, no measurements
        (empty fields), and why (the ``rejected`` column)."""
        sessions = self.maker.sessions
        session: str | None = None
        if r.index in sessions:
            session = sessions[r.index]
            del sessions[r.index]
        c = r.cache
        self.rejected_rows.append((r.index, c.request_id, session or "", r.arrival_ns * NS,
                                   c.num_prompt_tokens) + ("",) * 11 + (r.rejected,))

    def finish(self, r: SimRequest) -> None:
        sessions = self.maker.sessions
        session: str | None = None
        if r.index in sessions:
            session = sessions[r.index]
            del sessions[r.index]
        c = r.cache
        ns = NS
        self.rows.append((
            r.index, c.request_id, session or "", r.arrival_ns * ns, c.num_prompt_tokens,
            r.hit_tokens, r.attention_hit_tokens, max(r.attention_hit_tokens - r.hit_tokens, 0),
            r.junction, r.recomputed_tokens, (r.first_scheduled_ns - r.arrival_ns) * ns,
            (r.first_token_ns - r.arrival_ns) * ns, (r.finish_ns - r.arrival_ns) * ns,
            r.num_output, r.preemptions, r.mamba_states_written))
