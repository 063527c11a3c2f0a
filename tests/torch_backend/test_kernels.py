"""SSD, conv and attention kernels against their plain references."""
import pytest

torch = pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")
import torch.nn.functional as F  # noqa: E402

from backends.torch_backend.kernels import (  # noqa: E402
    attention, attention_reference, causal_conv1d, rope, rope_tables, segsum, ssd_chunked,
    ssd_sequential)


def _ssd_inputs(L, H=4, P=8, N=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    x = torch.randn(L, H, P, generator=g, dtype=f64)
    # the reference decay regime of models.md §6: dt = softplus(randn - 4), A = -exp(rand)
    dt = F.softplus(torch.randn(L, H, generator=g, dtype=f64) - 4)
    A = -torch.exp(torch.rand(H, generator=g, dtype=f64))
    b = torch.randn(L, H, N, generator=g, dtype=f64)
    c = torch.randn(L, H, N, generator=g, dtype=f64)
    s0 = torch.randn(H, P, N, generator=g, dtype=f64)
    return x * dt[..., None], dt * A, b, c, s0


def test_segsum():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    s = segsum(a)
    for i in range(4):
        for j in range(4):
            want = a[j + 1:i + 1].sum().item() if i >= j else float("-inf")
            assert s[i, j].item() == want


@pytest.mark.parametrize("L,chunk", [(128, 32), (100, 32), (37, 64), (200, 48), (1, 16), (64, 7)])
@pytest.mark.parametrize("with_state", [False, True])
def test_ssd_chunked_equals_sequential(L, chunk, with_state):
    x, a, b, c, s0 = _ssd_inputs(L)
    s0 = s0 if with_state else None
    y_ref, s_ref = ssd_sequential(x, a, b, c, s0)
    y, s = ssd_chunked(x.float(), a.float(), b.float(), c.float(), chunk,
                       None if s0 is None else s0.float())
    assert y.dtype == torch.float32 and y.shape == (L, 4, 8)
    torch.testing.assert_close(y.double(), y_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s.double(), s_ref, atol=1e-4, rtol=1e-4)


def test_ssd_chunked_float64_is_exact_to_roundoff():
    x, a, b, c, s0 = _ssd_inputs(150)
    y_ref, s_ref = ssd_sequential(x, a, b, c, s0)
    y, s = ssd_chunked(x, a, b, c, 32, s0)
    assert (y - y_ref).abs().max() < 1e-10 and (s - s_ref).abs().max() < 1e-10


@pytest.mark.parametrize("p", [64, 50, 1, 127])
def test_ssd_resume_from_state(p):
    """Chunked [0, p) then [p, L) from its final state == one chunked pass (fp32)."""
    L, chunk = 192, 32
    x, a, b, c, _ = (t.float() for t in _ssd_inputs(L, seed=3))
    y_full, s_full = ssd_chunked(x, a, b, c, chunk)
    y1, s1 = ssd_chunked(x[:p], a[:p], b[:p], c[:p], chunk)
    y2, s2 = ssd_chunked(x[p:], a[p:], b[p:], c[p:], chunk, s1)
    y = torch.cat([y1, y2])
    if p % chunk == 0:          # same arithmetic: bit-identical
        assert torch.equal(y, y_full) and torch.equal(s2, s_full)
    torch.testing.assert_close(y, y_full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(s2, s_full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("L,chunk,r", [(150, 32, 1), (150, 32, 31), (150, 32, 32), (150, 32, 33),
                                        (150, 32, 149), (40, 64, 17), (96, 48, 48)])
def test_ssd_chunked_state_at_is_the_state_after_r_tokens(L, chunk, r):
    """An internal checkpoint's state read from the one pass equals the state of a pass over
    the first r tokens (float64: to round-off), and the pass's own outputs are untouched."""
    x, a, b, c, s0 = _ssd_inputs(L, seed=4)
    _, s_r = ssd_sequential(x[:r], a[:r], b[:r], c[:r], s0)
    y0, s0_end = ssd_chunked(x, a, b, c, chunk, s0)
    y, s_end, mid = ssd_chunked(x, a, b, c, chunk, s0, state_at=r)
    assert torch.equal(y, y0) and torch.equal(s_end, s0_end)
    assert (mid - s_r).abs().max() < 1e-10
    # a wrong offset is caught: the state one token later differs
    _, s_r1 = ssd_sequential(x[:r + 1], a[:r + 1], b[:r + 1], c[:r + 1], s0)
    assert (mid - s_r1).abs().max() > 1e-3


@pytest.mark.parametrize("r", [0, 150])
def test_ssd_chunked_state_at_must_be_inside(r):
    x, a, b, c, _ = _ssd_inputs(150)
    with pytest.raises(ValueError, match="state_at"):
        ssd_chunked(x, a, b, c, 32, state_at=r)


def test_causal_conv1d_state_at():
    g = torch.Generator().manual_seed(1)
    d, k, L = 6, 4, 30
    x, w, bias = torch.randn(L, d, generator=g), torch.randn(d, k, generator=g), torch.randn(d)
    st0 = torch.randn(d, k - 1, generator=g)
    out, st_end = causal_conv1d(x, w, bias, st0)
    for r in (1, 2, 3, 17, 29):
        o, e, mid = causal_conv1d(x, w, bias, st0, state_at=r)
        _, st_r = causal_conv1d(x[:r], w, bias, st0)
        assert torch.equal(o, out) and torch.equal(e, st_end) and torch.equal(mid, st_r)


def test_causal_conv1d_with_state():
    g = torch.Generator().manual_seed(0)
    d, k, L = 6, 4, 30
    x = torch.randn(L, d, generator=g)
    w = torch.randn(d, k, generator=g)
    bias = torch.randn(d, generator=g)
    zero = torch.zeros(d, k - 1)
    full, st_full = causal_conv1d(x, w, bias, zero)
    # explicit tap sum with zero history
    padded = torch.cat([torch.zeros(k - 1, d), x])
    want = bias + sum(w[:, j] * padded[j:j + L] for j in range(k))
    torch.testing.assert_close(full, want)
    torch.testing.assert_close(st_full, x[-(k - 1):].T)
    # pieces of 1 (shorter than k-1), 2, 11 and 16 tokens carrying the state
    outs, st, i = [], zero, 0
    for n in (1, 2, 11, 16):
        o, st = causal_conv1d(x[i:i + n], w, bias, st)
        outs.append(o)
        i += n
    torch.testing.assert_close(torch.cat(outs), full)
    torch.testing.assert_close(st, st_full)


@pytest.mark.parametrize("start", [0, 1, 17, 40])
def test_attention_offset_mask(start):
    g = torch.Generator().manual_seed(1)
    S, hq, hkv, d = 48, 4, 2, 8
    q = torch.randn(S, hq, d, generator=g, dtype=torch.float64)
    k = torch.randn(S, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(S, hkv, d, generator=g, dtype=torch.float64)
    want = attention_reference(q, k, v)[start:]
    got = attention(q[start:], k, v, start)
    torch.testing.assert_close(got, want)


def test_rope_is_relative():
    """<rope(q, m), rope(k, n)> depends on m - n only."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 1, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 16, generator=g, dtype=torch.float64)

    def dot(m, n):
        cq, sq = rope_tables(torch.tensor([m]), 16, 10000.0, torch.float64)
        ck, sk = rope_tables(torch.tensor([n]), 16, 10000.0, torch.float64)
        return (rope(q, cq, sq) * rope(k, ck, sk)).sum().item()

    assert dot(5, 2) == pytest.approx(dot(103, 100), abs=1e-9)
    assert dot(5, 2) != pytest.approx(dot(5, 3), abs=1e-6)
