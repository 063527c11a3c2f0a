"""Resuming a prefill from cached state (paged K/V + block Mamba state) == prefilling from scratch.

Tolerances (models.md §6): fp32 atol 1e-4; bf16 atol = rtol = 3e-2 vs scratch (SSM state kept
in fp32), 6e-2 vs the float64 reference (bf16 rounding of the whole forward, not of the resume).
A planted wrong Mamba state (from position p-1 or p+1, or zeros) must miss by > 100x the fp32
tolerance -- what the simulator's ``sim verify`` relies on.
"""
import random

import pytest

torch = pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

from backends.torch_backend import (  # noqa: E402
    HybridStack, KVPool, MambaState, StatePool, TorchModelConfig, forward_chunk, forward_scratch,
    reference_forward)

CFG = TorchModelConfig(pattern="M*M-M*-", hidden=64, vocab=256, mamba_heads=4, mamba_head_dim=16,
                       d_state=16, n_groups=2, conv_kernel=4, chunk_size=32, q_heads=4, kv_heads=2,
                       head_dim=16, ffn_dim=128, seed=0)
BS = 16            # KV block size (not a multiple/divisor of anything special vs chunk 32)
POOL_BLOCKS = 64
FP32_TOL = 1e-4
BF16_TOL = 3e-2


@pytest.fixture(scope="module")
def model32():
    return HybridStack(CFG)


@pytest.fixture(scope="module")
def model16():
    return HybridStack(CFG.with_(dtype="bfloat16"))


def _ids(L, seed, vocab=CFG.vocab):
    return torch.randint(0, vocab, (L,), generator=torch.Generator().manual_seed(seed))


