"""The text ``sim model NAME`` prints: a model and its derived KV layout."""
from __future__ import annotations

from sim.models.layout import KVLayout
from sim.models.spec import ModelSpec


def _n(x: int) -> str:
    return f"{x:,}"


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
    if L.num_draft_layers:
        w(f"  drafter ({L.speculative_method}): {L.num_draft_layers} layer(s), {L.draft_kv_heads_per_rank} "
          f"KV heads/rank x {L.draft_head_dim}, {_n(L.draft_attn_bytes_per_token_per_layer)} B per token "
          f"and layer, in the same pool")
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
    if not L.uniform_block_size:
        w(f"  per-group blocks: target attention {L.attention_block_size} tokens"
          + (f", drafter {L.draft_block_size} tokens" if L.draft_block_size else "")
          + f", Mamba {L.block_size} tokens")
    pb = L.pool_block_bytes
    w(f"one pool block = one page for each of the {L.group_size} layer slots of a group = "
      f"{_n(pb)} B ({_mib(pb)}); all {L.num_attention_groups} attention + {L.num_mamba_groups} Mamba "
      f"groups draw blocks from one pool")
    if L.num_draft_groups:
        w(f"  the drafter's attention shape differs: {L.num_draft_groups} of the attention groups are "
          f"the drafter's own")
    if L.eagle_groups:
        w(f"  EAGLE groups (holding the drafter's layers): {', '.join(map(str, L.eagle_groups))}")
    w(f"  {L.block_size} tokens of KV (all {L.num_attention_layers} attention layers) = "
      f"{L.num_attention_groups} pool block(s) = {_n(L.num_attention_groups * pb)} B "
      f"({_mib(L.num_attention_groups * pb)})")
    w(f"  one Mamba checkpoint of a sequence (all {L.num_mamba_layers} layers) = {L.num_mamba_groups} pool "
      f"block(s) = {_n(L.num_mamba_groups * pb)} B ({_mib(L.num_mamba_groups * pb)}), of which states "
      f"{_n(L.mamba_bytes_per_seq)} B")
    if L.prefill_checkpoint_blocks:
        grid = ("any position" if L.prefill_checkpoint_grid <= 1 else
                f"lcm(hash unit, {L.prefill_checkpoint_grid}), or the Mamba block without one")
        how = ("MambaMixer2" if model.mamba_kind == "mamba2"
               else f"GDN on {L.gdn_prefill_backend}")
        w(f"internal prefill checkpoints: {how} exports a state inside a prefill chunk "
          f"(num_prefill_checkpoint_blocks {L.prefill_checkpoint_blocks}, alignment {grid})")
    else:
        why = ("MambaMixer has none" if model.mamba_kind == "mamba1"
               else f"GDN on {L.gdn_prefill_backend} exports none" if model.mamba_kind == "gdn"
               else f"mamba_cache_mode {L.mamba_cache_mode}")
        w(f"internal prefill checkpoints: off ({why}); the scheduler splits prefills at "
          f"the cacheable positions")
    ck = f" + {L.prefill_checkpoint_blocks} checkpoint" if L.prefill_checkpoint_blocks else ""
    base = "1" if L.mamba_cache_mode == "none" else "2"
    w(f"a request holds up to {L.mamba_blocks_per_request} blocks per Mamba group ({base} + "
      f"{L.num_speculative_tokens} speculative{ck}; every speculative method)")
    return "\n".join(out)
