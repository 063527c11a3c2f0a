"""What a cached token and a cached state cost, and what a hit saves: :class:`CostModel`.

Marconi weighs entries by FLOPs saved per byte (its Eq. 1, Appendix A).  The paper derives
per-layer FLOPs and bytes for its own 7B hybrid; here both come from the project's model
catalogue so that every policy of the simulator prices a model the same way (interpretation:
the catalogue's ``ModelSpec.flops_per_token`` -- matmuls ``2 x active params`` plus attention
``4 x context x q_heads x head_dim`` per attention layer -- stands for the paper's per-layer
sums; the Mamba scan is folded into its projections there, as in the paper it is a small term).

:class:`LayerFlops` is the other reading, the one Marconi's published code computes: FLOPs per
layer kind from the model width ``d`` and state size ``n`` alone (the textbook counts for a
dense transformer block and a Mamba1 block, forward only), summed over the model's layers.  The
rules ``flops: marconi`` (``sim.marconi.rules``) price nodes and rank alphas with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """FLOPs counted per layer kind, as Marconi's published code counts them (integers).

    For ``l`` tokens prefilled from an empty context, with ``d`` the model width and ``n`` the
    SSM state size:

    * Mamba layer: ``12 l d^2 + 16 l d n + 10 l d`` (projections, scan, element-wise work);
    * attention layer: ``8 l d^2 + 4 l^2 d`` (Q, K, V and output projections; scores and
      their product with V);
    * MLP layer: ``16 l d^2`` (two matrices of ``d x 4d``).

    ``hit_saving(l)``: a hit of ``l`` tokens, all layers.  ``node_saving(parent, total)``:
    what a node ending at ``total`` tokens saves over its parent ending at ``parent`` -- as the
    code computes it, whose MLP term takes the *attention* FLOPs of the parent's prefix off
    the MLP FLOPs of the whole prefix (``mlp(total) - attn(parent)``, not
    ``mlp(total) - mlp(parent)``); kept so that the ranking is the code's.
    """

    d: int
    n: int
    ssm_layers: int
    attn_layers: int
    mlp_layers: int

    def mamba(self, tokens: int) -> int:
        d = self.d
        return 12 * tokens * d * d + 16 * tokens * d * self.n + 10 * tokens * d

    def attn(self, tokens: int) -> int:
        d = self.d
        return 8 * tokens * d * d + 4 * tokens * tokens * d

    def mlp(self, tokens: int) -> int:
        return 16 * tokens * self.d * self.d

    def hit_saving(self, tokens: int) -> int:
        return (self.ssm_layers * self.mamba(tokens) + self.attn_layers * self.attn(tokens)
                + self.mlp_layers * self.mlp(tokens))

    def node_saving(self, parent: int, total: int) -> int:
        return (self.ssm_layers * self.mamba(total - parent)
                + self.attn_layers * (self.attn(total) - self.attn(parent))
                + self.mlp_layers * (self.mlp(total) - self.attn(parent)))

    @classmethod
    def from_spec(cls, spec: Any) -> LayerFlops:
        """From a catalogue ``ModelSpec``: ``d`` its width, ``n`` its SSM state size
        (``d_state``; GDN: the key head size), dense and MoE FFN layers counted as MLP layers
        (the formulas know one dense hybrid: for others they are an approximation)."""
        n = spec.d_state if spec.mamba_kind in ("mamba1", "mamba2") else spec.gdn_k_dim
        return cls(d=spec.hidden, n=n, ssm_layers=spec.num_mamba_layers,
                   attn_layers=spec.num_attention_layers,
                   mlp_layers=spec.num_mlp_layers + spec.num_moe_layers)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Bytes and FLOPs of one model.

    * ``kv_bytes_per_token``: the KV of one token over all attention layers;
    * ``state_bytes``: one SSM checkpoint over all Mamba layers (conv + SSM state);
    * prefilling the token at position ``t`` (``t`` tokens before it) costs
      ``flops_per_token + attn_flops_per_context_token * t``;
    * ``layers``: the model's :class:`LayerFlops` (the rule ``flops: marconi``); None when
      unknown (a hand-made cost model).
    """

    kv_bytes_per_token: int
    state_bytes: int
    flops_per_token: float
    attn_flops_per_context_token: float
    name: str = ""
    layers: LayerFlops | None = None

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
                   name=spec.name, layers=LayerFlops.from_spec(spec))


def cost_model(model: Any) -> CostModel:
    """``model`` as a :class:`CostModel`: one as is, else a catalogue model or name."""
    return model if isinstance(model, CostModel) else CostModel.from_model(model)
