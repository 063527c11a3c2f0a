"""Model catalogue and vLLM's KV-cache page / block-size derivation for hybrid models.

Ground truth is ``docs/models.md`` (§1 page sizing, §2 shapes, §3 bytes, §4 block sizes,
§5 MTP), cross-checked against the source of vLLM 0.33.0 (the release the cache model follows).
Where the two disagree the vLLM 0.33.0 behaviour is implemented and the spot is marked
``vLLM 0.33.0:`` below.

* :class:`ModelSpec` -- one model's shapes (one catalogue entry or an inline definition).
* :func:`get_model` / :func:`model_from_mapping` -- look one up / build one from a mapping.
* :func:`derive_layout` -- the page sizes and the attention block size vLLM picks
  (``Platform._align_hybrid_block_size``), with the steps written out in ``KVLayout.derivation``.
* :func:`describe` -- the text ``sim model NAME`` prints.

Parameter counts (``total_params``, ``active_params``, ``mtp_params``) are *estimated from the
shapes* (projection matrices, embeddings, norms; biases and small gates ignored), not read from
checkpoints; they agree with the published sizes to a few per cent and are meant for weight
bytes and FLOPs only.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping

__all__ = [
    "ModelSpec", "KVLayout", "UnknownModelError", "CATALOGUE", "model_names", "get_model",
    "model_from_mapping", "derive_layout", "describe", "resolve_dtype", "DTYPE_BYTES",
    "pool_groups",
]

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


# --------------------------------------------------------------------------------------------
# catalogue

_MB = "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/models/nemotronh/nemotron_h_provider.py"
_NEMOTRON_H = dict(mamba_kind="mamba2", mamba_head_dim=64, n_groups=8, conv_kernel=4, head_dim=128,
                   vocab=131072, ffn_gated=False, chunk_size=128, passes_num_spec=True,
                   default_ssm_dtype="float32")
_NEMOTRON_H_NOTE = ("vLLM NemotronH rule: mamba_ssm_cache_dtype=auto -> HF config's "
                    "mamba_ssm_cache_dtype, else float32 (NemotronHForCausalLMConfig)")


def _entries() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="nemotron-h-8b", display_name="Nemotron-H-8B-Base-8K",
            source=f"models.md §2 row Nemotron-H-8B-Base-8K: [S] {_MB} (NemotronHModelProvider8B) "
                   "+ HF config excerpt nvidia/Nemotron-H-8B-Base-8K; chunk_size 128 [M]",
            hidden=4096, num_layers=52, num_mamba_layers=24, num_attention_layers=4, num_mlp_layers=24,
            pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
            mamba_heads=128, d_state=128, q_heads=32, kv_heads=8, ffn_dim=21504,
            hf_names=("nvidia/Nemotron-H-8B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-h-47b", display_name="Nemotron-H-47B-Base-8K",
            source=f"models.md §2 row Nemotron-H-47B-Base-8K: [S] {_MB} (NemotronHModelProvider47B, "
                   "pattern); chunk_size 128 [M]",
            hidden=8192, num_layers=98, num_mamba_layers=45, num_attention_layers=5, num_mlp_layers=48,
            pattern=("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM"
                     "---M-M*-M-M-M-M-M-"),
            mamba_heads=256, d_state=256, q_heads=64, kv_heads=8, ffn_dim=30720,
            hf_names=("nvidia/Nemotron-H-47B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-h-56b", display_name="Nemotron-H-56B-Base-8K",
            source=f"models.md §2 row Nemotron-H-56B-Base-8K: [S] {_MB} (NemotronHModelProvider56B); "
                   "NVIDIA blog research.nvidia.com/labs/adlr/nemotronh '54 Mamba-2, 54 MLP, 10 attention'; "
                   "chunk_size 128 [S]",
            hidden=8192, num_layers=118, num_mamba_layers=54, num_attention_layers=10, num_mlp_layers=54,
            pattern=("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                     "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
            mamba_heads=256, d_state=256, q_heads=64, kv_heads=8, ffn_dim=32768,
            hf_names=("nvidia/Nemotron-H-56B-Base-8K",), notes=_NEMOTRON_H_NOTE, **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-nano-9b-v2", display_name="NVIDIA-Nemotron-Nano-9B-v2",
            source=f"models.md §2 row NVIDIA-Nemotron-Nano-9B-v2: [S] {_MB} (NemotronNanoModelProvider9Bv2) "
                   "+ HF config excerpt nvidia/NVIDIA-Nemotron-Nano-9B-v2 (mamba_ssm_cache_dtype float32); "
                   "chunk_size 128 [M]",
            hidden=4480, num_layers=56, num_mamba_layers=27, num_attention_layers=4, num_mlp_layers=25,
            pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
            mamba_heads=128, d_state=128, q_heads=40, kv_heads=8, ffn_dim=15680,
            **{**_NEMOTRON_H, "mamba_head_dim": 80},
            hf_names=("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "Nemotron-Nano-9B-v2"),
            notes=_NEMOTRON_H_NOTE),
        ModelSpec(
            name="nemotron-3-nano-30b", display_name="NVIDIA-Nemotron-3-Nano-30B-A3B",
            source=f"models.md §2 row Nemotron-3-Nano-30B-A3B: [S] {_MB} (Nemotron3NanoProvider: 128 experts "
                   "top-6, expert ffn 1856, shared expert 3712); chunk_size 128 [M]",
            hidden=2688, num_layers=52, num_mamba_layers=23, num_attention_layers=6, num_moe_layers=23,
            pattern="MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
            mamba_heads=64, d_state=128, q_heads=32, kv_heads=2,
            num_experts=128, top_k=6, expert_ffn=1856, shared_experts=1, shared_expert_ffn=3712,
            hf_names=("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NVIDIA-Nemotron-3-Nano-30B-A3B",
                      "Nemotron-3-Nano-30B-A3B"),
            notes=_NEMOTRON_H_NOTE + "; no MTP weights [M]", **_NEMOTRON_H),
        ModelSpec(
            name="nemotron-3-super-120b", display_name="NVIDIA-Nemotron-3-Super-120B-A12B",
            source=f"models.md §2 row Nemotron-3-Super-120B-A12B and §5: [S] {_MB} (Nemotron3SuperProvider: "
                   "512 experts top-22, expert ffn 2688, shared 5376, latent MoE 1024, MTP pattern '*E'); "
                   "MTP as built by vLLM 0.33.0 vllm/model_executor/models/nemotron_h_mtp.py; chunk_size 128 [M]",
            hidden=4096, num_layers=88, num_mamba_layers=40, num_attention_layers=8, num_moe_layers=40,
            pattern=("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*"
                     "EMEMEMEME"),
            mamba_heads=128, d_state=128, q_heads=32, kv_heads=2,
            num_experts=512, top_k=22, expert_ffn=2688, shared_experts=1, shared_expert_ffn=5376,
            moe_latent_dim=1024, mtp_layers=2, mtp_pattern="*E",
            hf_names=("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", "NVIDIA-Nemotron-3-Super-120B-A12B",
                      "Nemotron-3-Super-120B-A12B"),
            notes=(_NEMOTRON_H_NOTE + "; MTP module = 2 layers '*E' (attention + MoE): with MTP spec decode "
                   "it adds 1 KV-cache attention layer (models.md §3 says '+2 MTP attn'; vLLM 0.33.0 builds "
                   "one '*' layer: num_nextn_predict_layers == 1 is asserted)"),
            **_NEMOTRON_H),
        ModelSpec(
            name="qwen3-next-80b-a3b", display_name="Qwen3-Next-80B-A3B",
            source=("models.md §2 row Qwen3-Next-80B-A3B: [S] HF config excerpt Qwen/Qwen3-Next-80B-A3B-Instruct "
                    "(full_attention_interval 4, head_dim 256, linear_* fields); head counts and MoE dims "
                    "(512 experts top-10, expert ffn 512, 1 shared expert 512) [M]; MTP: §5 qwen3_next_mtp.py "
                    "(1 layer)"),
            hidden=2048, num_layers=48, num_mamba_layers=36, num_attention_layers=12, num_moe_layers=48,
            pattern="MMM*" * 12,
            mamba_kind="gdn", gdn_k_heads=16, gdn_v_heads=32, gdn_k_dim=128, gdn_v_dim=128, conv_kernel=4,
            supports_all_mode=False,
            q_heads=16, kv_heads=2, head_dim=256, attn_output_gate=True, vocab=151936,
            num_experts=512, top_k=10, expert_ffn=512, shared_experts=1, shared_expert_ffn=512,
            mtp_layers=1, mtp_pattern="*", passes_num_spec=True, default_ssm_dtype=None,
            hf_names=("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking",
                      "Qwen3-Next-80B-A3B"),
            notes="mamba_cache_mode 'all' is rejected by vLLM ('please use --mamba-cache-mode=align')"),
        ModelSpec(
            name="granite-4.0-h-small", display_name="Granite-4.0-H-Small (32B-A9B)",
            source=("models.md §2 row Granite-4.0-H-Small: [S] HF config excerpt ibm-granite/granite-4.0-h-small "
                    "(layer_types 36 mamba / 4 attention, 72 experts top-10); mamba heads 128 and n_groups 1 [M]; "
                    "chunk_size 256 [M]; expert ffn 768 / shared 1536 / tied embeddings [M] (third-party copy "
                    "of the HF config)"),
            hidden=4096, num_layers=40, num_mamba_layers=36, num_attention_layers=4, num_moe_layers=40,
            mamba_kind="mamba2", mamba_heads=128, mamba_head_dim=64, d_state=128, n_groups=1, conv_kernel=4,
            chunk_size=256, q_heads=32, kv_heads=8, head_dim=128, vocab=100352, tie_embeddings=True,
            num_experts=72, top_k=10, expert_ffn=768, shared_experts=1, shared_expert_ffn=1536,
            # vLLM 0.33.0 granitemoehybrid.py passes num_spec=vllm_config.num_speculative_tokens into
            # mamba2_state_shape (models.md §1 says Granite does not; that was an older vLLM).
            passes_num_spec=True, default_ssm_dtype=None,
            hf_names=("ibm-granite/granite-4.0-h-small",),
            notes="conv state grows with num_speculative_tokens in vLLM 0.33.0 (granitemoehybrid.py)"),
        ModelSpec(
            name="jamba-1.5-mini", display_name="Jamba-1.5-Mini (= Jamba-v0.1 shape)",
            source=("models.md §2 row Jamba-v0.1 / Jamba-1.5-Mini: [S] HF config excerpt ai21labs/Jamba-v0.1 "
                    "(attention offset 4 period 8, Mamba1 d_inner 8192, d_state 16, conv 4); MoE 16 experts "
                    "top-2, ffn 14336 every 2nd layer [M]"),
            hidden=4096, num_layers=32, num_mamba_layers=28, num_attention_layers=4,
            num_mlp_layers=16, num_moe_layers=16, pattern="MMMM*MMM" * 4,
            mamba_kind="mamba1", d_inner=8192, d_state=16, conv_kernel=4, dt_rank=256,
            supports_all_mode=False,
            q_heads=32, kv_heads=8, head_dim=128, vocab=65536,
            ffn_dim=14336, num_experts=16, top_k=2, expert_ffn=14336,
            passes_num_spec=False, default_ssm_dtype=None,
            hf_names=("ai21labs/AI21-Jamba-1.5-Mini", "AI21-Jamba-1.5-Mini", "ai21labs/Jamba-v0.1",
                      "jamba-v0.1"),
            notes="Mamba1: conv state never includes speculative rows; no 'all' mode"),
    ]


CATALOGUE: dict[str, ModelSpec] = {m.name: m for m in _entries()}


def _norm(name: str) -> str:
    return name.strip().lower()


def _lookup_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for m in CATALOGUE.values():
        for alias in (m.name, m.display_name, *m.hf_names):
            a = _norm(alias)
            table[a] = m.name
            table[a.split("/", 1)[-1]] = m.name  # without the org prefix
    return table


_LOOKUP = _lookup_table()


def model_names() -> list[str]:
    return list(CATALOGUE)


def get_model(name: str) -> ModelSpec:
    """Catalogue entry by name, case-insensitively; HF-style names (``org/Repo``) work too."""
    key = _norm(str(name))
    hit = _LOOKUP.get(key) or _LOOKUP.get(key.split("/", 1)[-1])
    if hit is None:
        raise UnknownModelError(f"unknown model {name!r}; valid names: {', '.join(CATALOGUE)}")
    return CATALOGUE[hit]


_FIELD_TYPES = {f.name: f.type for f in fields(ModelSpec)}
_DERIVED_ONLY = {"params_estimated"}


def model_from_mapping(d: Mapping[str, Any]) -> ModelSpec:
    """Build a :class:`ModelSpec` from a mapping (inline YAML/JSON definition).

    Keys are the ``ModelSpec`` field names.  Extras:

    * ``base: NAME`` starts from a catalogue entry and overrides only the keys given.
    * ``pattern`` alone fills the four layer counts and ``num_layers`` (NemotronH characters).
    * ``dtype`` accepts the short names (bf16, fp16, fp32).

    Raises ``ValueError`` naming the field on unknown keys, missing fields and bad values.
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"model: expected a mapping, got {type(d).__name__}")
    data = dict(d)
    base_name = data.pop("base", None)
    for key in data:
        if key not in _FIELD_TYPES or key in _DERIVED_ONLY:
            raise ValueError(f"{key}: unknown model field")
    kw: dict[str, Any] = {}
    if base_name is not None:
        try:
            base = get_model(base_name)
        except UnknownModelError as e:
            raise ValueError(f"base: {e}") from None
        kw = {f.name: getattr(base, f.name) for f in fields(ModelSpec) if f.name not in _DERIVED_ONLY}
        # estimates follow the new shapes unless counts are given again
        for k in ("total_params", "active_params", "mtp_params", "display_name", "hf_names"):
            kw.pop(k)
        if "name" not in data:
            raise ValueError("name: required when overriding a base model")
        kw["source"] = f"inline definition based on {base.name} ({base.source})"
    for key, value in data.items():
        if key == "hf_names":
            if isinstance(value, str):
                value = (value,)
            elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
                value = tuple(value)
            else:
                raise ValueError(f"hf_names: must be a list of strings, got {value!r}")
        elif key in ("dtype", "default_ssm_dtype") and isinstance(value, str):
            value = resolve_dtype(value, what=key)
        elif key == "pattern" and value is not None and not isinstance(value, str):
            raise ValueError(f"pattern: must be a string, got {value!r}")
        kw[key] = value
    pattern = data.get("pattern")
    if isinstance(pattern, str):
        bad = sorted(set(pattern) - set(_SEPARATE_CHARS))
        if bad:
            raise ValueError(f"pattern: unknown characters {''.join(bad)!r} (use M * - E)")
        derived = {"num_layers": len(pattern), "num_mamba_layers": pattern.count("M"),
                   "num_attention_layers": pattern.count("*")}
        if set(pattern) & {"-", "E"}:  # NemotronH style: FFN blocks are pattern positions
            derived.update(num_mlp_layers=pattern.count("-"), num_moe_layers=pattern.count("E"))
        for key, value in derived.items():
            if key not in data:
                kw[key] = value
    kw.setdefault("source", "inline definition")
    for f in fields(ModelSpec):
        if f.default is MISSING and f.name not in kw:
            raise ValueError(f"{f.name}: required")
    for name, value in kw.items():
        t = _FIELD_TYPES[name]
        if t in ("int", "int | None") and not (value is None and t == "int | None"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name}: must be an integer, got {value!r}")
        elif t == "bool" and not isinstance(value, bool):
            raise ValueError(f"{name}: must be true or false, got {value!r}")
        elif t in ("str", "str | None") and not (value is None and t == "str | None") \
                and not isinstance(value, str):
            raise ValueError(f"{name}: must be a string, got {value!r}")
    return ModelSpec(**kw)


