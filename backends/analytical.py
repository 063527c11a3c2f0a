"""Analytical backend: a per-step roofline over the batch.

step time = overhead + max(FLOPs / (peak FLOP/s x mfu), bytes / (HBM B/s x mbu))

FLOPs per scheduled item of ``t`` new tokens over ``c`` cached tokens:
  * dense/MoE/projections: 2 x active parameters x t (embeddings excluded),
  * attention scores and values: 4 x t x (c + (t + 1) / 2) x q_heads x head_dim per attention layer,
  * Mamba2 SSD: ``ssd_flops_per_token`` x t per Mamba layer (linear in t).
Bytes per step: active weights once, KV read of ``c + t`` tokens and written for ``t``
per attention layer, the Mamba state read and written once per item and layer.

Efficiencies (``mfu``, ``mbu``) and the overhead come from the scenario or a
profile file; a profile made by ``sim calibrate`` (``kind: fitted``) instead
carries measured coefficients of the torch backend on one device:
``per_item_s + per_chunk_s * ceil(t / chunk_tokens) + per_token_s * t
+ per_pair_s * (t*c + t*(t+1)/2)`` per item (the SSD scan pads to whole chunks).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mypy_extensions import i64

from backends.base import StepItem, StepPlan


@dataclass(frozen=True)
class CostModel:
    dense_flops_per_token: float       # 2 x active non-embedding params
    attn_layers: int
    attn_width: int                    # q_heads x head_dim
    kv_bytes_per_token: float          # all attention layers, K and V
    mamba_layers: int
    ssd_flops_per_token: float         # one Mamba layer, one token
    state_bytes_per_seq: float         # all Mamba layers, one request
    weight_bytes: float                # active weights read per step
    peak_flops: float
    hbm_bytes_per_s: float
    mfu: float = 0.5
    mbu: float = 0.7
    overhead_s: float = 0.004
    # a fitted profile (``sim calibrate``) replaces the roofline with measured coefficients
    per_item_s: float | None = None
    per_token_s: float | None = None
    per_pair_s: float | None = None
    per_chunk_s: float = 0.0          # per started SSD chunk of ``chunk_tokens`` new tokens
    chunk_tokens: int = 0

    @property
    def jumps(self) -> bool:
        return True

    def step_time(self, plan: StepPlan) -> float:
        return self.items_time(plan.items)

    def items_time(self, items: list[StepItem]) -> float:
        """``step_time`` of a plan of ``items``: the model reads nothing of a plan but each
        item's ``num_tokens`` and ``context``, so the engine calls this directly and
        fills no plan for it (a plan's other fields are for the backends that read
        them)."""
        if not items:
            return self.overhead_s
        # (machine integers: the sums of a step's items, no tagged-int checks per item)
        T: i64 = 0
        C: i64 = 0
        TC: i64 = 0
        TT: i64 = 0
        NC: i64 = 0
        ck: i64 = self.chunk_tokens
        for it in items:
            t = it.num_tokens
            c = it.context
            T += t
            C += c
            TC += t * c
            TT += t * (t + 1)
            if ck:
                NC += -(-t // ck)
        return self.time_from_sums(len(items), T, C, TC, TT, NC)

    def decode_times(self, n: int, t: int) -> DecodeTimes:
        """The step times of a pure-decode batch of ``n`` items of ``t`` tokens by its
        context sum (a decode jump's steps)."""
        return DecodeTimes(self, n, t, n * t, n * t * (t + 1))

    def time_from_sums(self, n: int, T: int, C: int, TC: int, TT: int,
                       NC: int | None = None) -> float:
        """Step time from integer batch sums: n items, T = sum t, C = sum c,
        TC = sum t*c, TT = sum t*(t+1).  Pure-decode jumps call this directly
        with the same integers, so a jump and single steps agree bit for bit."""
        if self.per_token_s is not None:
            assert self.per_item_s is not None and self.per_pair_s is not None
            if NC is None:  # a pure-decode jump: every item has T / n tokens
                NC = n * -(-(T // n) // self.chunk_tokens) if self.chunk_tokens else 0
            return (n * self.per_item_s + T * self.per_token_s
                    + (TC + TT // 2) * self.per_pair_s + NC * self.per_chunk_s)
        flops = (T * (self.dense_flops_per_token + self.ssd_flops_per_token * self.mamba_layers)
                 + 4.0 * self.attn_layers * self.attn_width * (TC + TT // 2 + (TT % 2) * 0.5))
        mem = (self.weight_bytes + (C + 2 * T) * self.kv_bytes_per_token
               + n * 2.0 * self.state_bytes_per_seq)
        compute = flops / (self.peak_flops * self.mfu)
        memory = mem / (self.hbm_bytes_per_s * self.mbu)
        return self.overhead_s + (compute if compute > memory else memory)


class DecodeTimes:
    """``time_from_sums`` of the pure-decode steps of one batch (``n`` items of ``t``
    tokens; ``T`` = n t, ``TT`` = n t (t + 1)) as only the context sum ``C`` changes from
    step to step: an engine decode jump times each of its steps.  The terms free of ``C``
    are computed once, each by the very expression ``time_from_sums`` evaluates, and
    ``at`` combines them in its order: every step's time is the same float, bit for bit,
    at about half the work."""

    def __init__(self, m: CostModel, n: int, t: int, T: int, TT: int):
        # (machine integers: ``at`` runs once per step of every jump; an i64 converts to
        # the same double as the equal int, and t C stays far below 2**63)
        self.t: i64 = t
        self.half: i64 = TT // 2
        self.overhead = m.overhead_s
        self.fitted = m.per_token_s is not None
        # roofline: flops = a + b (t C + TT // 2 + (TT % 2) 0.5), memory = w + (C + 2T) kv + s
        self.a = T * (m.dense_flops_per_token + m.ssd_flops_per_token * m.mamba_layers)
        self.b = 4.0 * m.attn_layers * m.attn_width
        self.odd = (TT % 2) * 0.5
        self.w = m.weight_bytes
        self.T2: i64 = 2 * T
        self.kv = m.kv_bytes_per_token
        self.s = n * 2.0 * m.state_bytes_per_seq
        self.peak = m.peak_flops * m.mfu
        self.hbm = m.hbm_bytes_per_s * m.mbu
        # fitted: (n per_item + T per_token) + (t C + TT // 2) per_pair + NC per_chunk
        self.items = 0.0
        self.pair = 0.0
        self.chunks = 0.0
        if self.fitted:
            pi, pt, pp = m.per_item_s, m.per_token_s, m.per_pair_s
            assert pi is not None and pt is not None and pp is not None
            self.items = n * pi + T * pt
            self.pair = pp
            ck = m.chunk_tokens
            nc = n * -(-(T // n) // ck) if ck else 0
            self.chunks = nc * m.per_chunk_s

    def at(self, C: i64) -> float:
        """``time_from_sums(n, T, C, t C, TT)``."""
        if self.fitted:
            return self.items + float(self.t * C + self.half) * self.pair + self.chunks
        flops = self.a + self.b * (float(self.t * C + self.half) + self.odd)
        mem = self.w + float(C + self.T2) * self.kv + self.s
        compute = flops / self.peak
        memory = mem / self.hbm
        return self.overhead + (compute if compute > memory else memory)


class HostLinks:
    """Each GPU's host link, one direction for loads (host -> GPU) and one for stores (GPU
    -> host), PCIe being full duplex; the KV offloading tier's transfers cross them in the
    order they are submitted, while the GPU computes (vLLM's offloading worker copies on
    its own streams: a step waits only for the stores it must flush).  Every GPU of a
    replica moves its own shard of a block at once, so one link's bytes are one GPU's.
    Times in ns."""

    def __init__(self, load_bytes_per_s: float, store_bytes_per_s: float):
        self.load_ns_per_byte = 1e9 / load_bytes_per_s
        self.store_ns_per_byte = 1e9 / store_bytes_per_s
        self.load_free: i64 = 0       # when the load direction is idle again
        self.store_free: i64 = 0

    def load(self, nbytes: i64, start: i64) -> i64:
        """A load of ``nbytes`` submitted at ``start``: when it is done."""
        if self.load_free > start:
            start = self.load_free
        end: i64 = start + int(float(nbytes) * self.load_ns_per_byte + 0.5)
        self.load_free = end
        return end

    def store(self, nbytes: i64, start: i64) -> i64:
        if self.store_free > start:
            start = self.store_free
        end: i64 = start + int(float(nbytes) * self.store_ns_per_byte + 0.5)
        self.store_free = end
        return end


def build_backend(scenario: Any, deployment: Any, plant: str | None = None) -> Any:
    """``backend.kind: analytical``: the deployment's cost model (``sim/commands/run.py`` builds it
    from the model, the GPU and the backend section or its profile; a test may put any
    ``StepBackend`` there, so it is not checked to be a ``CostModel``)."""
    return deployment.cost
