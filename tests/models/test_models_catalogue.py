"""The model catalogue (docs/models.md §2, §5), lookup and inline definitions."""
import dataclasses

import pytest

from sim.models import CATALOGUE, ModelSpec, UnknownModelError, get_model, model_from_mapping, model_names

NAMES = ["nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b", "nemotron-nano-9b-v2", "nemotron-3-nano-30b",
         "nemotron-3-super-120b", "qwen3-next-80b-a3b", "granite-4.0-h-small", "jamba-1.5-mini"]


def test_catalogue_names():
    assert model_names() == NAMES


@pytest.mark.parametrize("alias,name", [
    ("NEMOTRON-H-8B", "nemotron-h-8b"),
    ("nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
    ("Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
    ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", "nemotron-nano-9b-v2"),
    ("NVIDIA-Nemotron-3-Super-120B-A12B", "nemotron-3-super-120b"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
    ("ibm-granite/granite-4.0-h-small", "granite-4.0-h-small"),
    ("ai21labs/AI21-Jamba-1.5-Mini", "jamba-1.5-mini"),
    (" Jamba-1.5-Mini ", "jamba-1.5-mini"),
])
def test_lookup_aliases(alias, name):
    assert get_model(alias).name == name


def test_unknown_model_one_line_lists_names():
    with pytest.raises(KeyError) as e:
        get_model("llama-3-8b")
    assert isinstance(e.value, UnknownModelError)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("unknown model 'llama-3-8b'")
    assert all(n in msg for n in NAMES)


# models.md §2: (mamba, attention, mlp, moe, total layers, hidden, vocab, q, kv, head_dim)
SHAPES = {
    "nemotron-h-8b": (24, 4, 24, 0, 52, 4096, 131072, 32, 8, 128),
    "nemotron-h-47b": (45, 5, 48, 0, 98, 8192, 131072, 64, 8, 128),
    "nemotron-h-56b": (54, 10, 54, 0, 118, 8192, 131072, 64, 8, 128),
    "nemotron-nano-9b-v2": (27, 4, 25, 0, 56, 4480, 131072, 40, 8, 128),
    "nemotron-3-nano-30b": (23, 6, 0, 23, 52, 2688, 131072, 32, 2, 128),
    "nemotron-3-super-120b": (40, 8, 0, 40, 88, 4096, 131072, 32, 2, 128),
    "granite-4.0-h-small": (36, 4, 0, 40, 40, 4096, 100352, 32, 8, 128),
    "qwen3-next-80b-a3b": (36, 12, 0, 48, 48, 2048, 151936, 16, 2, 256),
    "jamba-1.5-mini": (28, 4, 16, 16, 32, 4096, 65536, 32, 8, 128),
}


@pytest.mark.parametrize("name,shape", SHAPES.items())
def test_shapes_match_models_md(name, shape):
    m = get_model(name)
    got = (m.num_mamba_layers, m.num_attention_layers, m.num_mlp_layers, m.num_moe_layers, m.num_layers,
           m.hidden, m.vocab, m.q_heads, m.kv_heads, m.head_dim)
    assert got == shape
    assert m.layer_kinds == dict(zip(("mamba", "attention", "mlp", "moe"), shape[:4]))
    assert "models.md" in m.source and m.source
    if m.pattern is not None:
        assert len(m.pattern) == m.num_layers and m.pattern.count("M") == m.num_mamba_layers


def test_mixer_kinds_and_rules():
    assert {n: get_model(n).mamba_kind for n in NAMES} == {
        **{n: "mamba2" for n in NAMES}, "qwen3-next-80b-a3b": "gdn", "jamba-1.5-mini": "mamba1"}
    nh = [n for n in NAMES if n.startswith("nemotron")]
    assert all(get_model(n).default_ssm_dtype == "float32" for n in nh)
    assert all(get_model(n).default_ssm_dtype is None for n in NAMES if n not in nh)
    assert all(get_model(n).passes_num_spec for n in NAMES if n != "jamba-1.5-mini")
    assert not get_model("jamba-1.5-mini").passes_num_spec
    assert get_model("nemotron-h-8b").mamba_conv_dim == 10240
    assert get_model("qwen3-next-80b-a3b").mamba_conv_dim == 8192
    assert get_model("granite-4.0-h-small").mamba_conv_dim == 8448


def test_mtp_entries():
    sup = get_model("nemotron-3-super-120b")
    assert (sup.mtp_layers, sup.mtp_pattern, sup.mtp_attention_layers) == (2, "*E", 1)
    assert get_model("qwen3-next-80b-a3b").mtp_attention_layers == 1
    assert all(get_model(n).mtp_layers == 0 for n in NAMES if n not in ("nemotron-3-super-120b",
                                                                          "qwen3-next-80b-a3b"))


# nominal (total, active) sizes in the model names / cards; estimates are from shapes
NOMINAL = {
    "nemotron-h-8b": (8.1e9, 8.1e9), "nemotron-h-47b": (47e9, 47e9), "nemotron-h-56b": (56e9, 56e9),
    "nemotron-nano-9b-v2": (8.9e9, 8.9e9), "nemotron-3-nano-30b": (31.6e9, 3.6e9),
    "nemotron-3-super-120b": (120e9, 12.5e9), "qwen3-next-80b-a3b": (80e9, 3.6e9),
    "granite-4.0-h-small": (32e9, 9e9), "jamba-1.5-mini": (52e9, 12e9),
}


@pytest.mark.parametrize("name,nominal", NOMINAL.items())
def test_param_estimates(name, nominal):
    m = get_model(name)
    assert m.params_estimated
    assert m.total_params == pytest.approx(nominal[0], rel=0.05)
    assert m.active_params == pytest.approx(nominal[1], rel=0.12)
    assert m.weight_bytes == 2 * m.total_params
    assert m.flops_per_token() <= 2 * m.active_params
    assert m.flops_per_token(8192) > m.flops_per_token(0)


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        get_model("nemotron-h-8b").hidden = 1
    assert CATALOGUE["nemotron-h-8b"] is get_model("nemotron-h-8b")


# inline definitions ----------------------------------------------------------------------------

TINY = dict(name="tiny-hybrid", hidden=256, pattern="M-M*-M-", mamba_heads=8, mamba_head_dim=32,
            d_state=16, n_groups=2, q_heads=4, kv_heads=2, head_dim=64, vocab=1000, ffn_dim=512,
            ffn_gated=False, dtype="bf16")


def test_mapping_with_pattern_fills_counts():
    m = model_from_mapping(TINY)
    assert isinstance(m, ModelSpec)
    assert (m.num_layers, m.num_mamba_layers, m.num_attention_layers, m.num_mlp_layers) == (7, 3, 1, 3)
    assert m.dtype == "bfloat16" and m.source == "inline definition" and m.params_estimated
    from sim.models import derive_layout
    layout = derive_layout(m)
    assert layout.conv_shape == (3, 8 * 32 + 2 * 2 * 16)


def test_mapping_from_base():
    m = model_from_mapping({"base": "nemotron-h-8b", "name": "8b-small-state", "d_state": 64})
    assert m.d_state == 64 and m.hidden == 4096 and "nemotron-h-8b" in m.source
    assert m.total_params < get_model("nemotron-h-8b").total_params
    with pytest.raises(ValueError, match="^name: required"):
        model_from_mapping({"base": "nemotron-h-8b", "d_state": 64})
    with pytest.raises(ValueError, match="^base: unknown model 'nope'"):
        model_from_mapping({"base": "nope", "name": "x"})


def test_mapping_given_params():
    m = model_from_mapping({**TINY, "total_params": 123_456_789})
    assert m.total_params == 123_456_789 and not m.params_estimated


@pytest.mark.parametrize("change,field", [
    ({"colour": "red"}, "colour"),
    ({"hidden": "big"}, "hidden"),
    ({"hidden": -1}, "hidden"),
    ({"ffn_gated": "yes"}, "ffn_gated"),
    ({"mamba_kind": "rwkv"}, "mamba_kind"),
    ({"kv_heads": 3}, "kv_heads"),
    ({"pattern": "M-X*"}, "pattern"),
    ({"pattern": "M-M*-M-", "num_mamba_layers": 4}, "pattern"),
    ({"dtype": "int8"}, "dtype"),
    ({"n_groups": 3}, "n_groups"),
    ({"mtp_layers": 1}, "mtp_pattern"),
    ({"num_moe_layers": 1, "pattern": None, "num_layers": 8, "num_mamba_layers": 3,
      "num_attention_layers": 1, "num_mlp_layers": 3}, "num_experts"),
    ({"params_estimated": False}, "params_estimated"),
])
def test_mapping_errors_name_the_field(change, field):
    with pytest.raises(ValueError) as e:
        model_from_mapping({**TINY, **change})
    assert str(e.value).startswith(f"{field}:") and "\n" not in str(e.value)


def test_mapping_missing_field():
    d = dict(TINY)
    del d["vocab"]
    with pytest.raises(ValueError, match="^vocab: required"):
        model_from_mapping(d)
    with pytest.raises(ValueError, match="^model: expected a mapping"):
        model_from_mapping(["not", "a", "mapping"])


def test_layer_count_mismatch():
    with pytest.raises(ValueError, match="^num_layers: 9 matches neither"):
        model_from_mapping({**TINY, "num_layers": 9, "pattern": None, "num_mamba_layers": 3,
                            "num_attention_layers": 1, "num_mlp_layers": 3})


def test_ffn_in_every_layer_style():
    m = model_from_mapping({**TINY, "pattern": "MM*M", "num_moe_layers": 4, "num_experts": 8, "top_k": 2,
                            "expert_ffn": 128})
    assert m.ffn_in_every_layer and m.num_layers == 4 and m.num_mlp_layers == 0
    assert m.active_params < m.total_params
