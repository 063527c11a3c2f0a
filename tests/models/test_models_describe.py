"""describe(): the text `sim model NAME` prints."""
import pytest

from sim.models import derive_layout, describe, get_model, model_names


def test_describe_super_4416():
    model = get_model("nemotron-3-super-120b")
    text = describe(derive_layout(model, num_speculative_tokens=5, mamba_cache_dtype="float32"), model)
    for needle in ("NVIDIA-Nemotron-3-Super-120B-A12B", "source: models.md", "40 mamba2, 8 attention",
                   "5 speculative tokens (mtp)", "conv 8 x 10,240 = 327,680 B", "4,194,304 B",
                   "1,024 B per attention layer", "9,216 B over all 9", "16 x 276 = 4,416",
                   "padding 0.00%", "block size, step by step", "one pool block", "estimated from shapes"):
        assert needle in text, needle


def test_describe_8b_default():
    model = get_model("nemotron-h-8b")
    layout = derive_layout(model)
    text = describe(layout, model)
    assert "block_size 1040 tokens" in text and "mamba_block_size 1040" in text
    assert "state per sequence (24 Mamba layers)" in text and "97.4 MiB" in text
    assert "KV per token: 4,096 B per attention layer, 16,384 B over all 4" in text
    assert all(step in text for step in layout.derivation)
    assert "1 attention + 6 Mamba groups" in text


@pytest.mark.parametrize("name", model_names())
def test_describe_every_model(name):
    model = get_model(name)
    text = describe(derive_layout(model, num_speculative_tokens=1), model)
    assert text.count("\n") > 20 and model.name in text


def test_describe_rejects_mismatch():
    with pytest.raises(ValueError, match="^layout: derived for"):
        describe(derive_layout(get_model("nemotron-h-8b")), get_model("jamba-1.5-mini"))
