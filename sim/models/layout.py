"""vLLM's KV-cache page / block-size derivation for hybrid models: ``derive_layout``
(``Platform._align_hybrid_block_size``, with the steps written out in
``KVLayout.derivation``) and the block pool's groups (``pool_groups``).

Ground truth is ``docs/models.md`` (§1 page sizing, §4 block sizes, §5 MTP), cross-checked
against the source of vLLM 0.33.0; where the two disagree the vLLM 0.33.0 behaviour is
implemented and the spot is marked ``vLLM 0.33.0:``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sim.models.spec import DTYPE_BYTES, ModelSpec, resolve_dtype

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
