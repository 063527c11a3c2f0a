"""One model's shapes: ``ModelSpec`` (a catalogue entry or an inline definition),
its dtypes and its validation.

Ground truth is ``docs/models.md`` (§2 shapes, §3 bytes), cross-checked against the source of
vLLM 0.33.0.  Parameter counts (``total_params``, ``active_params``, ``mtp_params``) are
*estimated from the shapes* (projection matrices, embeddings, norms; biases and small gates
ignored), not read from checkpoints; they agree with the published sizes to a few per cent and
are meant for weight bytes and FLOPs only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

# --------------------------------------------------------------------------------------------
# dtypes

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32",
    "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
}


def resolve_dtype(name: str, *, what: str, allow_fp8: bool = False) -> str:
    """Canonical dtype name (``bfloat16`` | ``float16`` | ``float32`` | ``fp8``) for a concrete name.

    ``what`` names the setting in the error.  ``auto`` is resolved by the caller.
    """
    if not isinstance(name, str) or name.lower() not in _DTYPE_ALIASES:
        valid = "auto, bfloat16/bf16, float16/fp16, float32/fp32" + (", fp8" if allow_fp8 else "")
        raise ValueError(f"{what}: unknown dtype {name!r} (valid: {valid})")
    canon = _DTYPE_ALIASES[name.lower()]
    if canon == "fp8" and not allow_fp8:
        raise ValueError(f"{what}: fp8 is only supported for the attention KV cache")
    return canon


# --------------------------------------------------------------------------------------------
# model spec

MAMBA_KINDS = ("mamba2", "gdn", "mamba1")
EAGLE_METHODS = ("eagle", "eagle3")
_SEPARATE_CHARS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


class UnknownModelError(KeyError):
    """``get_model`` on a name that is not in the catalogue; ``str()`` is one plain line."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ModelSpec:
    """One hybrid Mamba/attention model, as far as KV-cache sizing and cost need it.

    Layer counting follows the model family:

    * NemotronH style (``num_layers == mamba + attention + mlp + moe``): every pattern position is
      one block -- ``M`` Mamba, ``*`` attention, ``-`` dense MLP, ``E`` MoE.
    * FFN-in-every-layer style (Granite-4.0-H, Qwen3-Next, Jamba; ``num_layers == mamba +
      attention`` and ``mlp + moe == num_layers``): each layer is a mixer (``M`` or ``*`` in
      ``pattern``) followed by a dense or MoE FFN.

    ``mtp_layers`` counts the physical layers of the MTP draft module as vLLM builds it and
    ``mtp_pattern`` names them with the same characters (Nemotron-3-Super: ``"*E"`` = one
    attention layer + one MoE layer; vLLM 0.33.0 ``nemotron_h_mtp.py`` builds
    ``num_nextn_predict_layers (asserted == 1) x len(pattern)`` layers and re-runs them for every
    draft token).  Only the ``*`` layers hold KV cache.
    """

    name: str
    source: str
    hidden: int
    num_layers: int
    num_mamba_layers: int
    num_attention_layers: int
    vocab: int
    q_heads: int
    kv_heads: int
    head_dim: int
    num_mlp_layers: int = 0
    num_moe_layers: int = 0
    pattern: str | None = None
    display_name: str = ""
    # Mamba mixer
    mamba_kind: str = "mamba2"
    conv_kernel: int = 4
    mamba_heads: int = 0          # mamba2
    mamba_head_dim: int = 0       # mamba2
    d_state: int = 0              # mamba2, mamba1
    n_groups: int = 1             # mamba2
    gdn_k_heads: int = 0          # gdn
    gdn_v_heads: int = 0          # gdn
    gdn_k_dim: int = 0            # gdn
    gdn_v_dim: int = 0            # gdn
    d_inner: int = 0              # mamba1
    dt_rank: int = 0              # mamba1 (0 = ceil(hidden / 16))
    chunk_size: int | None = None  # Mamba2 chunk (legacy 'all' mode only)
    supports_all_mode: bool = True
    # attention
    attn_output_gate: bool = False
    # FFN
    ffn_dim: int = 0              # dense MLP intermediate size
    ffn_gated: bool = True        # SwiGLU (3 matrices) vs squared-ReLU up/down (2 matrices)
    num_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    shared_expert_ffn: int = 0    # intermediate size of one shared expert
    moe_latent_dim: int = 0       # latent MoE (Nemotron-3-Super): experts run in this width
    tie_embeddings: bool = False
    dtype: str = "bfloat16"
    # speculative decoding / vLLM rules
    mtp_layers: int = 0
    mtp_pattern: str = ""
    passes_num_spec: bool = True  # vLLM adds num_speculative_tokens rows to the conv state
    default_ssm_dtype: str | None = None  # SSM dtype when mamba_ssm_cache_dtype=auto; None = conv dtype
    # vLLM 0.33.0 model class, and the EAGLE variants it declares (SupportsEagle -> 'eagle',
    # SupportsEagle3 -> 'eagle3'); vLLM refuses the others for this class
    vllm_architecture: str = ""
    eagle_methods: tuple[str, ...] = ("eagle", "eagle3")
    # the default EAGLE drafter (its decoder layers join the KV pool): one layer; 0 = the
    # target's KV heads / head_dim (a scenario's ``speculative:`` section can override them)
    draft_num_layers: int = 1
    draft_num_kv_heads: int = 0
    draft_head_dim: int = 0
    hf_names: tuple[str, ...] = ()
    # parameters: None = estimate from the shapes (params_estimated then True)
    total_params: int | None = None
    active_params: int | None = None
    mtp_params: int | None = None
    params_estimated: bool = True
    notes: str = ""

    def __post_init__(self) -> None:
        _validate(self)
        est_total, est_active, est_mtp = _estimate_params(self)
        given = self.total_params is not None
        object.__setattr__(self, "params_estimated", not given)
        if self.total_params is None:
            object.__setattr__(self, "total_params", est_total)
        if self.active_params is None:
            object.__setattr__(self, "active_params",
                               est_active if not given else min(est_active, self.total_params))
        if self.mtp_params is None:
            object.__setattr__(self, "mtp_params", est_mtp)
        if not self.display_name:
            object.__setattr__(self, "display_name", self.name)

    # -- derived facts ---------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> int:
        """Bytes of the main model's weights in ``dtype`` (MTP head excluded)."""
        return self.total_params * self.dtype_bytes

    @property
    def mtp_weight_bytes(self) -> int:
        return self.mtp_params * self.dtype_bytes

    @property
    def ffn_in_every_layer(self) -> bool:
        return self.num_layers == self.num_mamba_layers + self.num_attention_layers

    @property
    def mtp_attention_layers(self) -> int:
        """KV-cache attention layers the MTP draft module adds (when spec decode uses MTP)."""
        return self.mtp_pattern.count("*")

    @property
    def layer_kinds(self) -> dict[str, int]:
        return {"mamba": self.num_mamba_layers, "attention": self.num_attention_layers,
                "mlp": self.num_mlp_layers, "moe": self.num_moe_layers}

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the conv state at TP=1 (before n_groups padding)."""
        if self.mamba_kind == "mamba2":
            return self.mamba_heads * self.mamba_head_dim + 2 * self.n_groups * self.d_state
        if self.mamba_kind == "gdn":
            return 2 * self.gdn_k_heads * self.gdn_k_dim + self.gdn_v_heads * self.gdn_v_dim
        return self.d_inner

    def flops_per_token(self, context_len: int = 0) -> float:
        """Forward FLOPs for one token with ``context_len`` tokens before it (estimate).

        ``2 x (active params - untied input embedding)`` for the matmuls, plus per attention layer
        ``4 x context_len x q_heads x head_dim`` (QK^T and PV).  Mamba scan work is small
        next to its projections and is not counted separately.
        """
        lookup = 0 if self.tie_embeddings else self.vocab * self.hidden  # tied: the lm_head matmul
        matmul = 2 * (self.active_params - lookup)
        attn = 4 * context_len * self.q_heads * self.head_dim * self.num_attention_layers
        return float(matmul + attn)


def _estimate_params(m: ModelSpec) -> tuple[int, int, int]:
    """(total, active, mtp) parameters from the shapes; see the module docstring."""
    h = m.hidden
    # mixers
    if m.mamba_kind == "mamba2":
        di = m.mamba_heads * m.mamba_head_dim
        conv_dim = di + 2 * m.n_groups * m.d_state
        mamba = (h * (2 * di + 2 * m.n_groups * m.d_state + m.mamba_heads)  # in_proj z,x,B,C,dt
                 + conv_dim * (m.conv_kernel + 1)                             # conv1d + bias
                 + 3 * m.mamba_heads + di                                     # A, D, dt_bias, norm
                 + di * h)                                                    # out_proj
    elif m.mamba_kind == "gdn":
        kd, vd = m.gdn_k_heads * m.gdn_k_dim, m.gdn_v_heads * m.gdn_v_dim
        mamba = (h * (2 * kd + 2 * vd) + h * 2 * m.gdn_v_heads               # in_proj qkvz, ba
                 + (2 * kd + vd) * m.conv_kernel                              # conv1d
                 + 2 * m.gdn_v_heads + m.gdn_v_dim                            # A, dt_bias, norm
                 + vd * h)                                                    # out_proj
    else:
        di, r = m.d_inner, (m.dt_rank or math.ceil(h / 16))
        mamba = (h * 2 * di + di * (m.conv_kernel + 1)                        # in_proj, conv1d
                 + di * (r + 2 * m.d_state) + r * di + di                     # x_proj, dt_proj
                 + di * m.d_state + di                                        # A, D
                 + di * h)                                                    # out_proj
    q_width = m.q_heads * m.head_dim
    attn = h * q_width * (2 if m.attn_output_gate else 1) + 2 * h * m.kv_heads * m.head_dim + q_width * h
    mult = 3 if m.ffn_gated else 2
    mlp = mult * h * m.ffn_dim
    d_exp = m.moe_latent_dim or h
    one_expert = mult * d_exp * m.expert_ffn
    moe_fixed = (m.shared_experts * mult * h * m.shared_expert_ffn + h * m.num_experts
                 + (2 * h * m.moe_latent_dim if m.moe_latent_dim else 0))
    moe_total = m.num_experts * one_expert + moe_fixed
    moe_active = m.top_k * one_expert + moe_fixed
    norms = (m.num_mamba_layers + m.num_attention_layers + m.num_mlp_layers + m.num_moe_layers + 1) * h
    embed = m.vocab * h * (1 if m.tie_embeddings else 2)
    body_common = m.num_mamba_layers * mamba + m.num_attention_layers * attn + m.num_mlp_layers * mlp
    total = body_common + m.num_moe_layers * moe_total + norms + embed
    active = body_common + m.num_moe_layers * moe_active + norms + embed
    # MTP module: eh_proj (2h -> h), two input norms, its layers, final norm; embeddings shared
    mtp = 0
    if m.mtp_pattern:
        ffn = (moe_total if m.num_moe_layers else mlp) if m.ffn_in_every_layer else 0
        per = {"*": attn + ffn, "M": mamba + ffn, "-": mlp, "E": moe_total}
        mtp = 2 * h * h + 3 * h + sum(per[c] + h for c in m.mtp_pattern)
    return total, active, mtp


def _fail(name: str, message: str) -> None:
    raise ValueError(f"{name}: {message}")


def _validate(m: ModelSpec) -> None:
    for f in fields(m):
        v = getattr(m, f.name)
        if f.type in ("int", "int | None") and v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                _fail(f.name, f"must be a non-negative integer, got {v!r}")
        elif f.type in ("str", "str | None") and v is not None and not isinstance(v, str):
            _fail(f.name, f"must be a string, got {v!r}")
        elif f.type == "bool" and not isinstance(v, bool):
            _fail(f.name, f"must be true or false, got {v!r}")
    if not m.name:
        _fail("name", "must not be empty")
    for name in ("hidden", "num_layers", "num_mamba_layers", "num_attention_layers", "vocab",
                 "q_heads", "kv_heads", "head_dim", "conv_kernel"):
        if getattr(m, name) <= 0:
            _fail(name, f"must be positive (a hybrid model needs Mamba and attention layers), "
                        f"got {getattr(m, name)}")
    if m.q_heads % m.kv_heads:
        _fail("kv_heads", f"{m.kv_heads} does not divide q_heads {m.q_heads}")
    if m.dtype not in DTYPE_BYTES or m.dtype == "fp8":
        _fail("dtype", f"must be bfloat16, float16 or float32, got {m.dtype!r}")
    if m.default_ssm_dtype is not None and m.default_ssm_dtype not in ("bfloat16", "float16", "float32"):
        _fail("default_ssm_dtype", f"must be bfloat16, float16, float32 or null, got {m.default_ssm_dtype!r}")
    # layer counts (the pattern first: it is the more specific statement)
    if m.pattern is not None:
        bad = sorted(set(m.pattern) - set(_SEPARATE_CHARS))
        if bad:
            _fail("pattern", f"unknown characters {''.join(bad)!r} (use M * - E)")
        if len(m.pattern) != m.num_layers:
            _fail("pattern", f"has {len(m.pattern)} characters, num_layers is {m.num_layers}")
        counts = {"M": m.num_mamba_layers, "*": m.num_attention_layers, "-": m.num_mlp_layers,
                  "E": m.num_moe_layers}
        checked = "M*-E" if set(m.pattern) & {"-", "E"} else "M*"
        for c in checked:
            if m.pattern.count(c) != counts[c]:
                _fail("pattern", f"has {m.pattern.count(c)} {c!r} but the {_SEPARATE_CHARS[c]} count "
                                 f"is {counts[c]}")
    mixers = m.num_mamba_layers + m.num_attention_layers
    ffns = m.num_mlp_layers + m.num_moe_layers
    if m.num_layers == mixers + ffns and ffns and m.num_layers != mixers:
        style_chars = "M*-E"
    elif m.num_layers == mixers and ffns in (0, m.num_layers):
        style_chars = "M*"
    else:
        _fail("num_layers", f"{m.num_layers} matches neither mamba+attention+mlp+moe "
                            f"({mixers + ffns}) nor mamba+attention ({mixers}) with an FFN in every layer "
                            f"(mlp+moe = {ffns})")
    # mixer dims
    if m.mamba_kind not in MAMBA_KINDS:
        _fail("mamba_kind", f"must be one of {', '.join(MAMBA_KINDS)}, got {m.mamba_kind!r}")
    need = {"mamba2": ("mamba_heads", "mamba_head_dim", "d_state", "n_groups"),
            "gdn": ("gdn_k_heads", "gdn_v_heads", "gdn_k_dim", "gdn_v_dim"),
            "mamba1": ("d_inner", "d_state")}[m.mamba_kind]
    for name in need:
        if getattr(m, name) <= 0:
            _fail(name, f"must be positive for mamba_kind {m.mamba_kind!r}")
    if m.mamba_kind == "mamba2" and m.mamba_heads % m.n_groups:
        _fail("n_groups", f"{m.n_groups} does not divide mamba_heads {m.mamba_heads}")
    if m.mamba_kind == "gdn" and m.gdn_v_heads % m.gdn_k_heads:
        _fail("gdn_k_heads", f"{m.gdn_k_heads} does not divide gdn_v_heads {m.gdn_v_heads}")
    if m.chunk_size is not None and m.chunk_size <= 0:
        _fail("chunk_size", "must be positive")
    # FFN dims
    if m.num_mlp_layers and m.ffn_dim <= 0:
        _fail("ffn_dim", "must be positive when there are MLP layers")
    if m.num_moe_layers:
        for name in ("num_experts", "top_k", "expert_ffn"):
            if getattr(m, name) <= 0:
                _fail(name, "must be positive when there are MoE layers")
        if m.top_k > m.num_experts:
            _fail("top_k", f"{m.top_k} exceeds num_experts {m.num_experts}")
    if m.shared_experts and m.shared_expert_ffn <= 0:
        _fail("shared_expert_ffn", "must be positive when shared_experts > 0")
    # MTP
    if len(m.mtp_pattern) != m.mtp_layers:
        _fail("mtp_pattern", f"{m.mtp_pattern!r} must have one character per MTP layer "
                             f"(mtp_layers = {m.mtp_layers})")
    bad = sorted(set(m.mtp_pattern) - set(style_chars))
    if bad:
        _fail("mtp_pattern", f"characters {''.join(bad)!r} not allowed here (use {style_chars!r})")
    if m.total_params is not None and m.total_params <= 0:
        _fail("total_params", "must be positive")
    # EAGLE drafter
    if not isinstance(m.eagle_methods, tuple) or not set(m.eagle_methods) <= set(EAGLE_METHODS):
        _fail("eagle_methods", f"must be a list drawn from {', '.join(EAGLE_METHODS)}, "
                               f"got {m.eagle_methods!r}")
    if m.draft_num_layers < 1:
        _fail("draft_num_layers", f"an EAGLE drafter has at least one layer, got {m.draft_num_layers}")
