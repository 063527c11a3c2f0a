"""GPU presets and the KV-cache block pool size (sim.config.gpus)."""
import math

import pytest

from sim.config.gpus import B200, H100, H200, DEFAULT_ACTIVATION_RESERVE_BYTES, get_gpu, gpu_names, kv_budget, \
    num_kv_blocks
from sim.models import derive_layout, get_model

GiB = 2**30


def test_presets():
    assert gpu_names() == ["H100", "H200", "B200"]
    # models.md §8: H200 141 GB HBM3e at 4.8 TB/s, ~990 TFLOP/s bf16 dense, nvidia-smi 143,771 MiB
    assert H200.memory_bytes == 143_771 * 2**20
    assert H200.hbm_bytes_per_s == 4.8e12
    assert H200.bf16_flops == pytest.approx(990e12, rel=0.001)
    assert H200.ridge_flops_per_byte == pytest.approx(206, rel=0.01)
    assert H100.hbm_bytes_per_s == 3.35e12 and H100.bf16_flops == pytest.approx(989e12, rel=0.001)
    assert 78 * GiB < H100.memory_bytes < 81 * GiB
    assert 170 * GiB < B200.memory_bytes < 193e9 and B200.bf16_flops == 2.25e15 and B200.hbm_bytes_per_s == 8e12
    for g in (H100, H200, B200):
        assert g.fp8_flops == pytest.approx(2 * g.bf16_flops, rel=0.01)
        assert g.source


@pytest.mark.parametrize("name,gpu", [("h200", H200), ("H100", H100), ("H100-SXM", H100), ("b200", B200)])
def test_get_gpu(name, gpu):
    assert get_gpu(name) is gpu
    assert get_gpu(gpu) is gpu


def test_unknown_gpu():
    with pytest.raises(KeyError) as e:
        get_gpu("A100")
    assert "\n" not in str(e.value) and "H100, H200, B200" in str(e.value)


def test_num_kv_blocks_formula():
    model = get_model("nemotron-h-8b")
    layout = derive_layout(model)
    n = num_kv_blocks(H200, model, layout)
    avail = int(H200.memory_bytes * 0.9) - model.weight_bytes - DEFAULT_ACTIVATION_RESERVE_BYTES
    block = layout.group_size * layout.page_bytes          # 4 layer slots x 1,040 tokens x 4,096 B
    assert block == 4 * 1040 * 4096
    assert n == avail // block
    b = kv_budget(H200, model, layout)
    assert b.num_blocks == n and b.block_bytes == block and b.available_bytes == avail
    assert b.layer_slots_per_block == 4


def test_more_memory_more_blocks():
    model = get_model("nemotron-h-8b")
    layout = derive_layout(model)
    lo = num_kv_blocks(H100, model, layout, gpu_memory_utilization=0.8)
    hi = num_kv_blocks(H100, model, layout, gpu_memory_utilization=0.95)
    assert hi > lo
    assert num_kv_blocks(H200, model, layout) > num_kv_blocks(H100, model, layout)
    assert num_kv_blocks(H100, model, layout, activation_reserve_bytes=0) > num_kv_blocks(H100, model, layout)


def test_tp_splits_weights_and_pages():
    model = get_model("nemotron-3-super-120b")
    with pytest.raises(ValueError, match="^nemotron-3-super-120b does not fit on H200: weights"):
        num_kv_blocks(H200, model, derive_layout(model))
    layout = derive_layout(model, tp=4)
    b = kv_budget(H200, model, layout, tp=4)
    assert b.weight_bytes == math.ceil(model.weight_bytes / 4)
    assert b.block_bytes == layout.group_size * layout.page_bytes
    with pytest.raises(ValueError, match="^tp: 2 differs from the layout's TP 4"):
        num_kv_blocks(H200, model, layout, tp=2)


def test_mtp_weights_and_layers_count():
    model = get_model("nemotron-3-super-120b")
    plain = kv_budget(H200, model, derive_layout(model, tp=4, num_speculative_tokens=3,
                                                  speculative_method="external"), tp=4)
    mtp = kv_budget(H200, model, derive_layout(model, tp=4, num_speculative_tokens=3), tp=4)
    assert mtp.weight_bytes - plain.weight_bytes == pytest.approx(model.mtp_weight_bytes / 4, abs=1)
    assert mtp.layer_slots_per_block == 9 and plain.layer_slots_per_block == 8


def test_pipeline_gpus():
    model = get_model("nemotron-h-8b")
    layout = derive_layout(model)
    b = kv_budget(H100, model, layout, num_gpus=2)
    assert b.layer_slots_per_block == 2 and b.weight_bytes == model.weight_bytes // 2
    with pytest.raises(ValueError, match="^num_gpus: must be a multiple of tp 2"):
        num_kv_blocks(H100, model, derive_layout(model, tp=2), tp=2, num_gpus=3)


@pytest.mark.parametrize("kw,field", [
    (dict(gpu_memory_utilization=0), "gpu_memory_utilization"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(activation_reserve_bytes=-1), "activation_reserve_bytes"),
    (dict(tp=0), "tp"),
])
def test_bad_arguments(kw, field):
    model = get_model("nemotron-h-8b")
    with pytest.raises(ValueError, match=f"^{field}:"):
        num_kv_blocks(H100, model, derive_layout(model), **kw)


def test_layout_of_another_model():
    with pytest.raises(ValueError, match="^layout: derived for 'nemotron-h-8b'"):
        num_kv_blocks(H100, get_model("jamba-1.5-mini"), derive_layout(get_model("nemotron-h-8b")))


def test_reserve_too_large():
    model = get_model("nemotron-h-8b")
    with pytest.raises(ValueError) as e:
        num_kv_blocks(H100, model, derive_layout(model), activation_reserve_bytes=80 * GiB)
    assert "\n" not in str(e.value) and "does not fit" in str(e.value)
