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

from sim.models.drafter import check_kv_heads, resolve_drafter
from sim.models.pool import Bucket, plan_pool, pool_groups, unify_pages
from sim.models.spec import DTYPE_BYTES, ModelSpec, resolve_dtype

__all__ = ["KVLayout", "derive_layout", "pool_groups"]

@dataclass(frozen=True)
class KVLayout:
    """Per-GPU (per TP rank) KV-cache layout vLLM derives for one model and cache configuration.

    Byte counts are per layer and per request slot unless named ``_per_seq`` (all Mamba layers)
    or ``attn_bytes_per_token`` (all attention layers, drafter included).  ``page_bytes`` is the
    one page size every layer shares after vLLM pads the Mamba page (and, with a drafter of
    another attention shape, unifies the pages); the block pool is described by ``group_size``
    (layers per KV-cache group, one page each per pool block) and ``pool_block_bytes``.

    The drafter's layers are in the pool as vLLM puts them there: MTP attention layers
    (``num_mtp_attention_layers``) and EAGLE decoder layers (``num_draft_layers``) count in
    ``num_attention_layers``; a drafter whose per-rank attention shape equals the target's shares
    its groups, any other gets groups of its own (``num_draft_groups``, counted in
    ``num_attention_groups``).  ``eagle_groups`` lists the groups (indices in ``groups``, vLLM's
    order) that hold drafter layers: vLLM's EAGLE groups.
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
    num_attention_layers: int          # incl. the drafter's (MTP or EAGLE) attention layers
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
    page_bytes: int                    # the unified page: block_size x target KV per token, or the drafter's
    padding_fraction: float            # (page - mamba_page) / mamba_page
    # block pool (vLLM _get_kv_cache_groups_uniform_page_size)
    group_size: int
    num_attention_groups: int
    num_mamba_groups: int
    padding_layer_slots: int
    pool_block_bytes: int              # one pool block = one page for each layer slot of a group
    derivation: list[str] = field(default_factory=list, compare=False, hash=False)
    # internal prefill checkpoints (vLLM's MambaSpec fields, as the model's Mamba layer sets
    # them): blocks reserved per chunk (0 = the layer cannot export a state mid-chunk) and the
    # layer's checkpoint grid (MambaMixer2: any position, 1; GDN on FlashInfer: 64)
    prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_grid: int = 0
    gdn_prefill_backend: str | None = None
    # the drafter's KV layers (EAGLE heads; MTP layers are num_mtp_attention_layers)
    num_draft_layers: int = 0
    draft_kv_heads_per_rank: int = 0
    draft_head_dim: int = 0
    draft_attn_bytes_per_token_per_layer: int = 0
    num_draft_groups: int = 0          # groups of the drafter's own spec (0: it shares the target's)
    attention_block_size: int = 0      # tokens per block of the target's attention groups
    draft_block_size: int = 0          # ... of the drafter's own groups (0 without them)
    eagle_groups: tuple[int, ...] = ()
    mamba_blocks_per_request: int = 0  # align mode: 2 + k (+ prefill checkpoint blocks) per Mamba group
    group_kinds: tuple[str, ...] = ()  # full | mamba per group, in vLLM's order (see ``groups``)

    @property
    def groups(self) -> tuple[str, ...]:
        """The pool's KV-cache groups in vLLM's order (``kv_cache_config.kv_cache_groups``):
        buckets in the order their first layer registers, so Mamba first for a model that
        starts with a Mamba layer.  The order decides which group's blocks a step takes from
        the free queue first, hence what is evicted."""
        if self.group_kinds:
            return self.group_kinds
        return ("full",) * self.num_attention_groups + ("mamba",) * self.num_mamba_groups

    @property
    def uniform_block_size(self) -> bool:
        """True when every group has ``block_size`` tokens per block (False when vLLM grew
        the target's or the drafter's attention block to unify pages)."""
        return all(b in (0, self.block_size) for b in (self.attention_block_size,
                                                        self.draft_block_size))

    def prefill_checkpoints(self, hash_block_size: int | None) -> tuple[int, int]:
        """(num_prefill_checkpoint_blocks, prefill_checkpoint_alignment) of every Mamba group.

        MambaMixer2 sets (1, 1) unconditionally; a GDN layer exporting checkpoints (FlashInfer
        prefill) sets its alignment to the prefix-cache grid: lcm(hash unit, 64), or the Mamba
        block when no hash unit is set (vLLM 0.33.0 ``get_mamba_prefill_checkpoint_grid``)."""
        if self.prefill_checkpoint_blocks <= 0:
            return 0, 1
        if self.prefill_checkpoint_grid <= 1:
            return self.prefill_checkpoint_blocks, 1
        if hash_block_size is not None:
            return self.prefill_checkpoint_blocks, math.lcm(hash_block_size,
                                                            self.prefill_checkpoint_grid)
        return self.prefill_checkpoint_blocks, self.mamba_block_size or self.block_size

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


def _first_mixer_is_mamba(m: ModelSpec) -> bool:
    """Whether the model's first mixer layer is a Mamba layer.  NemotronH-style models say
    it in ``pattern``; the FFN-in-every-layer models of the catalogue (Granite-4.0-H,
    Qwen3-Next, Jamba) all start with Mamba layers (attention every few layers)."""
    if m.pattern:
        for c in m.pattern:
            if c in "M*":
                return c == "M"
    return True


def _pick(value: str, what: str, auto: str, auto_why: str, fp8: bool = False) -> tuple[str, str]:
    """A dtype setting resolved: ``auto`` (and why it means what it does) or the one set."""
    if isinstance(value, str) and value.lower() == "auto":
        return auto, f"auto -> {auto_why}"
    return resolve_dtype(value, what=what, allow_fp8=fp8), "set"


def _dtypes(m: ModelSpec, kv_cache_dtype: str, mamba_cache_dtype: str,
            mamba_ssm_cache_dtype: str, steps: list[str]) -> tuple[str, str, str]:
    """The KV, conv-state and SSM-state dtypes, refused as vLLM refuses them."""
    # dtypes ---------------------------------------------------------------------------------
    kv_dt, kv_why = _pick(kv_cache_dtype, "kv_cache_dtype", m.dtype, "model dtype", fp8=True)
    if kv_why == "set" and kv_dt == "float32":
        raise ValueError("kv_cache_dtype: vLLM 0.33.0 has no float32 KV cache (CacheDType: auto, "
                         "bfloat16, float16, fp8, ...); use auto for a float32 model")
    if kv_why == "set" and kv_dt in ("bfloat16", "float16") and kv_dt != m.dtype:
        allowed = f"auto or {m.dtype}" if m.dtype in ("bfloat16", "float16") else "auto"
        raise ValueError(f"kv_cache_dtype: {kv_dt} is incompatible with the model dtype {m.dtype} "
                         f"(vLLM 0.33.0 refuses it; use {allowed})")
    conv_dt, conv_why = _pick(mamba_cache_dtype, "mamba_cache_dtype", m.dtype, "model dtype")
    if m.default_ssm_dtype is not None:
        ssm_auto, ssm_auto_why = m.default_ssm_dtype, "NemotronH default (HF config / float32)"
    else:
        ssm_auto, ssm_auto_why = conv_dt, "conv dtype"
    ssm_dt, ssm_why = _pick(mamba_ssm_cache_dtype, "mamba_ssm_cache_dtype", ssm_auto, ssm_auto_why)
    steps.append(f"dtypes: KV {kv_dt} ({kv_why}), conv state {conv_dt} ({conv_why}), "
                 f"SSM state {ssm_dt} ({ssm_why})")

    return kv_dt, conv_dt, ssm_dt


def _attention_page(m: ModelSpec, d, tp: int, kv_b: int, method: str | None,
                    steps: list[str]) -> tuple[int, int, int, int, int]:
    """Per token, the bytes of one attention layer's page (the target's, then the
    drafter's) and of all of them: (kv heads per rank, bytes per token and layer, layers,
    drafter's kv heads per rank, drafter's bytes per token and layer)."""
    n_mtp_attn, n_draft = d.mtp_attention_layers, d.eagle_layers
    # attention page -------------------------------------------------------------------------
    kv_rank = max(1, m.kv_heads // tp)
    attn_1 = 2 * kv_rank * m.head_dim * kv_b
    n_attn = m.num_attention_layers + n_mtp_attn + n_draft
    d_rank = max(1, d.kv_heads // tp) if n_draft else 0
    d_attn_1 = 2 * d_rank * d.head_dim * kv_b
    steps.append(f"attention page for 1 token = 2 (K,V) x {kv_rank} KV heads/rank "
                 f"(max(1, {m.kv_heads}/{tp})) x {m.head_dim} head_dim x {kv_b} B = {_n(attn_1)} B")
    mtp_txt = f" incl. {n_mtp_attn} MTP attention layer(s)" if n_mtp_attn else ""
    n_same = n_attn - n_draft
    attn_all = attn_1 * n_same + d_attn_1 * n_draft
    if n_draft:
        steps.append(f"{method} drafter: {n_draft} layer(s) x 2 (K,V) x {d_rank} KV heads/rank "
                     f"(max(1, {d.kv_heads}/{tp})) x {d.head_dim} head_dim x {kv_b} B = "
                     f"{_n(d_attn_1)} B per token and layer")
        mtp_txt = f" incl. the drafter's {n_draft}"
    steps.append(f"KV per token, all {n_attn} attention layers{mtp_txt}: "
                 + (f"{_n(attn_1)} x {n_attn}" if d_attn_1 in (0, attn_1) else
                    f"{_n(attn_1)} x {n_same} + {_n(d_attn_1)} x {n_draft}")
                 + f" = {_n(attn_all)} B")

    return kv_rank, attn_1, n_attn, d_rank, d_attn_1


def _mamba_page(m: ModelSpec, k: int, tp: int, conv_b: int, ssm_b: int, steps: list[str]):
    """One Mamba layer's state for one request: (conv shape, SSM shape, conv bytes, SSM
    bytes, page bytes), as vLLM's state shape functions give them per rank."""
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

    return conv_shape, ssm_shape, conv_bytes, ssm_bytes, page


