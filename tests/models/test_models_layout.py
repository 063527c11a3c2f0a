"""derive_layout against docs/models.md §3 (bytes) and §4 (block sizes), plus vLLM rules."""
import pytest

from sim.models import derive_layout, get_model, pool_groups

# models.md §4: (ssm bf16 / KV bf16, ssm fp32 / KV bf16, ssm bf16 / KV fp8, ssm fp32 / KV fp8,
#                'all' bf16 ssm, 'all' fp32 ssm) -- conv state bf16 throughout, TP 1, a = 16, k = 0
TABLE4 = {
    "nemotron-h-8b": (528, 1040, 1056, 2080, 640, 1152),
    "nemotron-h-47b": (2080, 4128, 4160, 8256, 2176, 4224),
    "nemotron-h-56b": (2080, 4128, 4160, 8256, 2176, 4224),
    "nemotron-nano-9b-v2": (672, 1312, 1328, 2608, 768, 1408),
    "nemotron-3-nano-30b": (1072, 2096, 2128, 4176, 1152, 2176),
    "nemotron-3-super-120b": (2112, 4160, 4224, 8320, 2176, 4224),
    "granite-4.0-h-small": (528, 1040, 1056, 2080, 768, 1280),
    "qwen3-next-80b-a3b": (544, 1056, 1072, 2096, None, None),
    "jamba-1.5-mini": (80, 144, 160, 288, None, None),
}
# models.md §4 "vLLM default ssm dtype" column (defaults everywhere)
DEFAULT_BLOCK = {"nemotron-h-8b": 1040, "nemotron-h-47b": 4128, "nemotron-h-56b": 4128,
                 "nemotron-nano-9b-v2": 1312, "nemotron-3-nano-30b": 2096, "nemotron-3-super-120b": 4160,
                 "granite-4.0-h-small": 528, "qwen3-next-80b-a3b": 544, "jamba-1.5-mini": 80}

CELLS = [(name, col, want) for name, row in TABLE4.items() for col, want in enumerate(row)]


@pytest.mark.parametrize("name,col,want", CELLS, ids=[f"{n}-{c}" for n, c, _ in CELLS])
def test_table4_block_sizes(name, col, want):
    ssm = ("bf16", "fp32")[col % 2] if col < 4 else ("bf16", "fp32")[col - 4]
    kv = "fp8" if col in (2, 3) else "auto"
    mode = "all" if col >= 4 else "align"
    model = get_model(name)
    if want is None:
        with pytest.raises(ValueError, match="mamba_cache_mode"):
            derive_layout(model, mamba_cache_dtype="bf16", mamba_ssm_cache_dtype=ssm, mamba_cache_mode=mode)
        return
    # models.md's table assumes a = 16 everywhere: for GDN that is the Triton prefill backend
    layout = derive_layout(model, mamba_cache_dtype="bf16", mamba_ssm_cache_dtype=ssm,
                           kv_cache_dtype=kv, mamba_cache_mode=mode, gdn_prefill_backend="triton")
    assert layout.block_size == want
    assert layout.mamba_block_size == want


@pytest.mark.parametrize("name,want", DEFAULT_BLOCK.items())
def test_default_dtypes_block_size(name, want):
    assert derive_layout(get_model(name), gdn_prefill_backend="triton").block_size == want


# models.md §4 "Where does 4,416 come from?": default dtypes, k = 0..5
SWEEPS = {
    "nemotron-3-super-120b": [4160, 4176, 4208, 4224, 4240, 4256],
    "nemotron-h-8b": [1040, 1056, 1056, 1056, 1072, 1072],
    "nemotron-nano-9b-v2": [1312, 1312, 1312, 1328, 1328, 1328],
    "nemotron-3-nano-30b": [2096, 2096, 2112, 2128, 2144, 2144],
    "qwen3-next-80b-a3b": [544, 544, 560, 560, 576, 576],
}


