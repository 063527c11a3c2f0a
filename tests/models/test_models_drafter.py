"""The drafter's layers in the pool, page unification, and what vLLM refuses (issue #20 §2).

Numbers for whole settings come from vLLM in test_layout_vs_vllm.py; these tests pin the rules
one at a time."""
import pytest

from sim.models import derive_layout, describe, get_model, model_from_mapping
from sim.models.pool import Bucket, group_size_for, plan_pool, unify_pages

NH8 = get_model("nemotron-h-8b")


def test_eagle_head_shares_the_target_groups_when_shaped_alike():
    lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method="eagle")
    assert (lay.num_attention_layers, lay.num_draft_layers, lay.num_draft_groups) == (5, 1, 0)
    assert (lay.group_size, lay.num_attention_groups, lay.num_mamba_groups) == (5, 1, 5)
    assert lay.padding_layer_slots == 1 and lay.pool_block_bytes == 5 * lay.page_bytes
    # vLLM's group order: the Mamba groups first (the model's first layer is Mamba)
    assert lay.groups == ("mamba",) * 5 + ("full",)
    assert lay.eagle_groups == (5,) and lay.uniform_block_size
    assert lay.attn_bytes_per_token == 5 * 4096


def test_eagle_head_with_fewer_kv_heads_gets_own_groups_and_a_bigger_block():
    # 4 KV heads: half the target's page at the same block -> vLLM doubles the drafter's block
    lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method="eagle",
                        draft_num_kv_heads=4)
    assert lay.draft_attn_bytes_per_token_per_layer == 2048
    assert (lay.num_draft_groups, lay.group_size) == (1, 1)
    assert (lay.num_attention_groups, lay.num_mamba_groups) == (5, 24)
    assert lay.draft_block_size == 2 * lay.block_size and lay.attention_block_size == lay.block_size
    assert not lay.uniform_block_size
    assert lay.eagle_groups == (28,)    # only the drafter's own group, after 24 Mamba + 4 target
    assert lay.attn_bytes_per_token == 4 * 4096 + 2048


def test_eagle_head_with_more_kv_heads_grows_the_target_block_and_pads_mamba():
    lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method="eagle",
                        draft_num_kv_heads=16)
    assert lay.page_bytes == 2 * lay.block_size * 4096
    assert lay.attention_block_size == 2 * lay.block_size and lay.draft_block_size == lay.block_size
    assert lay.padding_fraction > 1                     # Mamba padded to the drafter's page


def test_non_dividing_drafter_page_is_padded_not_scaled():
    lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method="eagle",
                        draft_num_kv_heads=2, draft_head_dim=96)   # 768 B/token vs 4,096
    assert lay.uniform_block_size and lay.num_draft_groups == 1
    assert lay.page_bytes == lay.block_size * 4096


def test_per_rank_shape_decides_sharing():
    # 8 vs 4 KV heads differ at TP 1 but are both one head per rank at TP 8
    assert derive_layout(NH8, tp=8, num_speculative_tokens=1, speculative_method="eagle",
                         draft_num_kv_heads=4).num_draft_groups == 0


def test_refusals_name_the_setting():
    with pytest.raises(ValueError, match="^kv_cache_dtype: vLLM 0.33.0 has no float32"):
        derive_layout(NH8, kv_cache_dtype="float32")
    with pytest.raises(ValueError, match="^kv_cache_dtype: float16 is incompatible with the model dtype"):
        derive_layout(NH8, kv_cache_dtype="fp16")
    assert derive_layout(NH8, kv_cache_dtype="bfloat16").kv_dtype == "bfloat16"
    fp16 = model_from_mapping({"base": "nemotron-h-8b", "name": "nh-fp16", "dtype": "float16"})
    assert derive_layout(fp16, kv_cache_dtype="float16").kv_dtype == "float16"
    for name in ("granite-4.0-h-small", "jamba-1.5-mini"):
        for method in ("eagle", "eagle3"):
            with pytest.raises(ValueError, match="^speculative_method: .* does not declare SupportsEagle"):
                derive_layout(get_model(name), num_speculative_tokens=2, speculative_method=method)
    qwen = get_model("qwen3-next-80b-a3b")
    with pytest.raises(ValueError, match="SupportsEagle in vLLM"):
        derive_layout(qwen, num_speculative_tokens=2, speculative_method="eagle")
    assert derive_layout(qwen, num_speculative_tokens=2, speculative_method="eagle3").num_draft_layers == 1
    with pytest.raises(ValueError, match="^draft_num_kv_heads: 6 KV heads cannot be split over TP 4"):
        derive_layout(NH8, tp=4, num_speculative_tokens=1, speculative_method="eagle", draft_num_kv_heads=6)
    with pytest.raises(ValueError, match="^draft_head_dim: only an EAGLE drafter"):
        derive_layout(get_model("nemotron-3-super-120b"), num_speculative_tokens=1,
                      speculative_method="mtp", draft_head_dim=64)


def test_every_method_reserves_speculative_mamba_blocks():
    for method in ("eagle", "ngram", "suffix"):
        lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method=method)
        assert lay.mamba_blocks_per_request == 2 + 3 + 1
        assert lay.conv_shape[0] == 3 + 3
    assert derive_layout(NH8, num_speculative_tokens=3, speculative_method="ngram").num_draft_layers == 0
    jamba = derive_layout(get_model("jamba-1.5-mini"), num_speculative_tokens=2)
    assert jamba.mamba_blocks_per_request == 2 + 2          # MambaMixer: no checkpoint block