def _block_size(m: ModelSpec, page: int, attn_1: int, a0: int, block_size: int | None,
                gdn_prefill_backend: str, mamba_cache_mode: str, steps: list[str]):
    """vLLM's ``_align_hybrid_block_size``: (kernel alignment, block size, internal prefill
    checkpoint blocks and grid, attention page padded, Mamba block size)."""
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
    if gdn_prefill_backend not in ("flashinfer", "triton"):
        raise ValueError(f"gdn_prefill_backend: must be flashinfer or triton, "
                         f"got {gdn_prefill_backend!r}")
    ckpt_blocks, ckpt_grid = 0, 0
    if mamba_cache_mode == "align":
        if m.mamba_kind == "mamba2":
            ckpt_blocks, ckpt_grid = 1, 1
        elif m.mamba_kind == "gdn" and gdn_prefill_backend == "flashinfer":
            ckpt_blocks, ckpt_grid = 1, 64
            if a % 64:
                steps.append(f"GDN prefill on FlashInfer exports checkpoints on a 64-token grid: "
                             f"a = lcm({a}, 64) = {math.lcm(a, 64)}")
                a = math.lcm(a, 64)
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

    return a, blk, ckpt_blocks, ckpt_grid, padded, mamba_blk


def _block_pool(m: ModelSpec, d, method: str | None, n_attn: int, kv_rank: int, d_rank: int,
                d_attn_1: int, padded: int, blk: int, steps: list[str]):
    """The pages unified and the layers grouped into the pool, as vLLM's
    ``unify_kv_cache_spec_page_size`` and ``get_kv_cache_groups`` do: (unified page, the
    target's and the drafter's attention block sizes, the pool plan, attention / Mamba /
    drafter group counts, EAGLE groups)."""
    n_mtp_attn, n_draft = d.mtp_attention_layers, d.eagle_layers
    # block pool -----------------------------------------------------------------------------
    n_m = m.num_mamba_layers
    own_draft = n_draft > 0 and (d_rank, d.head_dim) != (kv_rank, m.head_dim)
    pages = {"attention": (padded, blk, False), "mamba": (padded, blk, True)}
    if own_draft:
        pages["draft"] = (blk * d_attn_1, blk, False)
    unified = unify_pages(pages)
    page_u, attn_blk = unified["attention"]
    draft_blk = unified["draft"][1] if own_draft else 0
    if own_draft:
        d_page = blk * d_attn_1
        how = {"attention": "", "draft": ""}
        for kind, own in (("attention", padded), ("draft", d_page)):
            if own == page_u:
                how[kind] = "as is"
            elif unified[kind][1] != blk:
                how[kind] = f"block x {page_u // own} = {_n(unified[kind][1])} tokens"
            else:
                how[kind] = f"padded by {_n(page_u - own)} B"
        steps.append(f"the drafter's page ({_n(blk)} x {_n(d_attn_1)} = {_n(d_page)} B) differs from the "
                     f"target's ({_n(padded)} B): vLLM unifies both to {_n(page_u)} B (target "
                     f"attention {how['attention']}, drafter {how['draft']}, Mamba "
                     f"{'as is' if page_u == padded else 'padded to it'}) and gives the drafter "
                     f"groups of its own")
    # vLLM forms one bucket per layer spec in the order the layers register (the target's
    # layers in model order, the drafter's after them), so a model whose first mixer is a
    # Mamba layer (every catalogue model) has its Mamba groups first
    attn_bucket = Bucket("attention", n_attn - (n_draft if own_draft else 0), attn_blk, page_u,
                         draft_layers=0 if own_draft else n_draft + n_mtp_attn)
    mamba_bucket = Bucket("mamba", n_m, blk, page_u)
    first = ([mamba_bucket, attn_bucket] if _first_mixer_is_mamba(m)
             else [attn_bucket, mamba_bucket])
    buckets = first + [Bucket("draft", n_draft if own_draft else 0, draft_blk, page_u,
                              draft_layers=n_draft)]
    plan = plan_pool(buckets)
    ga = sum(1 for kind, _, _ in plan.groups if kind != "mamba")
    gm = len(plan.groups) - ga
    gd = sum(1 for kind, _, _ in plan.groups if kind == "draft")
    eagle = tuple(i for i, (_, _, held) in enumerate(plan.groups) if held) if method else ()
    pad_txt = f", {plan.padding_layer_slots} empty layer slot(s)" if plan.padding_layer_slots else ""
    draft_txt = f" (of them {gd} the drafter's)" if gd else ""
    steps.append(f"block pool: {n_attn} attention + {n_m} Mamba layers -> group_size "
                 f"{plan.group_size} -> {ga} attention{draft_txt} + {gm} Mamba group(s){pad_txt}; one "
                 f"pool block = {plan.group_size} pages = {_n(plan.pool_block_bytes)} B")
    if eagle:
        steps.append(f"EAGLE groups (holding drafter layers): {', '.join(map(str, eagle))} "
                     f"(attention groups first)")
    return page_u, attn_blk, draft_blk, plan, ga, gm, gd, eagle