@pytest.mark.parametrize("name,want", SWEEPS.items())
def test_speculative_sweep(name, want):
    model = get_model(name)
    assert [derive_layout(model, num_speculative_tokens=k, gdn_prefill_backend="triton").block_size
            for k in range(6)] == want


def test_qwen3_next_flashinfer_gdn_aligns_block_to_64():
    """Issue #20 §2: on H100/H200 vLLM picks FlashInfer's GDN prefill, whose checkpoint grid
    (64) joins the kernel alignment, so TP 1 gives 576, not 544; Nemotron (MambaMixer2) is
    unaffected, and Triton keeps models.md's 544."""
    q = get_model("qwen3-next-80b-a3b")
    assert [derive_layout(q, num_speculative_tokens=k).block_size for k in range(6)] == [576] * 6
    assert derive_layout(q, gdn_prefill_backend="triton").block_size == 544
    lay = derive_layout(q)
    assert (lay.prefill_checkpoint_blocks, lay.prefill_checkpoint_grid) == (1, 64)
    assert lay.prefill_checkpoints(None) == (1, 576)       # grid = the Mamba block
    assert lay.prefill_checkpoints(16) == (1, 64)          # lcm(hash unit, 64)
    assert derive_layout(q, gdn_prefill_backend="triton").prefill_checkpoints(16) == (0, 1)
    n = derive_layout(get_model("nemotron-h-8b"))
    assert n.block_size == 1040 and n.prefill_checkpoints(None) == (1, 1)   # MambaMixer2
    assert derive_layout(get_model("jamba-1.5-mini")).prefill_checkpoints(None) == (0, 1)


@pytest.mark.parametrize("name,kw", [
    ("nemotron-3-super-120b", dict(mamba_cache_dtype="float32", mamba_ssm_cache_dtype="float32")),
    ("nemotron-3-super-120b", dict(mamba_cache_dtype="bf16", mamba_ssm_cache_dtype="bf16", kv_cache_dtype="fp8")),
    ("nemotron-h-47b", dict(mamba_cache_dtype="fp32", mamba_ssm_cache_dtype="bf16", kv_cache_dtype="fp8")),
])
def test_4416_with_five_speculative_tokens_and_zero_padding(name, kw):
    layout = derive_layout(get_model(name), num_speculative_tokens=5, **kw)
    assert layout.block_size == 4416
    assert layout.padding_fraction == 0
    assert layout.page_bytes == layout.mamba_page_bytes


def test_4416_super_breakdown():
    layout = derive_layout(get_model("nemotron-3-super-120b"), num_speculative_tokens=5,
                           mamba_cache_dtype="float32", mamba_ssm_cache_dtype="float32")
    assert layout.ssm_bytes_per_layer == 4_194_304 == 4096 * 1024
    assert layout.conv_bytes_per_layer == 327_680 == (3 + 5) * 10_240 * 4
    assert layout.conv_shape == (8, 10_240)
    assert layout.attn_bytes_per_token_per_layer == 1024
    assert any("4,416" in step for step in layout.derivation)


def test_no_model_gives_4416_at_defaults_without_spec():
    from sim.models import model_names
    assert all(derive_layout(get_model(n)).block_size != 4416 for n in model_names())


