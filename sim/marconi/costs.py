"""What a cached token and a cached state cost, and what a hit saves: :class:`CostModel`.

Marconi weighs entries by FLOPs saved per byte (its Eq. 1, Appendix A).  The paper derives
per-layer FLOPs and bytes for its own 7B hybrid; here both come from the project's model
catalogue so that every policy of the simulator prices a model the same way (interpretation:
the catalogue's ``ModelSpec.flops_per_token`` -- matmuls ``2 x active params`` plus attention
``4 x context x q_heads x head_dim`` per attention layer -- stands for the paper's per-layer
sums; the Mamba scan is folded into its projections there, as in the paper it is a small term).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CostModel:
    """Bytes and FLOPs of one model.

    * ``kv_bytes_per_token``: the KV of one token over all attention layers;
    * ``state_bytes``: one SSM checkpoint over all Mamba layers (conv + SSM state);
    * prefilling the token at position ``t`` (``t`` tokens before it) costs
      ``flops_per_token + attn_flops_per_context_token * t``.
    """

    kv_bytes_per_token: int
    state_bytes: int
    flops_per_token: float
    attn_flops_per_context_token: float
    name: str = ""

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token < 0 or self.state_bytes < 0:
            raise ValueError("kv_bytes_per_token and state_bytes must be >= 0")
        if self.flops_per_token < 0 or self.attn_flops_per_context_token < 0:
            raise ValueError("FLOP coefficients must be >= 0")

    def prefill_flops(self, start: int, end: int) -> float:
        """FLOPs to prefill tokens ``start .. end-1`` with the ``start`` tokens before them cached."""
        if end <= start:
            return 0.0
        positions = end * (end - 1) // 2 - start * (start - 1) // 2    # sum of start .. end-1
        return (end - start) * self.flops_per_token + positions * self.attn_flops_per_context_token

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token

    @classmethod
    def from_model(cls, model: Any, **layout: Any) -> CostModel:
        """From a catalogue model (a ``ModelSpec`` or its name); ``layout`` goes to
        ``sim.models.derive_layout`` (``tp``, ``num_speculative_tokens``, dtypes ...)."""
        from sim.models import derive_layout, get_model

        spec = get_model(model) if isinstance(model, str) else model
        lay = derive_layout(spec, **layout)
        base = spec.flops_per_token(0)
        return cls(kv_bytes_per_token=lay.attn_bytes_per_token,
                   state_bytes=lay.mamba_bytes_per_seq,
                   flops_per_token=base,
                   attn_flops_per_context_token=spec.flops_per_token(1) - base,
                   name=spec.name)


def cost_model(model: Any) -> CostModel:
    """``model`` as a :class:`CostModel`: one as is, else a catalogue model or name."""
    return model if isinstance(model, CostModel) else CostModel.from_model(model)
