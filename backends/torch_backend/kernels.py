"""Pure-PyTorch kernels of the hybrid stack, written from the algorithms (no vLLM/mamba_ssm code).

Shapes use ``t`` = tokens of the chunk (one sequence, no batch dimension), ``h`` = heads,
``p`` = head dim, ``n`` = state size, ``g`` = groups.

* :func:`ssd_chunked` -- Mamba2 SSD (state-space duality) scan over chunks with an initial state.
* :func:`ssd_sequential` -- the plain recurrence, the reference for the tests.
* :func:`ssd_steps` -- the recurrence keeping every token's state (decode / speculative verify).
* :func:`causal_conv1d` -- depthwise causal conv with a carried conv state.
* :func:`rms_norm`, :func:`gated_rms_norm`, :func:`rope`, :func:`attention`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


# ----------------------------------------------------------------------------------------------
# SSD

def segsum(a: Tensor) -> Tensor:
    """Stable segment sums: ``out[..., i, j] = a[..., j+1] + ... + a[..., i]`` for i >= j, -inf above.

    ``a`` is ``(..., l)``; the result ``(..., l, l)``.  Built by a cumulative sum of a masked copy
    (not as a difference of two cumulative sums), so long chunks lose no precision.
    """
    l = a.shape[-1]
    x = a.unsqueeze(-1).expand(*a.shape, l)                      # x[..., i, j] = a[..., i]
    strict = torch.ones(l, l, dtype=torch.bool, device=a.device).tril(-1)
    x = x.masked_fill(~strict, 0.0)
    out = torch.cumsum(x, dim=-2)
    keep = torch.ones(l, l, dtype=torch.bool, device=a.device).tril(0)
    return out.masked_fill(~keep, float("-inf"))


def ssd_chunked(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk_size: int,
                initial_state: Tensor | None = None, state_at: int | None = None):
    """Chunked SSD scan.

    ``x (t, h, p)`` inputs already multiplied by the step dt; ``a (t, h)`` per-step log decay
    (dt * A <= 0); ``b, c (t, h, n)`` (groups already expanded to heads); ``initial_state
    (h, p, n)`` or None (zeros).  Computes ``state_t = exp(a_t) state_{t-1} + x_t (x) b_t`` and
    ``y_t = state_t . c_t``; returns ``y (t, h, p)`` and the final state ``(h, p, n)``, both in
    the dtype of ``x`` (call it with float32 or float64 tensors).

    ``t`` need not be a multiple of ``chunk_size``: the tail is zero-padded (a = 0, x = 0 keep the
    state unchanged).  Steps per chunk: (1) intra-chunk output through the causal decay matrix
    ``exp(segsum(a))`` weighting ``c . b``; (2) each chunk's own end state from a zero start;
    (3) a scan over chunk boundaries from ``initial_state`` giving the state entering each chunk
    and the final state; (4) the entering state read out through ``c`` with decay
    ``exp(cumsum(a))``.  y = (1) + (4).

    ``state_at`` (0 < r < t): also return the state after the first ``r`` tokens, as a third
    value -- read from the same pass (the state entering r's chunk, decayed to r, plus that
    chunk's own inputs up to r), as vLLM's SSD kernel hands out a state inside a chunk it
    computes in one launch (an internal prefill checkpoint): no second pass over the tokens.
    """
    t, h, p = x.shape
    n = b.shape[-1]
    q = int(chunk_size)
    dt = x.dtype
    if initial_state is None:
        initial_state = torch.zeros(h, p, n, dtype=dt, device=x.device)
    s = initial_state.to(dt)
    if state_at is not None and not 0 < state_at < t:
        raise ValueError(f"state_at {state_at} must be inside the {t} tokens")
    if t == 0:
        return x.new_zeros(0, h, p), s.clone()
    pad = (-t) % q
    if pad:
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        a = F.pad(a, (0, 0, 0, pad))
        b = F.pad(b, (0, 0, 0, 0, 0, pad))
        c = F.pad(c, (0, 0, 0, 0, 0, pad))
    nc = (t + pad) // q
    x = x.reshape(nc, q, h, p)
    a = a.reshape(nc, q, h).permute(0, 2, 1).to(dt)            # (nc, h, q)
    b = b.reshape(nc, q, h, n).to(dt)
    c = c.reshape(nc, q, h, n).to(dt)
    a_cum = torch.cumsum(a, dim=-1)                              # (nc, h, q)

    # (1) diagonal blocks
    decay = torch.exp(segsum(a))                                 # (nc, h, q, q)
    scores = torch.einsum("cihn,cjhn->chij", c, b) * decay
    y = torch.einsum("chij,cjhp->cihp", scores, x)

    # (2) chunk-end states from a zero start
    to_end = torch.exp(a_cum[..., -1:] - a_cum)                  # (nc, h, q); exponent <= 0
    chunk_states = torch.einsum("cjhn,chj,cjhp->chpn", b, to_end, x)

    # (3) inter-chunk scan
    chunk_decay = torch.exp(a_cum[..., -1])                      # (nc, h)
    entering = []
    for k in range(nc):
        entering.append(s)
        s = chunk_decay[k][:, None, None] * s + chunk_states[k]
    entering = torch.stack(entering)                             # (nc, h, p, n)

    # (4) off-diagonal output
    y = y + torch.einsum("cihn,chpn,chi->cihp", c, entering, torch.exp(a_cum))
    y = y.reshape(nc * q, h, p)[:t]
    if state_at is None:
        return y, s
    k, o = divmod(state_at - 1, q)                   # the r-th token: chunk k, offset o
    ac = a_cum[k, :, : o + 1]                        # (h, o+1)
    to_r = torch.exp(ac[:, -1:] - ac)                # decay of token j's input up to r
    mid = (torch.exp(ac[:, -1])[:, None, None] * entering[k]
           + torch.einsum("jhn,hj,jhp->hpn", b[k, : o + 1], to_r, x[k, : o + 1]))
    return y, s, mid


def ssd_sequential(x: Tensor, a: Tensor, b: Tensor, c: Tensor,
                   initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The plain recurrence, one token at a time (same arguments as :func:`ssd_chunked`)."""
    t, h, p = x.shape
    n = b.shape[-1]
    s = (torch.zeros(h, p, n, dtype=x.dtype, device=x.device) if initial_state is None
         else initial_state.to(x.dtype).clone())
    ys = []
    for i in range(t):
        s = torch.exp(a[i])[:, None, None] * s + x[i][:, :, None] * b[i][:, None, :]
        ys.append(torch.einsum("hpn,hn->hp", s, c[i]))
    y = torch.stack(ys) if ys else x.new_zeros(0, h, p)
    return y, s


def ssd_steps(x: Tensor, a: Tensor, b: Tensor, c: Tensor, initial_state: Tensor
              ) -> tuple[Tensor, Tensor]:
    """The recurrence token by token, keeping the state after every token (what a decode /
    speculative-verify step computes: one state per scheduled position).  Same arguments as
    :func:`ssd_sequential`; returns ``y (t, h, p)`` and ``states (t, h, p, n)``."""
    s = initial_state.to(x.dtype)
    ys, states = [], []
    for i in range(x.shape[0]):
        s = torch.exp(a[i])[:, None, None] * s + x[i][:, :, None] * b[i][:, None, :]
        ys.append(torch.einsum("hpn,hn->hp", s, c[i]))
        states.append(s)
    return torch.stack(ys), torch.stack(states)


# ----------------------------------------------------------------------------------------------
# conv, norms, RoPE, attention

def causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor, conv_state: Tensor,
                  state_at: int | None = None):
    """Depthwise causal conv over time with a carried state.

    ``x (t, d)``; ``weight (d, k)``; ``bias (d,)``; ``conv_state (d, k-1)`` = the previous k-1
    *inputs* (oldest first; zeros at sequence start).  Returns ``out (t, d)`` (no activation) and
    the new state ``(d, k-1)`` = the last k-1 inputs of ``[state, x]``.  Computed in the dtype of
    ``weight``.  ``state_at`` (0 < r < t): also the state after the first r tokens (third value).
    """
    k = weight.shape[1]
    full = torch.cat([conv_state.to(weight.dtype), x.to(weight.dtype).transpose(0, 1)], dim=1)
    out = F.conv1d(full.unsqueeze(0), weight.unsqueeze(1), bias, groups=weight.shape[0])
    new_state = full[:, full.shape[1] - (k - 1):]
    if state_at is None:
        return out.squeeze(0).transpose(0, 1), new_state
    return out.squeeze(0).transpose(0, 1), new_state, full[:, state_at: state_at + k - 1]


