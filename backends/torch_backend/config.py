"""Configuration of the real-compute (PyTorch) hybrid stack.

:class:`TorchModelConfig` describes a small hybrid Mamba2/attention model with seeded random
weights.  ``pattern`` uses the NemotronH characters, one per residual block:

* ``M`` Mamba2 mixer, ``*`` attention (GQA; position embedding as the model family's own
  attention has it, see :data:`ATTENTION_POSITIONS`), ``-`` MLP, ``E`` MoE (run as a dense MLP
  here).

:meth:`TorchModelConfig.scaled` derives a reduced copy of a catalogue model (``sim.models``).
This module imports nothing from torch, so configs can be built where torch is missing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

_PATTERN_CHARS = set("M*-E")
_DTYPES = ("float32", "bfloat16")

# How each model family's attention layers encode positions: (rotary fraction of head_dim,
# rope theta); fraction 0 = no position embedding at all (the Mamba layers carry order).
ATTENTION_POSITIONS = {
    # NemotronH (Nemotron-H, Nemotron-Nano-v2, Nemotron-3): NemotronHAttention applies no rotary
    # embedding (transformers modeling_nemotron_h; the config has no rope fields)
    "nemotron_h": (0.0, 10000.0),
    # Granite-4.0-H (granitemoehybrid): config position_embedding_type "nope"
    "granite_moe_hybrid": (0.0, 10000.0),
    # Jamba: JambaAttention has no position embedding
    "jamba": (0.0, 10000.0),
    # Qwen3-Next: RoPE on the first quarter of each head (partial_rotary_factor 0.25),
    # rope_theta 10,000,000 (HF config Qwen/Qwen3-Next-80B-A3B-Instruct)
    "qwen3_next": (0.25, 10_000_000.0),
}


def model_family(model_spec) -> str:
    """The family of a catalogue (or inline) model, from what the catalogue records: the mixer
    kind (GDN = Qwen3-Next, Mamba1 = Jamba) and, for Mamba2, the layer layout (one block per
    pattern character = NemotronH; a mixer plus an FFN in every layer = Granite-4.0-H)."""
    kind = getattr(model_spec, "mamba_kind", "mamba2")
    if kind == "gdn":
        return "qwen3_next"
    if kind == "mamba1":
        return "jamba"
    every = model_spec.num_layers == model_spec.num_mamba_layers + model_spec.num_attention_layers
    return "granite_moe_hybrid" if every else "nemotron_h"


def _largest_divisor_at_most(n: int, cap: int) -> int:
    """Largest d <= cap with n % d == 0 (at least 1)."""
    for d in range(max(1, min(n, cap)), 0, -1):
        if n % d == 0:
            return d
    return 1


@dataclass(frozen=True)
class TorchModelConfig:
    pattern: str = "M*M-"
    hidden: int = 64
    vocab: int = 256
    # Mamba2 mixer
    mamba_heads: int = 4
    mamba_head_dim: int = 16
    d_state: int = 16
    n_groups: int = 2
    conv_kernel: int = 4
    chunk_size: int = 32          # SSD chunk length
    # attention
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    rope_fraction: float = 0.0    # share of head_dim rotated by RoPE; 0 = no position embedding
    rope_theta: float = 10000.0
    # MLP (``-`` and ``E`` blocks)
    ffn_dim: int = 128
    ffn_gated: bool = True        # SwiGLU; False = squared-ReLU up/down (Nemotron-H)
    # numerics
    dtype: str = "float32"        # weights/activations; the SSM state is always float32
    seed: int = 0
    norm_eps: float = 1e-5
    source: str = ""              # free text: where a scaled config came from

    def __post_init__(self) -> None:
        bad = sorted(set(self.pattern) - _PATTERN_CHARS)
        if not self.pattern or bad:
            raise ValueError(f"pattern {self.pattern!r}: use the characters M * - E (got {bad})")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: use one of {_DTYPES}")
        for name in ("hidden", "vocab", "mamba_heads", "mamba_head_dim", "d_state", "n_groups",
                     "chunk_size", "q_heads", "kv_heads", "head_dim", "ffn_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel must be >= 2, got {self.conv_kernel}")
        if self.mamba_heads % self.n_groups:
            raise ValueError(f"n_groups {self.n_groups} must divide mamba_heads {self.mamba_heads}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"kv_heads {self.kv_heads} must divide q_heads {self.q_heads}")
        if not 0.0 <= self.rope_fraction <= 1.0:
            raise ValueError(f"rope_fraction must be in [0, 1], got {self.rope_fraction}")
        if self.rope_fraction and (self.rotary_dim < 2 or self.rotary_dim % 2):
            raise ValueError(f"rope_fraction {self.rope_fraction} x head_dim {self.head_dim} "
                             f"must give an even rotary width >= 2")

    @property
    def rotary_dim(self) -> int:
        """Leading channels of each head that RoPE rotates (0: no position embedding)."""
        return int(round(self.head_dim * self.rope_fraction))

    # -- derived shapes --------------------------------------------------------------------
    @property
    def d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv (and of its state): x, B and C."""
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def in_proj_dim(self) -> int:
        """Mamba2 in_proj output: z, xBC, dt."""
        return self.d_inner + self.conv_dim + self.mamba_heads

    @property
    def num_layers(self) -> int:
        return len(self.pattern)

    @property
    def mamba_layers(self) -> list[int]:
        """Block indices of the Mamba2 mixers (their order = StatePool layer index)."""
        return [i for i, c in enumerate(self.pattern) if c == "M"]

    @property
    def attention_layers(self) -> list[int]:
        """Block indices of the attention mixers (their order = KVPool layer index)."""
        return [i for i, c in enumerate(self.pattern) if c == "*"]

    @property
    def num_mamba_layers(self) -> int:
        return self.pattern.count("M")

    @property
    def num_attention_layers(self) -> int:
        return self.pattern.count("*")

    def with_(self, **changes) -> "TorchModelConfig":
        """A copy with some fields changed (e.g. ``cfg.with_(dtype="bfloat16")``)."""
        return replace(self, **changes)

    # -- scaled copy of a catalogue model --------------------------------------------------
    @classmethod
    def scaled(cls, model_spec, num_layers: int = 4, width_div: int = 8, *,
               dtype: str = "float32", seed: int = 0, chunk_size: int | None = None,
               max_vocab: int = 4096) -> "TorchModelConfig":
        """A reduced copy of a ``sim.models.ModelSpec`` (or catalogue name).

        * Layers: ``num_layers`` model layers that keep the layer-kind mix.  For NemotronH-style
          patterns (every character one block) this is the first ``num_layers`` characters, or --
          when they lack an ``M`` or a ``*`` -- the ``num_layers`` characters ending at the first
          position where both have appeared (Nemotron-H-8B ``M-M-M-M*-...`` -> ``M-M*``).
          FFN-in-every-layer models (Granite-4.0-H, Qwen3-Next, Jamba) get one mixer block plus one
          MLP block per layer (``M-M-M-*-``), i.e. ``2 x num_layers`` blocks; Granite has no
          pattern in the catalogue, so its attention layers are spread evenly (period
          ``num_layers / num_attention_layers``, attention last in each period).
        * Widths: ``hidden``, FFN width, and the head *counts* (Mamba heads, groups, q/kv heads)
          are divided by ``width_div`` (at least 1, groups kept dividing heads, kv heads kept
          dividing q heads, hidden rounded up to a multiple of 8); per-head sizes (mamba_head_dim,
          d_state, head_dim) and conv_kernel are kept, so the Mamba-state / KV ratios stay.
        * Vocab capped at ``max_vocab`` (4096); chunk_size from the spec (64 when it has none).
        * Attention positions as the family's own attention (:func:`model_family`,
          :data:`ATTENTION_POSITIONS`): none for NemotronH, Granite-4.0-H and Jamba; RoPE on a
          quarter of each head (theta 1e7) for Qwen3-Next.
        * Non-Mamba2 mixers are *stood in for* by a Mamba2 mixer with the same state shape: GDN
          (Qwen3-Next) as heads = v_heads, head_dim = v_dim, d_state = k_dim, groups = k_heads;
          Mamba1 (Jamba) as d_inner / 64 heads of 64 with its d_state and one group.
        * FFN width = ``ffn_dim`` or, for MoE-only models, the *active* width ``top_k x expert_ffn
          + shared_experts x shared_expert_ffn`` (``E`` blocks run as one dense MLP of the same
          FLOPs; no routing), divided by ``width_div``.
        """
        if isinstance(model_spec, str):
            from sim.models import get_model
            model_spec = get_model(model_spec)
        m = model_spec
        if num_layers < 2:
            raise ValueError("num_layers must be >= 2 to hold a Mamba and an attention layer")
        if width_div < 1:
            raise ValueError("width_div must be >= 1")
        units = _layer_units(m)
        chosen = units[:num_layers]
        if not _has_mix(chosen):
            first = next((i for i in range(len(units)) if _has_mix(units[: i + 1])), None)
            if first is None:
                raise ValueError(f"{m.name}: pattern has no Mamba and attention layer pair")
            chosen = units[max(0, first + 1 - num_layers): first + 1]
            if not _has_mix(chosen):
                raise ValueError(f"{m.name}: {num_layers} layers cannot hold both an M and a *")
        pattern = "".join(chosen)

        def div(x: int) -> int:
            return max(1, x // width_div)

        kind = getattr(m, "mamba_kind", "mamba2")
        if kind == "mamba2":
            heads, hdim, dstate, groups = m.mamba_heads, m.mamba_head_dim, m.d_state, m.n_groups
        elif kind == "gdn":
            heads, hdim, dstate, groups = m.gdn_v_heads, m.gdn_v_dim, m.gdn_k_dim, m.gdn_k_heads
        elif kind == "mamba1":
            hdim = 64
            heads, dstate, groups = max(1, m.d_inner // hdim), m.d_state, 1
        else:
            raise ValueError(f"{m.name}: unknown mamba_kind {kind!r}")
        mh = div(heads)
        ng = _largest_divisor_at_most(mh, div(groups))
        qh = div(m.q_heads)
        kvh = _largest_divisor_at_most(qh, div(m.kv_heads))
        hidden = max(8, int(math.ceil(m.hidden / width_div / 8)) * 8)
        ffn = m.ffn_dim
        if ffn <= 0 and m.expert_ffn > 0:      # MoE-only: the active width (FLOPs-equal dense MLP)
            ffn = (max(1, m.top_k) * m.expert_ffn
                   + getattr(m, "shared_experts", 0) * getattr(m, "shared_expert_ffn", 0))
        ffn = div(ffn) if ffn > 0 else 4 * hidden
        family = model_family(m)
        rope_fraction, rope_theta = ATTENTION_POSITIONS[family]
        return cls(
            pattern=pattern, hidden=hidden, vocab=min(m.vocab, max_vocab),
            mamba_heads=mh, mamba_head_dim=hdim, d_state=dstate, n_groups=ng,
            conv_kernel=max(2, m.conv_kernel),
            chunk_size=chunk_size or m.chunk_size or 64,
            q_heads=qh, kv_heads=kvh, head_dim=m.head_dim, ffn_dim=ffn,
            rope_fraction=rope_fraction, rope_theta=rope_theta,
            ffn_gated=getattr(m, "ffn_gated", True), dtype=dtype, seed=seed,
            source=(f"scaled({m.name}, num_layers={num_layers}, width_div={width_div}; "
                    f"{family} attention: "
                    + (f"RoPE on {rope_fraction:g} of each head" if rope_fraction
                       else "no position embedding") + ")"
                    + ("" if kind == "mamba2" else f"; {kind} mixer stood in for by Mamba2")),
        )


def _has_mix(units: list[str]) -> bool:
    s = "".join(units)
    return "M" in s and "*" in s


def _layer_units(m) -> list[str]:
    """The model's layers as block strings: one char (NemotronH style) or mixer + FFN."""
    every = m.num_layers == m.num_mamba_layers + m.num_attention_layers
    if m.pattern is not None and not every:
        return list(m.pattern)
    if m.pattern is not None:
        mixers = m.pattern
    else:
        na, n = m.num_attention_layers, m.num_layers
        period = max(1, n // max(1, na))
        mixers = "".join("*" if (i % period == period - 1 and (i // period) < na) else "M"
                         for i in range(n))
    ffn = "E" if (m.num_moe_layers and not m.num_mlp_layers) else "-"
    return [c + ffn for c in mixers]