def _err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def resume(model, ids, cuts, rng, state_slots=(5, 2, 7, 0, 3, 1)):
    """Prefill ``ids`` in pieces split at ``cuts``; K/V in random non-contiguous blocks; the Mamba
    state handed over through a StatePool (store at one slot, copy to another, load)."""
    L = len(ids)
    nb = -(-L // BS)
    blocks = rng.sample(range(POOL_BLOCKS), nb)
    kv = KVPool(model.cfg, POOL_BLOCKS, BS, model.device)
    sp = StatePool(model.cfg, 8, model.device)
    bounds = [0, *cuts, L]
    state = None
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        last, out = forward_chunk(model, ids[a:b], a, blocks, kv, BS, state)
        slot = state_slots[i % len(state_slots)]
        sp.store(slot, out)
        sp.copy(slot, 4 if slot != 4 else 6)
        state = sp.load(4 if slot != 4 else 6)
    return last, state, (kv, blocks)


def _cases(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        L = rng.randint(50, 300)
        out.append((L, rng.randint(1, L - 1)))
    return out


# p not a multiple of the SSD chunk (32) nor of the KV block (16), aligned ones, p = 1, p = L-1
FP32_CASES = _cases(6, seed=11) + [(200, 64), (150, 48), (257, 100), (90, 1), (300, 299)]


@pytest.mark.parametrize("L,p", FP32_CASES)
def test_resume_equals_scratch_fp32(model32, L, p):
    ids = _ids(L, seed=L * 1000 + p)
    last, state, _ = resume(model32, ids, [p], random.Random(p))
    scratch = forward_scratch(model32, ids)
    ref, ref_state = reference_forward(model32, ids, return_state=True)
    assert _err(last, scratch) < FP32_TOL
    assert _err(last, ref) < FP32_TOL
    assert _err(scratch, ref) < FP32_TOL
    assert state.max_abs_diff(ref_state) < FP32_TOL * 10   # states are O(10): relative 1e-5


def test_resume_at_chunk_and_block_aligned_point_is_bit_identical(model32):
    """p a multiple of both the SSD chunk and the KV block: the suffix's SSD chunks are the same
    chunks as in one pass, so the Mamba state handed over is bit-identical."""
    ids = _ids(256, seed=5)
    _, st_p = forward_chunk(model32, ids[:128], 0, list(range(16)), KVPool(CFG, 16, BS), BS, None)
    full_hidden, _ = model32.run(ids, 0, list(range(16)), KVPool(CFG, 16, BS), None)
    kv = KVPool(CFG, 16, BS)
    forward_chunk(model32, ids[:128], 0, list(range(16)), kv, BS, None)
    last, _ = forward_chunk(model32, ids[128:], 128, list(range(16)), kv, BS, st_p)
    assert _err(last, full_hidden[-1]) < 1e-5


@pytest.mark.parametrize("L,p", _cases(3, seed=21) + [(160, 64)])
def test_resume_equals_scratch_bf16(model16, L, p):
    ids = _ids(L, seed=L * 1000 + p)
    last, state, _ = resume(model16, ids, [p], random.Random(p))
    assert last.dtype == torch.bfloat16
    assert all(s.dtype == torch.float32 for _, s in state.layers)   # fp32 SSM state
    scratch = forward_scratch(model16, ids)
    ref = reference_forward(model16, ids)
    torch.testing.assert_close(last.double(), scratch.double(), atol=BF16_TOL, rtol=BF16_TOL)
    # vs float64: bf16 rounding through 7 blocks (8 mantissa bits) -- measured up to ~1.05x the
    # 3e-2 allclose bound over 12 random prompts, so this one gets 2x (resume itself is <= 8e-3)
    torch.testing.assert_close(last.double(), ref, atol=2 * BF16_TOL, rtol=2 * BF16_TOL)


@pytest.mark.parametrize("seed", range(4))
def test_several_chunks_equal_one_pass(model32, seed):
    rng = random.Random(100 + seed)
    L = rng.randint(120, 300)
    n_chunks = rng.randint(3, 5)
    cuts = sorted(rng.sample(range(1, L), n_chunks - 1))
    ids = _ids(L, seed=seed)
    last, state, _ = resume(model32, ids, cuts, rng)
    scratch_hidden, scratch_state = model32.run(ids, 0, None, None, None)
    assert _err(last, scratch_hidden[-1]) < FP32_TOL
    assert state.max_abs_diff(scratch_state) < FP32_TOL
    assert _err(last, reference_forward(model32, ids)) < FP32_TOL


# (L, p): short and long suffixes, p aligned and not
PLANTED = [(120, 70), (300, 173), (64, 33), (250, 96)]


@pytest.mark.parametrize("L,p", PLANTED)
def test_planted_wrong_state_is_caught(model32, L, p):
    ids = _ids(L, seed=7 * L + p)
    scratch = forward_scratch(model32, ids)
    rng = random.Random(p)
    blocks = rng.sample(range(POOL_BLOCKS), -(-L // BS))
    kv = KVPool(CFG, POOL_BLOCKS, BS)
    _, good = forward_chunk(model32, ids[:p], 0, blocks, kv, BS, None)

    def state_at(q):
        return forward_chunk(model32, ids[:q], 0, list(range(-(-q // BS))),
                             KVPool(CFG, -(-q // BS), BS), BS, None)[1]

    ok, _ = forward_chunk(model32, ids[p:], p, blocks, kv, BS, good)
    assert _err(ok, scratch) < FP32_TOL
    for wrong in (state_at(p - 1), state_at(p + 1), MambaState.zeros(CFG)):
        bad, _ = forward_chunk(model32, ids[p:], p, blocks, kv, BS, wrong)
        assert _err(bad, scratch) > 100 * FP32_TOL


def test_kv_paging_shuffled_equals_contiguous(model32):
    L, p = 230, 77
    ids = _ids(L, seed=9)
    nb = -(-L // BS)
    outs = []
    for blocks in (list(range(nb)), random.Random(3).sample(range(POOL_BLOCKS), nb),
                   list(range(POOL_BLOCKS - 1, POOL_BLOCKS - 1 - nb, -1))):
        kv = KVPool(CFG, POOL_BLOCKS, BS)
        _, st = forward_chunk(model32, ids[:p], 0, blocks, kv, BS, None)
        last, st2 = forward_chunk(model32, ids[p:], p, blocks, kv, BS, st)
        # the pool holds every token's K/V where the block table says
        for layer in range(CFG.num_attention_layers):
            k, _ = kv.read(layer, blocks, torch.arange(L))
            assert k.abs().sum(-1).min() > 0
        outs.append((last, st2))
    for last, st in outs[1:]:
        assert torch.equal(last, outs[0][0])
        assert st.max_abs_diff(outs[0][1]) == 0.0


def test_wrong_kv_blocks_are_caught(model32):
    """Reading the prefix K/V through a wrong block table (one block of another sequence) breaks
    equality.  (Merely permuting the blocks would not: K is cached after RoPE, and attention
    over a set of keys does not depend on their order.)"""
    L, p = 150, 70
    ids = _ids(L, seed=4)
    nb = -(-L // BS)
    blocks = list(range(nb))
    other = list(range(nb, 2 * nb))
    kv = KVPool(CFG, POOL_BLOCKS, BS)
    forward_chunk(model32, _ids(L, seed=5), 0, other, kv, BS, None)      # another sequence
    _, st = forward_chunk(model32, ids[:p], 0, blocks, kv, BS, None)
    wrong = blocks.copy()
    wrong[1] = other[1]
    bad, _ = forward_chunk(model32, ids[p:], p, wrong, kv, BS, st)
    assert _err(bad, forward_scratch(model32, ids)) > 100 * FP32_TOL


def test_argument_checks(model32):
    ids = _ids(40, seed=0)
    kv = KVPool(CFG, 4, BS)
    with pytest.raises(ValueError, match="start == 0"):
        forward_chunk(model32, ids, 16, list(range(4)), kv, BS, None)
    with pytest.raises(ValueError, match="block_size"):
        forward_chunk(model32, ids, 0, list(range(4)), kv, 8, None)
    with pytest.raises(ValueError, match="blocks"):
        forward_chunk(model32, ids, 0, [0, 1], kv, BS, None)
    with pytest.raises(ValueError, match="zero tokens"):
        forward_chunk(model32, ids[:0], 0, [0], kv, BS, None)


# ------------------------------------------------------------------ speculative decode steps --
def _spec_decode(model, true_ids, prompt, accepted, K, keep_last_draft=False):
    """Prefill ``prompt`` tokens, then decode steps of 1 + K scheduled tokens each: the last
    sampled token, ``acc`` accepted drafts (the sequence's own next tokens) and K - acc rejected
    ones (other tokens).  K/V goes to paged blocks for every scheduled position; the Mamba state
    kept is the one after the last accepted token (or, to show the test has teeth, after the
    last draft).  Returns the last kept hidden state, the Mamba state and the end position."""
    cfg = model.cfg
    nb = -(-(len(true_ids) + K + 1) // BS)
    blocks = random.Random(7).sample(range(POOL_BLOCKS), nb)
    kv = KVPool(cfg, POOL_BLOCKS, BS, model.device)
    pos = prompt - 1         # the prompt's last token is the first decode step's own token
    _, state = forward_chunk(model, true_ids[:pos], 0, blocks, kv, BS, None)
    last = None
    for acc in accepted:
        ids = true_ids[pos:pos + 1 + K].clone()
        ids[1 + acc:] = (ids[1 + acc:] + 1) % cfg.vocab          # rejected drafts: wrong tokens
        hs, states = model.run(ids, pos, blocks, kv, state, steps=True)
        assert len(states) == 1 + K
        state = states[-1 if keep_last_draft else acc]
        last = hs[acc]
        pos += 1 + acc
    return last, state, pos


@pytest.mark.parametrize("K,accepted", [(1, [0, 1, 0, 0, 1, 1, 0]), (3, [0, 3, 1, 2, 0, 0, 3, 1])])
def test_spec_decode_rejected_drafts_leave_no_trace(model32, K, accepted):
    """After speculative steps with rejected drafts (their K/V written, their Mamba states
    computed), the kept hidden state and Mamba state equal a from-scratch pass over the
    sequence's own tokens; keeping the last draft's state instead is caught."""
    ids = _ids(120, seed=5)
    last, state, end = _spec_decode(model32, ids, 70, accepted, K)
    ref_last, ref_state = reference_forward(model32, ids[:end], return_state=True)
    assert _err(last, forward_scratch(model32, ids[:end], BS)) < FP32_TOL
    assert _err(last, ref_last) < FP32_TOL
    assert state.max_abs_diff(ref_state) < FP32_TOL
    bad_last, bad_state, _ = _spec_decode(model32, ids, 70, accepted, K, keep_last_draft=True)
    assert state.max_abs_diff(bad_state) > 100 * FP32_TOL
    assert _err(bad_last, ref_last) > 100 * FP32_TOL


def test_step_states_equal_chunked_run(model32):
    """The token-by-token path (decode / verify) gives the chunked path's outputs, and its
    state after token j is the chunked state of the first j + 1 tokens."""
    ids = _ids(40, seed=9)
    kv = KVPool(CFG, 8, BS)
    _, st = forward_chunk(model32, ids[:30], 0, list(range(8)), kv, BS, None)
    hs_c, st_c = model32.run(ids[30:], 30, list(range(8)), kv, st)
    hs_s, sts = model32.run(ids[30:], 30, list(range(8)), kv, st, steps=True)
    assert _err(hs_c, hs_s) < FP32_TOL and sts[-1].max_abs_diff(st_c) < FP32_TOL
    _, st_4 = model32.run(ids[30:34], 30, list(range(8)), kv, st)
    assert sts[3].max_abs_diff(st_4) < FP32_TOL


@pytest.mark.parametrize("r", [1, 7, 16, 33])
def test_a_checkpoint_state_from_one_pass_equals_the_state_of_a_shorter_pass(model32, r):
    """run(state_at=r) (an internal prefill checkpoint) hands out the Mamba state after r
    tokens from the chunk's one pass: the state a pass over those r tokens ends in, with the
    pass's own hidden states and end state as without it."""
    ids = _ids(60, seed=11)
    kv = KVPool(CFG, 8, BS)
    _, st = forward_chunk(model32, ids[:20], 0, list(range(8)), kv, BS, None)
    hs, st_end = model32.run(ids[20:], 20, list(range(8)), kv, st)
    hs2, st_end2, st_r = model32.run(ids[20:], 20, list(range(8)), kv, st, state_at=r)
    assert torch.equal(hs, hs2) and st_end.max_abs_diff(st_end2) == 0
    _, want = _shorter(model32, ids, r)
    assert st_r.max_abs_diff(want) < FP32_TOL
    _, later = _shorter(model32, ids, r + 1)
    assert st_r.max_abs_diff(later) > 100 * FP32_TOL


def _shorter(model, ids, r):
    """The Mamba state after 20 + r tokens, by prefilling [0, 20) then [20, 20 + r)."""
    kv = KVPool(CFG, 8, BS)
    _, st = forward_chunk(model, ids[:20], 0, list(range(8)), kv, BS, None)
    return model.run(ids[20:20 + r], 20, list(range(8)), kv, st)
