"""KVPool / StatePool storage, TorchModelConfig validation and scaled catalogue copies, timing."""
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

from backends.torch_backend import (  # noqa: E402
    HybridStack, KVPool, MambaState, StatePool, TorchModelConfig, forward_chunk, forward_scratch,
    reference_forward, time_prefill)
from backends.torch_backend.config import model_family  # noqa: E402

CFG = TorchModelConfig(pattern="M*-M*", chunk_size=16)


def test_kvpool_shapes_and_paging():
    pool = KVPool(CFG, num_blocks=10, block_size=4)
    assert len(pool.kv) == 2
    assert pool.kv[0].shape == (10, 2, 4, CFG.kv_heads, CFG.head_dim)
    blocks = [7, 2, 9]
    pos = torch.arange(3, 11)                       # spans blocks 0..2 of the table
    k = torch.randn(8, CFG.kv_heads, CFG.head_dim)
    v = torch.randn(8, CFG.kv_heads, CFG.head_dim)
    pool.write(1, blocks, pos, k, v)
    k2, v2 = pool.read(1, blocks, pos)
    assert torch.equal(k, k2) and torch.equal(v, v2)
    # position 3 -> block 7 offset 3; position 4 -> block 2 offset 0; position 10 -> block 9 off 2
    assert torch.equal(pool.kv[1][7, 0, 3], k[0])
    assert torch.equal(pool.kv[1][2, 0, 0], k[1])
    assert torch.equal(pool.kv[1][9, 1, 2], v[7])
    assert pool.kv[0].abs().sum() == 0              # other layer untouched
    with pytest.raises(ValueError):
        pool.read(0, [7, 2], torch.arange(12))
    with pytest.raises(ValueError):
        pool.read(0, [11], torch.arange(2))
    assert pool.bytes_per_block == 2 * 2 * 4 * CFG.kv_heads * CFG.head_dim * 4


def test_statepool_store_load_copy():
    for dtype in ("float32", "bfloat16"):
        cfg = CFG.with_(dtype=dtype)
        sp = StatePool(cfg, 5)
        assert len(sp.conv) == 2
        assert sp.conv[0].shape == (5, cfg.conv_dim, cfg.conv_kernel - 1)
        assert sp.ssm[0].shape == (5, cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state)
        assert sp.ssm[0].dtype == torch.float32
        assert sp.conv[0].dtype == (torch.float32 if dtype == "float32" else torch.bfloat16)
        st = MambaState([(torch.randn(cfg.conv_dim, cfg.conv_kernel - 1),
                          torch.randn(cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state))
                         for _ in range(2)])
        sp.store(3, st)
        got = sp.load(3)
        assert torch.equal(got.layers[1][1], st.layers[1][1])          # fp32 SSM kept exactly
        got.layers[0][1].zero_()                                       # load returns a copy
        assert sp.ssm[0][3].abs().sum() > 0
        sp.copy(3, 0)
        assert sp.load(0).max_abs_diff(sp.load(3)) == 0
        assert sp.load(1).max_abs_diff(MambaState.zeros(cfg)) == 0
        with pytest.raises(ValueError):
            sp.load(5)


def test_config_validation():
    for bad in (dict(pattern="MX"), dict(pattern=""), dict(dtype="float16"),
                dict(mamba_heads=6, n_groups=4), dict(q_heads=6, kv_heads=4),
                dict(head_dim=15, rope_fraction=1.0), dict(rope_fraction=1.5),
                dict(head_dim=16, rope_fraction=0.05), dict(conv_kernel=1)):
        with pytest.raises(ValueError):
            TorchModelConfig(**bad)
    c = TorchModelConfig(pattern="ME*-")
    assert c.mamba_layers == [0] and c.attention_layers == [2]
    assert c.conv_dim == c.d_inner + 2 * c.n_groups * c.d_state
    assert c.in_proj_dim == 2 * c.d_inner + 2 * c.n_groups * c.d_state + c.mamba_heads


def test_seeded_weights_are_deterministic():
    a, b = HybridStack(CFG), HybridStack(CFG)
    c = HybridStack(CFG.with_(seed=1))
    ids = torch.arange(20) % CFG.vocab
    assert torch.equal(forward_scratch(a, ids), forward_scratch(b, ids))
    assert not torch.equal(forward_scratch(a, ids), forward_scratch(c, ids))