def conv_states(x: Tensor, conv_state: Tensor) -> Tensor:
    """The conv state after each token of ``x (t, d)`` from ``conv_state (d, k-1)``:
    ``(t, d, k-1)``, entry j = the last k-1 inputs up to and including token j."""
    k1 = conv_state.shape[1]
    full = torch.cat([conv_state, x.to(conv_state.dtype).transpose(0, 1)], dim=1)
    return full.unfold(1, k1, 1)[:, 1:].permute(1, 0, 2)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim, computed in float32 (float64 stays float64)."""
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(cd)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(cd)).to(x.dtype)


def gated_rms_norm(y: Tensor, z: Tensor, weight: Tensor, groups: int, eps: float) -> Tensor:
    """Mamba2 output norm: ``rmsnorm(y * silu(z))`` per group of ``d / groups`` channels."""
    cd = torch.float64 if y.dtype == torch.float64 else torch.float32
    g = y.to(cd) * F.silu(z.to(cd))
    t, d = g.shape
    gg = g.view(t, groups, d // groups)
    gg = gg * torch.rsqrt(gg.pow(2).mean(-1, keepdim=True) + eps)
    return (gg.reshape(t, d) * weight.to(cd)).to(y.dtype)


def rope_tables(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype
                ) -> tuple[Tensor, Tensor]:
    """cos/sin ``(t, head_dim/2)`` at absolute positions, computed in float64 then cast."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device)
                    / head_dim)
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on ``x (t, heads, d)`` (computed in the tables' dtype, cast back)."""
    xf = x.to(cos.dtype)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    cs, sn = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cs - x2 * sn, x2 * cs + x1 * sn], dim=-1).to(x.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, start: int) -> Tensor:
    """Causal GQA attention of ``q (t, hq, d)`` at positions [start, start+t) over
    ``k, v (start+t, hkv, d)`` (positions [0, start+t)).  Returns ``(t, hq, d)``.

    Query i may see keys 0..start+i: with start == 0 that is SDPA's ``is_causal``; otherwise an
    explicit boolean mask (SDPA's ``is_causal`` aligns the diagonal top-left, which is wrong
    for a chunk that follows cached keys).
    """
    t, hq, d = q.shape
    s, hkv, _ = k.shape
    rep = hq // hkv
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    qq, kk, vv = (z.transpose(0, 1).unsqueeze(0) for z in (q, k, v))   # (1, h, len, d)
    if start == 0:
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
    else:
        mask = torch.ones(t, s, dtype=torch.bool, device=q.device).tril(diagonal=start)
        o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask)
    return o.squeeze(0).transpose(0, 1)


def attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Explicit-softmax causal GQA attention from position 0 (reference; any float dtype)."""
    t, hq, d = q.shape
    rep = hq // k.shape[1]
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / (d ** 0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return torch.einsum("hij,jhd->ihd", w, v)