def test_unify_pages_and_groups():
    # Mamba pads; a dividing attention page scales its block; another one pads
    assert unify_pages({"a": (100, 16, False), "m": (100, 16, True), "d": (300, 16, False)}) == \
        {"a": (300, 48), "m": (300, 16), "d": (300, 16)}
    assert unify_pages({"a": (200, 16, False), "d": (150, 16, False)}) == \
        {"a": (200, 16), "d": (200, 16)}
    # vLLM's comment: gpt-oss-20b + EAGLE, 12 sliding + 13 full -> groups of 13
    assert group_size_for([12, 13]) == 13 and group_size_for([4, 24]) == 4
    plan = plan_pool([Bucket("attention", 9, 16, 8, draft_layers=1), Bucket("mamba", 40, 16, 8)])
    # 9 attention layers in groups of 9 -> one group holding the drafter layer
    assert plan.group_size == 9 and [g[2] for g in plan.groups] == [True] + [False] * 5
    plan = plan_pool([Bucket("attention", 10, 16, 8, draft_layers=2), Bucket("mamba", 5, 16, 8)])
    # 10 layers in 2 groups (layers[i::2]): drafter layers 8 and 9 land in groups 0 and 1
    assert plan.group_size == 5 and [g[2] for g in plan.groups] == [True, True, False]
    plan = plan_pool([Bucket("attention", 9, 16, 8, draft_layers=1), Bucket("mamba", 3, 16, 8)])
    # 9 layers in 3 groups: drafter layer 8 lands in group 8 % 3 = 2
    assert [g[2] for g in plan.groups] == [False, False, True, False]


def test_describe_shows_the_drafter():
    lay = derive_layout(NH8, num_speculative_tokens=3, speculative_method="eagle",
                        draft_num_kv_heads=4)
    text = describe(lay, NH8)
    for needle in ("drafter (eagle): 1 layer(s), 4 KV heads/rank x 128", "drafter 2112 tokens",
                   "EAGLE groups (holding the drafter's layers): 28",
                   "a request holds up to 6 blocks per Mamba group (2 + 3 speculative + 1 checkpoint"):
        assert needle in text


# scenarios: the speculative section's drafter and the refusals, one line naming the field ------

def _load(tmp_path, edit):
    from pathlib import Path

    import yaml

    from sim.errors import InputError
    from sim.config.scenario import load_scenario

    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "scenarios" / "mooncake-conversation.yaml").read_text())
    edit(data)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        return load_scenario(path)
    except InputError as e:
        assert "\n" not in str(e)
        return e


@pytest.mark.parametrize("edit,field,words", [
    (lambda d: d["kv_cache"].update(kv_cache_dtype="float32"), "kv_cache.kv_cache_dtype", "float32"),
    (lambda d: d["kv_cache"].update(kv_cache_dtype="float16"), "kv_cache.kv_cache_dtype", "incompatible"),
    (lambda d: d["speculative"].update(method="ngram"), "speculative.method", "lookahead"),
    (lambda d: (d["speculative"].update(draft_num_kv_heads=3),
                d["kv_cache"].update(tensor_parallel_size=2), d["gpu"].update(count=2)),
     "speculative.draft_num_kv_heads", "cannot be split"),
    (lambda d: d["speculative"].update(draft_num_kv_heads=4), "speculative.draft_num_kv_heads",
     "not simulated yet"),
    (lambda d: d.update(model="granite-4.0-h-small"), "speculative.method", "SupportsEagle"),
    # a padded drafter page in groups of one: 6 attention + 45 Mamba groups, more than the
    # cache model's pool keys hold
    (lambda d: (d.update(model="nemotron-h-47b"), d["kv_cache"].update(tensor_parallel_size=4),
                d["gpu"].update(count=4),
                d["speculative"].update(draft_num_kv_heads=2, draft_head_dim=96)),
     "speculative.draft_num_kv_heads", "51 KV-cache groups"),
    (lambda d: d["speculative"].update(method="mtp", draft_head_dim=64), "speculative.draft_head_dim",
     "only with method eagle"),
])
def test_scenario_refusals_name_the_field(tmp_path, edit, field, words):
    err = _load(tmp_path, edit)
    assert not hasattr(err, "model"), "expected a one-line InputError"
    assert field in str(err) and words in str(err)


def test_scenario_drafter_reaches_the_layout(tmp_path):
    sc = _load(tmp_path, lambda d: d["speculative"].update(draft_num_layers=2))
    lay = sc.kv_cache.derive(sc.model, sc.speculative, sc.gpu.type)
    assert (lay.num_draft_layers, lay.num_attention_layers) == (2, 6)
    # a padded (not scaled) drafter page keeps one block size: simulated
    sc = _load(tmp_path, lambda d: d["speculative"].update(draft_num_kv_heads=2, draft_head_dim=96))
    lay = sc.kv_cache.derive(sc.model, sc.speculative, sc.gpu.type)
    assert lay.num_draft_groups == 1 and lay.uniform_block_size
