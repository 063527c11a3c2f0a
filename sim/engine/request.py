"""A request as the scheduler holds it (``SimRequest``: the cache model's request, its
output, timings and hit) and one entry of a step's plan (``ScheduledItem``), as vLLM's
``v1/request.py`` and ``SchedulerOutput`` hold them."""
from __future__ import annotations

from typing import Any

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.attribution import Miss
from sim.cache.request import CacheRequest
from sim.engine.step_plan import StepItem


class SimRequest:
    """A request inside the engine: cache view plus serving progress.

    A plain class with slots (not a dataclass: a dataclass's generated
    ``__init__`` is interpreted Python even in the compiled build, several
    thousand CPU instructions per request with this many fields)."""

    __slots__ = ("cache", "max_tokens", "index", "arrival_ns", "num_output", "hit_tokens",
                 "attention_hit_tokens", "junction", "first_scheduled_ns", "first_token_ns",
                 "finish_ns", "preemptions", "recomputed_tokens", "mamba_states_written",
                 "chunk_ends", "chunk_end_steps", "first_prefill_done", "done_event",
                 "out_stream", "fast_n", "fast_until", "item", "has_drafts",
                 "is_prefill_chunk", "recording", "cache_mark", "cache_mark_end", "rejected",
                 "priority",
                 "arrival_step", "miss", "last_delivery_ns", "deliveries", "session",
                 "cpu_hit_tokens", "cpu_no_state_tokens", "loading", "in_flight")

    def __init__(self, cache: CacheRequest, max_tokens: int, index: int):
        # (integer fields are machine integers: no tagged-int checks in the compiled
        # scheduler's per-step arithmetic)
        self.cache = cache
        self.max_tokens: i64 = max_tokens
        self.index: i64 = index                 # arrival order (tie-break, output order)
        # engine clock (integer ns; one per step in `sim steps`), -1 until it happens
        self.arrival_ns: i64 = -1
        self.num_output: i64 = 0
        self.hit_tokens: i64 = -1               # prefix hit at first admission
        self.attention_hit_tokens: i64 = 0      # full attention alone
        self.junction: i64 = 0
        self.first_scheduled_ns: i64 = -1
        self.first_token_ns: i64 = -1
        self.finish_ns: i64 = -1
        self.preemptions: i64 = 0
        self.recomputed_tokens: i64 = 0
        self.mamba_states_written: i64 = 0
        # (machine integers: an int object and a list slot a chunk end otherwise)
        self.chunk_ends = vec[i64]()
        self.chunk_end_steps = vec[i64]()   # step index of each chunk end
        self.first_prefill_done = False
        self.done_event: Any = None        # the engine's turn record until it finishes
        self.out_stream: i64 = 0                # stream id of this request's output tokens
        self.fast_n: i64 = -1                   # decode fast path: tokens per step at the last allocation
        self.fast_until: i64 = -1               # ... and the computed count up to which it stays valid
        self.item: ScheduledItem | None = None   # reused per step (scheduled once per step)
        self.has_drafts = False            # drafter proposed K tokens after its last sampling step
        self.is_prefill_chunk = False      # its last scheduled step left prompt tokens uncomputed
        self.recording = True              # first prefill's chunk ends (stops at a preemption)
        # the block of min(computed, hashed) at the last update-time cache_blocks, as its
        # token range [cache_mark, cache_mark_end) (later calls before the next block
        # completes are no-ops and are skipped; a comparison, not a division, a step)
        self.cache_mark: i64 = -1
        self.cache_mark_end: i64 = -1
        self.rejected = ""                 # why it was refused on arrival (a reason token), or ""
        self.priority: i64 = 0                  # scheduler.policy priority: lower goes first
        self.arrival_step: i64 = 0              # scheduler step at arrival (lpm's starvation bound)
        self.miss: Miss | None = None      # why its first admission missed (attribution on)
        # the step sampler's (sim/engine/record.py): end of the step that last delivered
        # tokens (-1: none yet) and how many deliveries so far (inter-token latencies)
        self.last_delivery_ns: i64 = -1
        self.deliveries: i64 = 0
        self.session: str | None = None    # the workload record's session (requests.csv)
        # the CPU tier (kv_offloading): tokens its first admission loaded from the host
        # pool, and whether it waits for a load now (vLLM's WAITING_FOR_REMOTE_KVS)
        self.cpu_hit_tokens: i64 = 0
        self.cpu_no_state_tokens: i64 = 0     # held in attention groups past the hit
        self.loading = False
        # in the scheduler's ``inflight`` (admitted with prompt tokens left, or loading):
        # asked for every request of every step, so a field, not a dict probe
        self.in_flight = False

    def __repr__(self) -> str:
        return (f"SimRequest({self.cache.request_id!r}, index={self.index}, "
                f"output={self.num_output}/{self.max_tokens})")

    @property
    def rid(self) -> str:
        return self.cache.request_id

    @property
    def num_computed(self) -> int:
        return self.cache.num_computed_tokens

    @property
    def decoding(self) -> bool:
        """Prompt (and any replayed outputs) computed: each step samples."""
        return self.num_output > 0 and self.cache.num_computed_tokens >= self.cache.num_tokens - 1


class ScheduledItem(StepItem):
    """One request's share of a step (the object is reused step after step): the step
    plan's item, which the engine hands to the backend, plus the scheduler's own handle
    on the request (no backend reads it)."""

    __slots__ = ("req", "pos")

    def __init__(self, req: SimRequest, num_tokens: int, context: int, is_prefill: bool,
                 spec_tokens: int = 0, new_hit: int = 0, padded: bool = False):
        super().__init__(req.cache, req.out_stream, num_tokens, context, is_prefill,
                         spec_tokens, new_hit, padded)
        self.req = req
        # its index in the scheduler's list when last scheduled (the step's, while the
        # entry there is this item: the CPU tier's connector finds its few requests so)
        self.pos: i64 = -1