# --------------------------------------------------------------------------------------------
# layout

@dataclass(frozen=True)
class KVLayout:
    """Per-GPU (per TP rank) KV-cache layout vLLM derives for one model and cache configuration.

    Byte counts are per layer and per request slot unless named ``_per_seq`` (all Mamba layers)
    or ``attn_bytes_per_token`` (all attention layers).  ``page_bytes`` is the one page size every
    layer shares after vLLM pads the Mamba page; the block pool is described by ``group_size``
    (layers per KV-cache group, one page each per pool block) and ``pool_block_bytes``.
    """

    model: str
    tp: int
    num_speculative_tokens: int
    speculative_method: str | None
    mamba_cache_mode: str
    kv_dtype: str
    conv_dtype: str
    ssm_dtype: str
    # attention
    num_attention_layers: int          # incl. MTP attention layers when spec decode uses MTP
    num_mtp_attention_layers: int
    kv_heads_per_rank: int
    attn_bytes_per_token_per_layer: int
    attn_bytes_per_token: int          # all attention layers
    # Mamba
    num_mamba_layers: int
    conv_shape: tuple[int, int]        # (rows = conv_kernel - 1 [+ num_spec], channels per rank)
    ssm_shape: tuple[int, ...]
    conv_bytes_per_layer: int
    ssm_bytes_per_layer: int
    mamba_page_bytes: int              # conv + ssm, one layer, unpadded
    conv_bytes_per_seq: int
    ssm_bytes_per_seq: int
    mamba_bytes_per_seq: int
    mamba_page_bytes_padded: int       # = page_bytes
    # block size
    kernel_alignment: int
    block_size: int
    mamba_block_size: int | None       # None in mode 'none' (vLLM: max_model_len)
    page_bytes: int                    # block_size x attn_bytes_per_token_per_layer
    padding_fraction: float            # (page - mamba_page) / mamba_page
    # block pool (vLLM _get_kv_cache_groups_uniform_page_size)
    group_size: int
    num_attention_groups: int
    num_mamba_groups: int
    padding_layer_slots: int
    pool_block_bytes: int              # one pool block = one page for each layer slot of a group
    derivation: list[str] = field(default_factory=list, compare=False, hash=False)

    @property
    def mamba_bytes_per_layer(self) -> int:
        return self.mamba_page_bytes

    @property
    def uses_mtp(self) -> bool:
        return self.speculative_method == "mtp"

    @property
    def num_pool_groups(self) -> int:
        return self.num_attention_groups + self.num_mamba_groups

    @property
    def tokens_per_mamba_state(self) -> float:
        """Attention tokens (one layer) whose KV equals one layer's (unpadded) Mamba state."""
        return self.mamba_page_bytes / self.attn_bytes_per_token_per_layer


