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

This module is plain Python, the model's reference: when a run's backend is this model,
the engine times its steps with the model's compiled twin (``sim/engine/step_cost.py``,
the same expressions on the same coefficients), and a test compares the two bit for bit.
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


def build_backend(scenario: Any, deployment: Any, plant: str | None = None) -> Any:
    """``backend.kind: analytical``: the deployment's cost model (``sim/commands/run.py`` builds it
    from the model, the GPU and the backend section or its profile; a test may put any
    ``StepBackend`` there, so it is not checked to be a ``CostModel``)."""
    return deployment.cost