# models.md §3: conv B, ssm16 B, ssm32 B, KV/tok/L, KV/tok all, seq state MiB (bf16 / ssm-fp32),
# tokens = 1 state (bf16 / fp32), tokens = seq (bf16 / fp32)
TABLE3 = {
    "nemotron-h-8b": (61_440, 2_097_152, 4_194_304, 4096, 16_384, 49.4, 97.4, 527, 1039, 3162, 6234),
    "nemotron-h-47b": (122_880, 8_388_608, 16_777_216, 4096, 20_480, 365, 725, 2078, 4126, 18_702, 37_134),
    "nemotron-h-56b": (122_880, 8_388_608, 16_777_216, 4096, 40_960, 438, 870, 2078, 4126, 11_221, 22_280),
    "nemotron-nano-9b-v2": (73_728, 2_621_440, 5_242_880, 4096, 16_384, 69.4, 136.9, 658, 1298, 4442, 8762),
    "nemotron-3-nano-30b": (36_864, 1_048_576, 2_097_152, 1024, 6144, 23.8, 46.8, 1060, 2084, 4063, 7989),
    "nemotron-3-super-120b": (61_440, 2_097_152, 4_194_304, 1024, 8192, 82.3, 162.3, 2108, 4156, 10_540, 20_780),
    "granite-4.0-h-small": (50_688, 2_097_152, 4_194_304, 4096, 16_384, 73.7, 145.7, 524, 1036, 4719, 9327),
    "qwen3-next-80b-a3b": (49_152, 1_048_576, 2_097_152, 2048, 24_576, 37.7, 73.7, 536, 1048, 1608, 3144),
    "jamba-1.5-mini": (49_152, 262_144, 524_288, 4096, 16_384, 8.3, 15.3, 76, 140, 532, 980),
}


@pytest.mark.parametrize("name,row", TABLE3.items())
def test_table3_bytes(name, row):
    conv, ssm16, ssm32, kv_l, kv_all, seq16, seq32, tok16, tok32, seqtok16, seqtok32 = row
    model = get_model(name)
    l16 = derive_layout(model, mamba_cache_dtype="bf16", mamba_ssm_cache_dtype="bf16")
    l32 = derive_layout(model, mamba_cache_dtype="bf16", mamba_ssm_cache_dtype="fp32")
    assert l16.conv_bytes_per_layer == l32.conv_bytes_per_layer == conv
    assert l16.ssm_bytes_per_layer == ssm16
    assert l32.ssm_bytes_per_layer == ssm32
    assert l16.attn_bytes_per_token_per_layer == kv_l
    assert l16.attn_bytes_per_token == kv_all          # no MTP layers without spec decode
    assert l16.mamba_bytes_per_seq / 2**20 == pytest.approx(seq16, rel=0.002, abs=0.06)
    assert l32.mamba_bytes_per_seq / 2**20 == pytest.approx(seq32, rel=0.002, abs=0.06)
    # the doc rounds these ratios to the nearest token
    assert round(l16.tokens_per_mamba_state) == tok16
    assert round(l32.tokens_per_mamba_state) == tok32
    assert round(l16.mamba_bytes_per_seq / l16.attn_bytes_per_token) == seqtok16
    assert round(l32.mamba_bytes_per_seq / l32.attn_bytes_per_token) == seqtok32
    assert l16.conv_bytes_per_seq + l16.ssm_bytes_per_seq == l16.mamba_bytes_per_seq


def test_spec_tokens_add_one_conv_row_each():
    # models.md §3 note: Nemotron-H-8B +20,480 B per speculative token with bf16 conv
    model = get_model("nemotron-h-8b")
    base = derive_layout(model).conv_bytes_per_layer
    assert derive_layout(model, num_speculative_tokens=3).conv_bytes_per_layer - base == 3 * 20_480


def test_jamba_ignores_spec_tokens_in_conv_state():
    model = get_model("jamba-1.5-mini")
    assert not model.passes_num_spec
    assert derive_layout(model, num_speculative_tokens=4).conv_shape == (3, 8192)
    assert derive_layout(model, num_speculative_tokens=4).block_size == 80


def test_granite_passes_num_spec_like_vllm_0_33():
    # vLLM 0.33.0 granitemoehybrid.get_mamba_state_shape_from_config passes num_spec
    model = get_model("granite-4.0-h-small")
    assert model.passes_num_spec
    assert derive_layout(model, num_speculative_tokens=2).conv_shape == (5, 8448)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b", "nemotron-3-super-120b"])
def test_num_spec_passed(name):
    model = get_model(name)
    assert model.passes_num_spec
    assert derive_layout(model, num_speculative_tokens=2).conv_shape[0] == model.conv_kernel - 1 + 2


