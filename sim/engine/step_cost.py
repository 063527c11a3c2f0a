"""The analytical backend's step time, compiled with the engine: the twin of
``backends.analytical.CostModel`` (the roofline, or a fitted profile's coefficients), which
stays plain at the edge as its reference.

When a run's backend is the analytical cost model, the engine times each step with
``StepCost`` (built once from the model's coefficients) instead of calling the model:
``items_time`` once a step, and in a decode jump ``DecodeTimes.at`` once for each step it
stands for.  Interpreted, the model would cost a Mooncake request ~148 k CPU instructions
more (348 k against 200 k), about as much again as the rest of its replay; compiled and
called natively, a few thousand.  Every expression is the model's, in its order, on the
same float coefficients (``float``-typed fields of the model converted once, as the
compiled build stores them), so both give the same float, bit for bit: a test compares
them on many random models, batches and sums (``tests/engine/test_step_cost.py``).
"""
from __future__ import annotations

from typing import Any

from mypy_extensions import i64

from sim.engine.step_plan import StepItem


def _optional(value: Any) -> float:
    return 0.0 if value is None else float(value)


class StepCost:
    """``CostModel``'s ``items_time`` and ``time_from_sums``, and the step times of a
    decode jump (``decode_times``), over a copy of the model ``m``'s coefficients."""

    def __init__(self, m: Any) -> None:
        self.dense_flops_per_token = float(m.dense_flops_per_token)
        self.attn_layers: int = m.attn_layers
        self.attn_width: int = m.attn_width
        self.kv_bytes_per_token = float(m.kv_bytes_per_token)
        self.mamba_layers: int = m.mamba_layers
        self.ssd_flops_per_token = float(m.ssd_flops_per_token)
        self.state_bytes_per_seq = float(m.state_bytes_per_seq)
        self.weight_bytes = float(m.weight_bytes)
        self.peak_flops = float(m.peak_flops)
        self.hbm_bytes_per_s = float(m.hbm_bytes_per_s)
        self.mfu = float(m.mfu)
        self.mbu = float(m.mbu)
        self.overhead_s = float(m.overhead_s)
        # a fitted profile (``sim calibrate``): its coefficients replace the roofline
        self.fitted = m.per_token_s is not None
        self.per_item_s = _optional(m.per_item_s)
        self.per_token_s = _optional(m.per_token_s)
        self.per_pair_s = _optional(m.per_pair_s)
        self.per_chunk_s = float(m.per_chunk_s)
        self.chunk_tokens: int = m.chunk_tokens

    def items_time(self, items: list[StepItem]) -> float:
        """``CostModel.items_time``: the step time of a plan of ``items`` (the model reads
        nothing of a plan but each item's ``num_tokens`` and ``context``)."""
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
        """``CostModel.time_from_sums``: step time from integer batch sums (n items,
        T = sum t, C = sum c, TC = sum t*c, TT = sum t*(t+1), NC = sum of started SSD
        chunks; None: a pure-decode batch's)."""
        if self.fitted:
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

    def __init__(self, m: StepCost, n: int, t: int, T: int, TT: int):
        # (machine integers: ``at`` runs once per step of every jump; an i64 converts to
        # the same double as the equal int, and t C stays far below 2**63)
        self.t: i64 = t
        self.half: i64 = TT // 2
        self.overhead = m.overhead_s
        self.fitted = m.fitted
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
            self.items = n * m.per_item_s + T * m.per_token_s
            self.pair = m.per_pair_s
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