def pool_groups(num_attention_layers: int, num_mamba_layers: int) -> dict[str, int]:
    """vLLM's KV-cache groups for one attention type + one Mamba type (uniform page size).

    vLLM 0.33.0 ``kv_cache_planning._get_kv_cache_groups_uniform_page_size``: group_size = the
    smaller layer count, or the larger one when it is < 1.5x the smaller; each type is split into
    ``ceil(n / group_size)`` groups (layers[i::n_groups]); every group is ``group_size`` layer
    slots wide, so one pool block costs ``group_size`` pages and narrower groups leave slots empty.
    """
    lo, hi = sorted((num_attention_layers, num_mamba_layers))
    group_size = hi if hi < lo * 1.5 else lo
    ga = math.ceil(num_attention_layers / group_size)
    gm = math.ceil(num_mamba_layers / group_size)
    padding = (ga + gm) * group_size - num_attention_layers - num_mamba_layers
    return {"group_size": group_size, "num_attention_groups": ga, "num_mamba_groups": gm,
            "padding_layer_slots": padding}


_SPEC_METHODS = ("auto", "mtp", "external", "eagle", "eagle3", "ngram", "draft_model", "suffix")


def _positive_int(name: str, v: Any, minimum: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"{name}: must be an integer >= {minimum}, got {v!r}")
    return v