def test_padding_fraction_matches_table():
    assert derive_layout(get_model("nemotron-h-8b"), mamba_ssm_cache_dtype="bf16").padding_fraction \
        == pytest.approx(0.0019, abs=5e-5)
    assert derive_layout(get_model("nemotron-nano-9b-v2"), mamba_ssm_cache_dtype="bf16").padding_fraction \
        == pytest.approx(0.021, abs=5e-4)


def test_page_and_padding_consistency():
    layout = derive_layout(get_model("nemotron-h-8b"))
    assert layout.page_bytes == layout.block_size * layout.attn_bytes_per_token_per_layer
    assert layout.mamba_page_bytes_padded == layout.page_bytes >= layout.mamba_page_bytes
    assert layout.padding_fraction == pytest.approx(
        (layout.page_bytes - layout.mamba_page_bytes) / layout.mamba_page_bytes)
    assert layout.block_size % layout.kernel_alignment == 0
    # the block is the smallest aligned one that holds a state
    smaller = layout.block_size - layout.kernel_alignment
    assert smaller * layout.attn_bytes_per_token_per_layer < layout.mamba_page_bytes


# dtypes -----------------------------------------------------------------------------------------

def test_nemotron_h_defaults_ssm_to_fp32_others_follow_conv():
    nh = derive_layout(get_model("nemotron-h-8b"))
    assert (nh.kv_dtype, nh.conv_dtype, nh.ssm_dtype) == ("bfloat16", "bfloat16", "float32")
    q = derive_layout(get_model("qwen3-next-80b-a3b"))
    assert (q.conv_dtype, q.ssm_dtype) == ("bfloat16", "bfloat16")
    # vLLM: SSM 'auto' follows mamba_cache_dtype for non-NemotronH models
    q32 = derive_layout(get_model("qwen3-next-80b-a3b"), mamba_cache_dtype="float32")
    assert (q32.conv_dtype, q32.ssm_dtype) == ("float32", "float32")
    # NemotronH keeps its own rule for the SSM state when only the conv dtype is set
    nh16 = derive_layout(get_model("nemotron-h-8b"), mamba_cache_dtype="float16")
    assert (nh16.conv_dtype, nh16.ssm_dtype) == ("float16", "float32")


@pytest.mark.parametrize("a,b", [("bf16", "bfloat16"), ("fp32", "float32"), ("fp16", "float16"),
                                 ("BF16", "bfloat16")])
def test_dtype_aliases(a, b):
    model = get_model("nemotron-h-8b")
    assert derive_layout(model, mamba_ssm_cache_dtype=a) == derive_layout(model, mamba_ssm_cache_dtype=b)


def test_fp8_only_for_kv():
    model = get_model("nemotron-h-8b")
    assert derive_layout(model, kv_cache_dtype="fp8").attn_bytes_per_token_per_layer == 2048
    with pytest.raises(ValueError, match="^mamba_ssm_cache_dtype: fp8"):
        derive_layout(model, mamba_ssm_cache_dtype="fp8")
    with pytest.raises(ValueError, match="^mamba_cache_dtype: unknown dtype 'int4'"):
        derive_layout(model, mamba_cache_dtype="int4")
    with pytest.raises(ValueError, match="^kv_cache_dtype:"):
        derive_layout(model, kv_cache_dtype="float64")


# TP ---------------------------------------------------------------------------------------------