def test_scaled_catalogue_models():
    from sim.models import CATALOGUE
    for name, spec in CATALOGUE.items():
        cfg = TorchModelConfig.scaled(spec)
        assert "M" in cfg.pattern and "*" in cfg.pattern, name
        per_layer = 2 if spec.num_layers == spec.num_mamba_layers + spec.num_attention_layers else 1
        assert len(cfg.pattern) == 4 * per_layer, name
        assert cfg.vocab <= 4096 and cfg.hidden * 8 >= spec.hidden, name
        assert cfg.mamba_heads % cfg.n_groups == 0 and cfg.q_heads % cfg.kv_heads == 0
    c = TorchModelConfig.scaled("nemotron-h-8b")
    assert c.pattern == "M-M*" and c.hidden == 512 and c.mamba_heads == 16 and c.q_heads == 4
    assert c.mamba_head_dim == 64 and c.d_state == 128 and c.head_dim == 128 and not c.ffn_gated
    assert TorchModelConfig.scaled("jamba-1.5-mini").pattern == "M-M-M-*-"
    assert TorchModelConfig.scaled("nemotron-h-8b", num_layers=8).pattern == "M-M-M-M*"
    with pytest.raises(ValueError):
        TorchModelConfig.scaled("nemotron-h-8b", num_layers=1)


def test_attention_positions_follow_the_model_family():
    """NemotronH, Granite-4.0-H and Jamba attention has no position embedding; Qwen3-Next rotates
    a quarter of each head (theta 1e7).  An inline model keeps its base family's layout."""
    from sim.models import CATALOGUE
    want = {"nemotron": ("nemotron_h", 0.0), "granite": ("granite_moe_hybrid", 0.0),
            "jamba": ("jamba", 0.0), "qwen3-next": ("qwen3_next", 0.25)}
    for name, spec in CATALOGUE.items():
        fam, frac = next(v for k, v in want.items() if name.startswith(k))
        assert model_family(spec) == fam, name
        cfg = TorchModelConfig.scaled(spec)
        assert cfg.rope_fraction == frac and fam in cfg.source, name
    q = TorchModelConfig.scaled("qwen3-next-80b-a3b")
    assert q.rotary_dim == q.head_dim // 4 and q.rope_theta == 1e7


@pytest.mark.parametrize("rope_fraction", [0.0, 0.25, 1.0])
def test_no_position_embedding_is_order_free_in_attention(rope_fraction):
    """Without RoPE an attention layer's output for the last query does not depend on where
    the sequence starts; with RoPE on any channel it does (positions enter q.k)."""
    cfg = CFG.with_(pattern="*", rope_fraction=rope_fraction)
    model = HybridStack(cfg)
    att = model.mixers[0]
    h = torch.randn(6, cfg.hidden, generator=torch.Generator().manual_seed(3))
    q0, k0, _ = att.qkv(h, torch.arange(6), torch.float32)
    q1, k1, _ = att.qkv(h, torch.arange(6) + 100, torch.float32)
    same = torch.allclose(q0, q1) and torch.allclose(k0, k1)
    assert same == (rope_fraction == 0.0)
    rep = cfg.q_heads // cfg.kv_heads
    s0 = torch.einsum("ihd,jhd->hij", q0, k0.repeat_interleave(rep, 1))
    s1 = torch.einsum("ihd,jhd->hij", q1, k1.repeat_interleave(rep, 1))
    assert torch.allclose(s0, s1, atol=1e-3)   # RoPE is relative: a common shift keeps q.k


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_scaled_model_resume(name):
    """A scaled catalogue model (chunk 128 / 64) resumes exactly too, p inside a chunk."""
    cfg = TorchModelConfig.scaled(name, num_layers=4, width_div=32)
    model = HybridStack(cfg)
    L, p, bs = 200, 133, 16
    ids = torch.randint(0, cfg.vocab, (L,), generator=torch.Generator().manual_seed(0))
    blocks = list(range(13))[::-1]
    kv = KVPool(cfg, 13, bs)
    _, st = forward_chunk(model, ids[:p], 0, blocks, kv, bs, None)
    last, _ = forward_chunk(model, ids[p:], p, blocks, kv, bs, st)
    assert (last - forward_scratch(model, ids)).abs().max() < 1e-4
    assert (last.double() - reference_forward(model, ids)).abs().max() < 1e-4


def test_time_prefill_cpu():
    model = HybridStack(CFG)
    t = time_prefill(model, new_tokens=40, cached=50, device="cpu", repeats=2)
    assert set(t) == {"mamba", "attention", "mlp", "other", "total"}
    assert all(v > 0 for v in t.values())
    assert t["total"] >= 0.9 * (t["mamba"] + t["attention"] + t["mlp"])
    t0 = time_prefill(model, new_tokens=8, cached=0, repeats=1)
    assert t0["mamba"] > 0