def derive_layout(model: ModelSpec, *, tp: int = 1, num_speculative_tokens: int = 0,
                  mamba_cache_dtype: str = "auto", mamba_ssm_cache_dtype: str = "auto",
                  kv_cache_dtype: str = "auto", kernel_block_size: int = 16,
                  block_size: int | None = None, mamba_cache_mode: str = "align",
                  speculative_method: str = "auto",
                  gdn_prefill_backend: str = "flashinfer",
                  draft_num_layers: int | None = None, draft_num_kv_heads: int | None = None,
                  draft_head_dim: int | None = None) -> KVLayout:
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
    * ``gdn_prefill_backend`` (GDN models only): ``flashinfer`` (what vLLM picks on Hopper, and on
      Blackwell for 128-wide keys) exports prefill checkpoints on a 64-token grid, so vLLM keeps
      the block a multiple of 64; ``triton`` exports none (models.md §4 assumes it: a = 16).
    * ``speculative_method`` (``sim.models.drafter``): ``auto`` = ``mtp`` when
      ``num_speculative_tokens > 0`` and the model ships MTP layers, else its first EAGLE variant,
      else ``ngram``.  ``mtp`` adds the MTP attention layers to the pool, ``eagle`` / ``eagle3`` the
      EAGLE head's ``draft_num_layers`` layers with ``draft_num_kv_heads`` x ``draft_head_dim``
      (defaults: the catalogue's, else one layer shaped like the target's attention); a head of
      another per-rank shape gets its own groups and vLLM unifies the pages
      (``unify_kv_cache_spec_page_size``).  ``ngram`` / ``suffix`` / ``external`` add none.  Every
      method keeps ``k`` speculative conv rows and ``k`` speculative Mamba blocks per request.
    * ``kv_cache_dtype``: ``auto``, ``fp8`` or the model's own dtype; vLLM refuses ``float32``
      and a 16-bit dtype other than the model's.

    Raises ``ValueError`` (one line, naming the setting) on invalid settings.
    """
    tp = _positive_int("tp", tp)
    k = _positive_int("num_speculative_tokens", num_speculative_tokens, 0)
    a0 = _positive_int("kernel_block_size", kernel_block_size)
    if mamba_cache_mode not in ("align", "none", "all"):
        raise ValueError(f"mamba_cache_mode: must be align, none or all, got {mamba_cache_mode!r}")
    steps: list[str] = []
    m = model

    kv_dt, conv_dt, ssm_dt = _dtypes(m, kv_cache_dtype, mamba_cache_dtype, mamba_ssm_cache_dtype,
                                     steps)
    kv_b, conv_b, ssm_b = DTYPE_BYTES[kv_dt], DTYPE_BYTES[conv_dt], DTYPE_BYTES[ssm_dt]
    # speculative method ------------------------------------------------------------------------
    if m.q_heads % tp:
        raise ValueError(f"tp: {tp} does not divide the attention heads ({m.q_heads})")
    check_kv_heads("tp", m.kv_heads, tp)
    d = resolve_drafter(m, k=k, method=speculative_method, tp=tp, draft_num_layers=draft_num_layers,
                        draft_num_kv_heads=draft_num_kv_heads, draft_head_dim=draft_head_dim)
    method = d.method
    n_mtp_attn, n_draft = d.mtp_attention_layers, d.eagle_layers
    if method is not None:
        steps.append(f"speculative method {method} ({d.why}), k = {k}")

    kv_rank, attn_1, n_attn, d_rank, d_attn_1 = _attention_page(m, d, tp, kv_b, method, steps)
    attn_all = attn_1 * (n_attn - n_draft) + d_attn_1 * n_draft
    conv_shape, ssm_shape, conv_bytes, ssm_bytes, page = _mamba_page(m, k, tp, conv_b, ssm_b, steps)
    a, blk, ckpt_blocks, ckpt_grid, padded, mamba_blk = _block_size(
        m, page, attn_1, a0, block_size, gdn_prefill_backend, mamba_cache_mode, steps)
    page_u, attn_blk, draft_blk, plan, ga, gm, gd, eagle = _block_pool(
        m, d, method, n_attn, kv_rank, d_rank, d_attn_1, padded, blk, steps)
    n_m = m.num_mamba_layers
    per_req = (1 + k) if mamba_cache_mode == "none" else (2 + k + ckpt_blocks)
    pad_u = (page_u - page) / page

    return KVLayout(
        model=m.name, tp=tp, num_speculative_tokens=k, speculative_method=method,
        mamba_cache_mode=mamba_cache_mode, kv_dtype=kv_dt, conv_dtype=conv_dt, ssm_dtype=ssm_dt,
        num_attention_layers=n_attn, num_mtp_attention_layers=n_mtp_attn, kv_heads_per_rank=kv_rank,
        attn_bytes_per_token_per_layer=attn_1, attn_bytes_per_token=attn_all,
        num_mamba_layers=n_m, conv_shape=conv_shape, ssm_shape=ssm_shape,
        conv_bytes_per_layer=conv_bytes, ssm_bytes_per_layer=ssm_bytes, mamba_page_bytes=page,
        conv_bytes_per_seq=conv_bytes * n_m, ssm_bytes_per_seq=ssm_bytes * n_m,
        mamba_bytes_per_seq=page * n_m, mamba_page_bytes_padded=page_u,
        kernel_alignment=a, block_size=blk, mamba_block_size=mamba_blk, page_bytes=page_u,
        padding_fraction=pad_u, group_size=plan.group_size, num_attention_groups=ga,
        num_mamba_groups=gm, padding_layer_slots=plan.padding_layer_slots,
        pool_block_bytes=plan.pool_block_bytes, derivation=steps, prefill_checkpoint_blocks=ckpt_blocks,
        prefill_checkpoint_grid=ckpt_grid,
        gdn_prefill_backend=gdn_prefill_backend if m.mamba_kind == "gdn" else None,
        num_draft_layers=n_draft, draft_kv_heads_per_rank=d_rank,
        draft_head_dim=d.head_dim if n_draft else 0, draft_attn_bytes_per_token_per_layer=d_attn_1,
        num_draft_groups=gd, attention_block_size=attn_blk, draft_block_size=draft_blk,
        eagle_groups=eagle, mamba_blocks_per_request=per_req,
        group_kinds=tuple("mamba" if kind == "mamba" else "full" for kind, _, _ in plan.groups))