def test_tp_splits_heads_and_replicates_kv():
    model = get_model("nemotron-3-super-120b")
    l1, l4 = derive_layout(model), derive_layout(model, tp=4)
    assert l4.kv_heads_per_rank == 1                      # max(1, 2 // 4)
    assert l4.attn_bytes_per_token_per_layer == 512
    assert l4.ssm_shape == (32, 64, 128)
    assert l4.conv_shape == (3, 10_240 // 4)
    assert l1.conv_bytes_per_layer == 4 * l4.conv_bytes_per_layer


def test_tp_pads_n_groups():
    # Granite: n_groups 1 -> padded to TP (vLLM extra_groups_for_head_shards)
    layout = derive_layout(get_model("granite-4.0-h-small"), tp=2)
    assert layout.conv_shape == (3, (8192 + 2 * 2 * 128) // 2)
    assert any("padded to 2" in s for s in layout.derivation)
    # Nemotron-H n_groups 8 with TP 16: padded to 16
    assert derive_layout(get_model("nemotron-h-8b"), tp=16).conv_shape == (3, (8192 + 2 * 16 * 128) // 16)


def test_tp_must_divide_heads():
    with pytest.raises(ValueError, match="^tp: 3 does not divide"):
        derive_layout(get_model("nemotron-h-8b"), tp=3)
    with pytest.raises(ValueError, match="^tp: must be an integer"):
        derive_layout(get_model("nemotron-h-8b"), tp=0)


# block size overrides / alignment / modes ---------------------------------------------------

def test_block_size_override_used_when_it_holds_a_state():
    layout = derive_layout(get_model("nemotron-h-8b"), block_size=2048)
    assert layout.block_size == 2048 and layout.kernel_alignment == 2048
    assert layout.padding_fraction == pytest.approx(2048 * 4096 / 4_255_744 - 1)


def test_block_size_override_too_small_grows_to_its_multiple():
    # vLLM: a = max(kernel, --block-size); 512 cannot hold 4,255,744 B -> 3 x 512
    layout = derive_layout(get_model("nemotron-h-8b"), block_size=512)
    assert layout.block_size == 1536
    assert any("cannot hold one Mamba state" in s for s in layout.derivation)


def test_block_size_override_must_be_aligned():
    with pytest.raises(ValueError, match="^block_size: 1000 is not a multiple of the kernel alignment 16"):
        derive_layout(get_model("nemotron-h-8b"), block_size=1000)
    with pytest.raises(ValueError, match="^block_size:"):
        derive_layout(get_model("nemotron-h-8b"), block_size=0)


def test_kernel_alignment():
    q = get_model("qwen3-next-80b-a3b")
    assert derive_layout(q, kernel_block_size=64).block_size == 576      # 64 x ceil(1,097,728 / 131,072)
    assert derive_layout(q, kernel_block_size=32, gdn_prefill_backend="triton").block_size == 544
    with pytest.raises(ValueError, match="^kernel_block_size:"):
        derive_layout(q, kernel_block_size=-16)


def test_modes():
    model = get_model("nemotron-h-8b")
    none = derive_layout(model, mamba_cache_mode="none")
    assert none.block_size == 1040 and none.mamba_block_size is None
    with pytest.raises(ValueError, match="^mamba_cache_mode: must be"):
        derive_layout(model, mamba_cache_mode="fine")
    with pytest.raises(ValueError, match="align"):
        derive_layout(get_model("qwen3-next-80b-a3b"), mamba_cache_mode="all")


# MTP / attention layer counts ---------------------------------------------------------------

def test_super_mtp_adds_its_attention_layer():
    model = get_model("nemotron-3-super-120b")
    assert model.mtp_layers == 2 and model.mtp_pattern == "*E" and model.mtp_attention_layers == 1
    assert derive_layout(model).num_attention_layers == 8
    layout = derive_layout(model, num_speculative_tokens=3)
    assert layout.speculative_method == "mtp" and layout.uses_mtp
    assert layout.num_attention_layers == 9 and layout.num_mtp_attention_layers == 1
    assert layout.attn_bytes_per_token == 9 * 1024
    # an EAGLE-3 head instead: its one layer (the target's attention shape) joins the pool
    other = derive_layout(model, num_speculative_tokens=3, speculative_method="eagle3")
    assert other.num_attention_layers == 9 and not other.uses_mtp
    assert other.num_draft_layers == 1 and other.num_mtp_attention_layers == 0
    # a drafter-free method: the model's own attention layers only
    ngram = derive_layout(model, num_speculative_tokens=3, speculative_method="ngram")
    assert ngram.num_attention_layers == 8 and ngram.eagle_groups == ()
    # the block size does not depend on the attention layer count
    assert other.block_size == layout.block_size == ngram.block_size


def test_qwen_mtp_layer():
    layout = derive_layout(get_model("qwen3-next-80b-a3b"), num_speculative_tokens=1)
    assert layout.num_attention_layers == 13


def test_mtp_errors():
    with pytest.raises(ValueError, match="^speculative_method: nemotron-h-8b has no MTP layers"):
        derive_layout(get_model("nemotron-h-8b"), num_speculative_tokens=2, speculative_method="mtp")
    with pytest.raises(ValueError, match="^speculative_method: 'mtp' needs"):
        derive_layout(get_model("nemotron-3-super-120b"), speculative_method="mtp")
    with pytest.raises(ValueError, match="^speculative_method: must be one of"):
        derive_layout(get_model("nemotron-3-super-120b"), num_speculative_tokens=1, speculative_method="x")
    with pytest.raises(ValueError, match="^num_speculative_tokens:"):
        derive_layout(get_model("nemotron-3-super-120b"), num_speculative_tokens=-1)
    # auto: MTP if the model has it, else its EAGLE head, else ngram (no drafter layers)
    assert derive_layout(get_model("nemotron-h-8b"), num_speculative_tokens=2).speculative_method == "eagle"
    assert derive_layout(get_model("qwen3-next-80b-a3b"), num_speculative_tokens=2).speculative_method == "mtp"
    assert derive_layout(get_model("jamba-1.5-mini"), num_speculative_tokens=2).speculative_method == "ngram"
    with pytest.raises(ValueError, match="^speculative_method: draft_model is not modelled"):
        derive_layout(get_model("nemotron-h-8b"), num_speculative_tokens=2, speculative_method="draft_model")


# block pool groups (vLLM _get_kv_cache_groups_uniform_page_size) ----------------------------

@pytest.mark.parametrize("attn,mamba,want", [
    (4, 24, (4, 1, 6, 0)),       # Nemotron-H-8B
    (8, 40, (8, 1, 5, 0)),       # Nemotron-3-Super
    (9, 40, (9, 1, 5, 5)),       # Nemotron-3-Super + MTP attention layer: 5 groups of 8 in 9 slots
    (12, 36, (12, 1, 3, 0)),     # Qwen3-Next
    (10, 13, (13, 1, 1, 3)),     # < 1.5x apart: one group each, sized by the larger
    (5, 45, (5, 1, 9, 0)),       # Nemotron-H-47B
])
def test_pool_groups(attn, mamba, want):
    g = pool_groups(attn, mamba)
    assert (g["group_size"], g["num_attention_groups"], g["num_mamba_groups"], g["padding_layer_slots"]) == want


def test_layout_pool_block_bytes():
    layout = derive_layout(get_model("nemotron-h-8b"))
    assert layout.group_size == 4 and layout.num_mamba_groups == 6 and layout.num_attention_groups == 1
    assert layout.pool_block_bytes == 4 * layout.page_bytes == 4 * 1040 * 4096


def test_derivation_steps_carry_the_numbers():
    steps = derive_layout(get_model("nemotron-h-8b")).derivation
    text = "\n".join(steps)
    for needle in ("4,096 B", "61,440 B", "4,194,304 B", "4,255,744 B", "16 x 65 = 1,040", "float32"):
        assert needle in text
    assert all(isinstance(s, str) and "\n" not in s for s in steps)


def test_layout_is_frozen_and_comparable():
    a = derive_layout(get_model("nemotron-h-8b"))
    b = derive_layout(get_model("nemotron-h-8b"))
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.block_size = 16