def _divide(what: str, a: int, tp: int) -> int:
    if a % tp:
        raise ValueError(f"tp: {tp} does not divide {what} ({a})")
    return a // tp


def _n(x: int) -> str:
    return f"{x:,}"


def derive_layout(model: ModelSpec, *, tp: int = 1, num_speculative_tokens: int = 0,
                  mamba_cache_dtype: str = "auto", mamba_ssm_cache_dtype: str = "auto",
                  kv_cache_dtype: str = "auto", kernel_block_size: int = 16,
                  block_size: int | None = None, mamba_cache_mode: str = "align",
                  speculative_method: str = "auto") -> KVLayout:
    """Page sizes and the attention block size vLLM picks (models.md §1; vLLM 0.33.0
    ``Platform._align_hybrid_block_size``).

    * ``kernel_block_size``: the attention backend's smallest kernel block (16 for FlashAttention /
      FlashInfer on Hopper; 32 for FlashInfer + head 256 on Blackwell; 64 for the FlashInfer GDN
      prefill checkpoint grid).
    * ``block_size``: the user's ``--block-size``.  It must be a multiple of ``kernel_block_size``.
      As in vLLM it becomes the alignment ``a = max(kernel_block_size, block_size)``, so a size that
      holds one Mamba state is used as given and a smaller one grows to the next multiple of itself.
    * ``mamba_cache_mode``: ``align`` (default; ``mamba_block_size = block_size``), ``none`` (same
      block size, Mamba block = max_model_len, no prefix caching) or ``all`` (legacy mode of older
      vLLM releases, removed in 0.33.0; kept to reproduce models.md §4's 'all' column).
    * ``speculative_method``: ``auto`` = ``mtp`` when ``num_speculative_tokens > 0`` and the model
      ships MTP layers, else ``external``; ``mtp`` adds the MTP attention layers to the KV cache;
      the KV layers of any other drafter (EAGLE heads, draft models) are not modelled.

    Raises ``ValueError`` (one line, naming the setting) on invalid settings.
    """
    tp = _positive_int("tp", tp)
    k = _positive_int("num_speculative_tokens", num_speculative_tokens, 0)
    a0 = _positive_int("kernel_block_size", kernel_block_size)
    if mamba_cache_mode not in ("align", "none", "all"):
        raise ValueError(f"mamba_cache_mode: must be align, none or all, got {mamba_cache_mode!r}")
    if speculative_method not in _SPEC_METHODS:
        raise ValueError(f"speculative_method: must be one of {', '.join(_SPEC_METHODS)}, "
                         f"got {speculative_method!r}")
    steps: list[str] = []
    m = model

    # dtypes ---------------------------------------------------------------------------------
    def pick(value: str, what: str, auto: str, auto_why: str, fp8: bool = False) -> tuple[str, str]:
        if isinstance(value, str) and value.lower() == "auto":
            return auto, f"auto -> {auto_why}"
        return resolve_dtype(value, what=what, allow_fp8=fp8), "set"

    kv_dt, kv_why = pick(kv_cache_dtype, "kv_cache_dtype", m.dtype, "model dtype", fp8=True)
    conv_dt, conv_why = pick(mamba_cache_dtype, "mamba_cache_dtype", m.dtype, "model dtype")
    if m.default_ssm_dtype is not None:
        ssm_auto, ssm_auto_why = m.default_ssm_dtype, "NemotronH default (HF config / float32)"
    else:
        ssm_auto, ssm_auto_why = conv_dt, "conv dtype"
    ssm_dt, ssm_why = pick(mamba_ssm_cache_dtype, "mamba_ssm_cache_dtype", ssm_auto, ssm_auto_why)
    kv_b, conv_b, ssm_b = DTYPE_BYTES[kv_dt], DTYPE_BYTES[conv_dt], DTYPE_BYTES[ssm_dt]
    steps.append(f"dtypes: KV {kv_dt} ({kv_why}), conv state {conv_dt} ({conv_why}), "
                 f"SSM state {ssm_dt} ({ssm_why})")

    # speculative method ------------------------------------------------------------------------
    method: str | None
    if k == 0:
        if speculative_method == "mtp":
            raise ValueError("speculative_method: 'mtp' needs num_speculative_tokens >= 1")
        method = None
    elif speculative_method == "auto":
        method = "mtp" if m.mtp_layers else "external"
    else:
        method = speculative_method
    if method == "mtp" and not m.mtp_layers:
        raise ValueError(f"speculative_method: {m.name} has no MTP layers")
    n_mtp_attn = m.mtp_attention_layers if method == "mtp" else 0

    # attention page -------------------------------------------------------------------------
    if m.q_heads % tp:
        raise ValueError(f"tp: {tp} does not divide the attention heads ({m.q_heads})")
    kv_rank = max(1, m.kv_heads // tp)
    attn_1 = 2 * kv_rank * m.head_dim * kv_b
    n_attn = m.num_attention_layers + n_mtp_attn
    steps.append(f"attention page for 1 token = 2 (K,V) x {kv_rank} KV heads/rank "
                 f"(max(1, {m.kv_heads}/{tp})) x {m.head_dim} head_dim x {kv_b} B = {_n(attn_1)} B")
    mtp_txt = f" incl. {n_mtp_attn} MTP attention layer(s)" if n_mtp_attn else ""
    steps.append(f"KV per token, all {n_attn} attention layers{mtp_txt}: {_n(attn_1)} x {n_attn} "
                 f"= {_n(attn_1 * n_attn)} B")

    # Mamba page -----------------------------------------------------------------------------
    ns = k if m.passes_num_spec else 0
    if m.mamba_kind == "mamba2":
        extra = 0 if m.n_groups % tp == 0 else tp - m.n_groups
        ng = m.n_groups + extra
        di = m.mamba_heads * m.mamba_head_dim
        conv_dim = di + 2 * ng * m.d_state
        rows = m.conv_kernel - 1 + ns
        conv_shape = (rows, _divide("the conv channels", conv_dim, tp))
        ssm_shape: tuple[int, ...] = (_divide("mamba_heads", m.mamba_heads, tp), m.mamba_head_dim,
                                      m.d_state)
        grp = f" (n_groups {m.n_groups} padded to {ng} for TP {tp})" if extra else ""
        conv_formula = (f"conv_dim = {m.mamba_heads}x{m.mamba_head_dim} + 2x{ng}x{m.d_state} "
                        f"= {_n(conv_dim)}{grp}")
    elif m.mamba_kind == "gdn":
        conv_dim = m.mamba_conv_dim
        rows = m.conv_kernel - 1 + ns
        conv_shape = (rows, _divide("the conv channels", conv_dim, tp))
        ssm_shape = (_divide("gdn_v_heads", m.gdn_v_heads, tp), m.gdn_v_dim, m.gdn_k_dim)
        conv_formula = (f"conv_dim = 2x{m.gdn_k_heads}x{m.gdn_k_dim} + {m.gdn_v_heads}x{m.gdn_v_dim} "
                        f"= {_n(conv_dim)}")
    else:
        conv_dim = m.d_inner
        rows = m.conv_kernel - 1
        conv_shape = (rows, _divide("d_inner", m.d_inner, tp))
        ssm_shape = (conv_shape[1], m.d_state)
        conv_formula = f"conv_dim = d_inner = {_n(conv_dim)}"
    conv_bytes = conv_shape[0] * conv_shape[1] * conv_b
    ssm_bytes = math.prod(ssm_shape) * ssm_b
    page = conv_bytes + ssm_bytes
    if k and not m.passes_num_spec:
        rows_txt = f"conv_kernel {m.conv_kernel} - 1; vLLM adds no rows for the {k} speculative tokens here"
    elif k:
        rows_txt = f"conv_kernel {m.conv_kernel} - 1 + {k} speculative tokens"
    else:
        rows_txt = f"conv_kernel {m.conv_kernel} - 1"
    steps.append(f"conv state ({rows} rows = {rows_txt}) x {_n(conv_shape[1])} channels/rank x {conv_b} B "
                 f"= {_n(conv_bytes)} B [{conv_formula}]")
    steps.append(f"SSM state {' x '.join(_n(x) for x in ssm_shape)} x {ssm_b} B = {_n(ssm_bytes)} B")
    steps.append(f"Mamba page (one layer, one request) = {_n(conv_bytes)} + {_n(ssm_bytes)} = {_n(page)} B; "
                 f"x {m.num_mamba_layers} Mamba layers = {_n(page * m.num_mamba_layers)} B per sequence")

    # block size -----------------------------------------------------------------------------
    if block_size is not None:
        block_size = _positive_int("block_size", block_size)
        if block_size % a0:
            raise ValueError(f"block_size: {block_size} is not a multiple of the kernel alignment {a0}")
    a = max(a0, block_size or 0)
    if block_size is None:
        steps.append(f"kernel alignment a = {a} (attention backend's smallest kernel block)")
    else:
        steps.append(f"kernel alignment a = max(kernel {a0}, --block-size {block_size}) = {a}")
    if mamba_cache_mode == "all":
        if m.mamba_kind == "mamba1" or not m.supports_all_mode:
            raise ValueError(f"mamba_cache_mode: 'all' is not supported for {m.name} "
                             f"(use --mamba-cache-mode=align)")
        if m.chunk_size is None:
            raise ValueError(f"mamba_cache_mode: 'all' needs the model's chunk_size ({m.name} has none)")
        chunk = math.lcm(m.chunk_size, a)
        min_tokens = math.ceil(page / attn_1)
        blk = chunk * math.ceil(min_tokens / chunk)
        steps.append(f"'all' mode: chunk = lcm(chunk_size {m.chunk_size}, a {a}) = {chunk}; block_size = "
                     f"chunk x ceil(ceil({_n(page)} / {_n(attn_1)}) / chunk) = {chunk} x "
                     f"ceil({min_tokens} / {chunk}) = {_n(blk)}")
    else:
        mult = math.ceil(page / (a * attn_1))
        blk = a * mult
        steps.append(f"block_size = a x ceil(mamba_page / (a x attn_page_1tok)) = {a} x ceil({_n(page)} / "
                     f"{_n(a * attn_1)}) = {a} x {mult} = {_n(blk)}")
        if block_size is not None and blk != block_size:
            steps.append(f"--block-size {block_size} cannot hold one Mamba state "
                         f"({_n(block_size * attn_1)} B < {_n(page)} B); vLLM grows it to {_n(blk)}")
    padded = blk * attn_1
    pad = (padded - page) / page
    steps.append(f"attention page = {_n(blk)} x {_n(attn_1)} = {_n(padded)} B; Mamba page padded by "
                 f"{_n(padded - page)} B ({pad:.2%} of the state)")
    mamba_blk = None if mamba_cache_mode == "none" else blk
    if mamba_cache_mode == "align":
        steps.append(f"align mode: mamba_block_size = block_size = {_n(blk)} (the prefix cache resumes "
                     f"only at multiples of {_n(blk)} tokens)")
    elif mamba_cache_mode == "all":
        steps.append(f"'all' mode: mamba_block_size = block_size = {_n(blk)}")
    else:
        steps.append("mode none: no Mamba prefix caching (mamba_block_size = max_model_len)")

    # block pool -----------------------------------------------------------------------------
    g = pool_groups(n_attn, m.num_mamba_layers)
    pool_block = g["group_size"] * padded
    pad_txt = f", {g['padding_layer_slots']} empty layer slot(s)" if g["padding_layer_slots"] else ""
    steps.append(f"block pool: {n_attn} attention + {m.num_mamba_layers} Mamba layers -> group_size "
                 f"{g['group_size']} -> {g['num_attention_groups']} attention + {g['num_mamba_groups']} "
                 f"Mamba group(s){pad_txt}; one pool block = {g['group_size']} pages = {_n(pool_block)} B")

    return KVLayout(
        model=m.name, tp=tp, num_speculative_tokens=k, speculative_method=method,
        mamba_cache_mode=mamba_cache_mode, kv_dtype=kv_dt, conv_dtype=conv_dt, ssm_dtype=ssm_dt,
        num_attention_layers=n_attn, num_mtp_attention_layers=n_mtp_attn, kv_heads_per_rank=kv_rank,
        attn_bytes_per_token_per_layer=attn_1, attn_bytes_per_token=attn_1 * n_attn,
        num_mamba_layers=m.num_mamba_layers, conv_shape=conv_shape, ssm_shape=ssm_shape,
        conv_bytes_per_layer=conv_bytes, ssm_bytes_per_layer=ssm_bytes, mamba_page_bytes=page,
        conv_bytes_per_seq=conv_bytes * m.num_mamba_layers, ssm_bytes_per_seq=ssm_bytes * m.num_mamba_layers,
        mamba_bytes_per_seq=page * m.num_mamba_layers, mamba_page_bytes_padded=padded,
        kernel_alignment=a, block_size=blk, mamba_block_size=mamba_blk, page_bytes=padded,
        padding_fraction=pad, group_size=g["group_size"], num_attention_groups=g["num_attention_groups"],
        num_mamba_groups=g["num_mamba_groups"], padding_layer_slots=g["padding_layer_slots"],
        pool_block_bytes=pool_block, derivation=steps)


# --------------------------------------------------------------------------------------------
# describe

def _mib(b: float) -> str:
    if b >= 2**30:
        return f"{b / 2**30:,.2f} GiB"
    return f"{b / 2**20:,.1f} MiB" if b >= 2**20 else f"{b / 2**10:,.1f} KiB"


def _params(p: int) -> str:
    return f"{p / 1e9:.1f} B" if p >= 1e9 else f"{p / 1e6:.0f} M"


def describe(layout: KVLayout, model: ModelSpec) -> str:
    """Multi-line, human-readable account of a model and its layout (``sim model NAME``)."""
    m, L = model, layout
    if layout.model != model.name:
        raise ValueError(f"layout: derived for {layout.model!r}, not {model.name!r}")
    out: list[str] = []
    w = out.append
    w(f"{m.display_name}  [{m.name}]")
    w(f"  source: {m.source}")
    if m.ffn_in_every_layer:
        ffn = "MoE" if m.num_moe_layers == m.num_layers else (
            "dense FFN" if m.num_mlp_layers == m.num_layers else
            f"{m.num_moe_layers} MoE / {m.num_mlp_layers} dense")
        w(f"  layers: {m.num_layers} ({m.num_mamba_layers} {m.mamba_kind} + {m.num_attention_layers} "
          f"attention mixers, an FFN in every layer: {ffn})")
    else:
        w(f"  layers: {m.num_layers} ({m.num_mamba_layers} {m.mamba_kind}, {m.num_attention_layers} attention, "
          f"{m.num_mlp_layers} MLP, {m.num_moe_layers} MoE)")
    if m.pattern:
        w(f"  pattern: {m.pattern}")
    w(f"  hidden {m.hidden}, vocab {m.vocab}, {m.dtype}")
    if m.mamba_kind == "mamba2":
        w(f"  Mamba2: {m.mamba_heads} heads x {m.mamba_head_dim}, d_state {m.d_state}, n_groups {m.n_groups}, "
          f"conv {m.conv_kernel} (conv_dim {m.mamba_conv_dim})")
    elif m.mamba_kind == "gdn":
        w(f"  Gated DeltaNet: {m.gdn_k_heads} k-heads x {m.gdn_k_dim}, {m.gdn_v_heads} v-heads x {m.gdn_v_dim}, "
          f"conv {m.conv_kernel} (conv_dim {m.mamba_conv_dim})")
    else:
        w(f"  Mamba1: d_inner {m.d_inner}, d_state {m.d_state}, conv {m.conv_kernel}")
    w(f"  attention: {m.q_heads} q / {m.kv_heads} kv heads x {m.head_dim}")
    parts = []
    if m.num_mlp_layers:
        parts.append(f"dense FFN {m.ffn_dim} ({'SwiGLU' if m.ffn_gated else 'squared ReLU'})")
    if m.num_moe_layers:
        moe = f"MoE {m.num_experts} experts top-{m.top_k} x {m.expert_ffn}"
        if m.shared_experts:
            moe += f" + {m.shared_experts} shared x {m.shared_expert_ffn}"
        if m.moe_latent_dim:
            moe += f", latent {m.moe_latent_dim}"
        parts.append(moe)
    w(f"  FFN: {'; '.join(parts)}")
    est = "estimated from shapes" if m.params_estimated else "given"
    w(f"  params: {_params(m.total_params)} total, {_params(m.active_params)} active per token ({est}); "
      f"weights {_mib(m.weight_bytes)} in {m.dtype}")
    if m.mtp_layers:
        w(f"  MTP: {m.mtp_layers} layer(s) {m.mtp_pattern!r} ({m.mtp_attention_layers} with KV cache), "
          f"~{_params(m.mtp_params)} params")
    spec = (f"{L.num_speculative_tokens} speculative tokens ({L.speculative_method})"
            if L.num_speculative_tokens else "no speculative decoding")
    w("")
    w(f"settings: TP {L.tp}, {spec}, mamba_cache_mode {L.mamba_cache_mode}, KV {L.kv_dtype}, "
      f"conv {L.conv_dtype}, SSM {L.ssm_dtype}")
    w("state per Mamba layer (one request):")
    w(f"  conv {L.conv_shape[0]} x {_n(L.conv_shape[1])} = {_n(L.conv_bytes_per_layer)} B; "
      f"SSM {' x '.join(_n(x) for x in L.ssm_shape)} = {_n(L.ssm_bytes_per_layer)} B; "
      f"total {_n(L.mamba_page_bytes)} B ({_mib(L.mamba_page_bytes)})")
    w(f"state per sequence ({L.num_mamba_layers} Mamba layers): conv {_mib(L.conv_bytes_per_seq)} + "
      f"SSM {_mib(L.ssm_bytes_per_seq)} = {_n(L.mamba_bytes_per_seq)} B ({_mib(L.mamba_bytes_per_seq)})")
    w(f"KV per token: {_n(L.attn_bytes_per_token_per_layer)} B per attention layer, "
      f"{_n(L.attn_bytes_per_token)} B over all {L.num_attention_layers}")
    w(f"  one layer's state = the KV of {L.tokens_per_mamba_state:,.0f} tokens in one layer; a sequence's "
      f"state = the whole-model KV of {L.mamba_bytes_per_seq / L.attn_bytes_per_token:,.0f} tokens")
    w("")
    w("block size, step by step:")
    for i, s in enumerate(L.derivation, 1):
        w(f"  {i}. {s}")
    w("")
    w(f"block_size {L.block_size} tokens, mamba_block_size {L.mamba_block_size or 'max_model_len'}; "
      f"page {_n(L.page_bytes)} B, padding {L.padding_fraction:.2%} of each Mamba state "
      f"({_n(L.page_bytes - L.mamba_page_bytes)} B)")
    pb = L.pool_block_bytes
    w(f"one pool block = one page for each of the {L.group_size} layer slots of a group = "
      f"{_n(pb)} B ({_mib(pb)}); all {L.num_attention_groups} attention + {L.num_mamba_groups} Mamba "
      f"groups draw blocks from one pool")
    w(f"  {L.block_size} tokens of KV (all {L.num_attention_layers} attention layers) = "
      f"{L.num_attention_groups} pool block(s) = {_n(L.num_attention_groups * pb)} B "
      f"({_mib(L.num_attention_groups * pb)})")
    w(f"  one Mamba checkpoint of a sequence (all {L.num_mamba_layers} layers) = {L.num_mamba_groups} pool "
      f"block(s) = {_n(L.num_mamba_groups * pb)} B ({_mib(L.num_mamba_groups * pb)}), of which states "
      f"{_n(L.mamba_bytes_per_seq)} B")
    return "\n".join(out)
