"""The hybrid Mamba2/attention stack with seeded random weights, and its cache-aware forward.

``HybridStack(cfg, device)``: embedding -> per pattern character a pre-RMSNorm residual block
(``x + mixer(rmsnorm(x))``) -> final RMSNorm; it returns hidden states (no LM head).

* Mamba2 block: in_proj -> (z, xBC, dt); causal depthwise conv1d over xBC carrying a conv state
  (the last conv_kernel-1 inputs), SiLU; split x, B, C; dt = softplus(dt + dt_bias);
  A = -exp(A_log); chunked SSD from the carried SSM state (float32 always); + D * x; gated
  RMSNorm with z (per group); out_proj.
* Attention block: QKV, RoPE at absolute positions on the first ``cfg.rotary_dim`` channels of
  each head (none when 0: NemotronH, Granite-4.0-H and Jamba attention have no position
  embedding), GQA, SDPA of the chunk's queries over the cached K/V of [0, start) (read from a
  :class:`KVPool`) plus the chunk's own K/V.
* MLP block (``-`` and ``E``): SwiGLU, or squared-ReLU up/down when ``cfg.ffn_gated`` is False.

Entry points: :func:`forward_chunk` (what the simulator calls), :func:`forward_scratch` (one
pass, no cache), :func:`reference_forward` (float64, token-by-token SSD, explicit softmax).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import kernels as K
from .config import TorchModelConfig
from .pools import KVPool, MambaState, torch_dtype

Tensor = torch.Tensor

KIND = {"M": "mamba", "*": "attention", "-": "mlp", "E": "mlp"}


class _Init:
    """Deterministic parameter generator (CPU, float32) so weights match across devices."""

    def __init__(self, seed: int):
        self.g = torch.Generator().manual_seed(int(seed))

    def normal(self, *shape, std: float = 1.0, mean: float = 0.0) -> nn.Parameter:
        return nn.Parameter(torch.randn(*shape, generator=self.g) * std + mean,
                            requires_grad=False)

    def uniform(self, *shape, lo: float, hi: float) -> Tensor:
        return torch.rand(*shape, generator=self.g) * (hi - lo) + lo


class Mamba2Mixer(nn.Module):
    def __init__(self, cfg: TorchModelConfig, init: _Init):
        super().__init__()
        self.cfg = cfg
        c = cfg
        self.w_in = init.normal(c.in_proj_dim, c.hidden, std=c.hidden ** -0.5)
        self.conv_w = init.normal(c.conv_dim, c.conv_kernel, std=c.conv_kernel ** -0.5)
        self.conv_b = init.normal(c.conv_dim, std=0.1)
        # dt log-uniform in [1e-3, 1e-1], stored as softplus^-1 (the Mamba2 initialisation)
        dt = torch.exp(init.uniform(c.mamba_heads, lo=math.log(1e-3), hi=math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)), requires_grad=False)
        self.A_log = nn.Parameter(torch.log(init.uniform(c.mamba_heads, lo=1.0, hi=16.0)),
                                  requires_grad=False)
        self.D = init.normal(c.mamba_heads, std=0.1, mean=1.0)
        self.norm_w = init.normal(c.d_inner, std=0.1, mean=1.0)
        self.w_out = init.normal(c.hidden, c.d_inner, std=c.d_inner ** -0.5)

    # parameters that stay float32 whatever the model dtype
    FP32 = ("conv_w", "conv_b", "dt_bias", "A_log", "D")

    def split_in(self, h: Tensor):
        c = self.cfg
        zxbcdt = F.linear(h, self.w_in)
        return torch.split(zxbcdt, [c.d_inner, c.conv_dim, c.mamba_heads], dim=-1)

    def ssd_inputs(self, xbc: Tensor, dt_raw: Tensor, cd: torch.dtype):
        """(x (t,h,p), x*dt, a = dt*A (t,h), B, C (t,h,n)) in compute dtype ``cd``."""
        c = self.cfg
        t = xbc.shape[0]
        x, b, cc = torch.split(xbc.to(cd), [c.d_inner, c.n_groups * c.d_state,
                                            c.n_groups * c.d_state], dim=-1)
        dt = F.softplus(dt_raw.to(cd) + self.dt_bias.to(cd))               # (t, h)
        a = dt * (-torch.exp(self.A_log.to(cd)))
        x = x.reshape(t, c.mamba_heads, c.mamba_head_dim)
        rep = c.mamba_heads // c.n_groups
        b = b.reshape(t, c.n_groups, c.d_state).repeat_interleave(rep, dim=1)
        cc = cc.reshape(t, c.n_groups, c.d_state).repeat_interleave(rep, dim=1)
        return x, x * dt[..., None], a, b, cc

    def forward(self, h: Tensor, conv_state: Tensor, ssm_state: Tensor, steps: bool = False,
                state_at: int | None = None):
        """Output and the state after the last token; with ``steps`` the tokens run one by one
        (a decode / speculative-verify step, as vLLM's state-update kernel does) and the state
        after *every* token comes back: conv ``(t, d, k-1)``, ssm ``(t, h, p, n)``.  With
        ``state_at`` (0 < r < t) a fourth value: the ``(conv, ssm)`` state after r tokens,
        from the same pass (an internal prefill checkpoint)."""
        c = self.cfg
        t = h.shape[0]
        z, xbc, dt_raw = self.split_in(h)
        mid = None
        if state_at is None:
            conv_out, new_conv = K.causal_conv1d(xbc, self.conv_w, self.conv_b, conv_state)
        else:
            conv_out, new_conv, conv_mid = K.causal_conv1d(xbc, self.conv_w, self.conv_b,
                                                           conv_state, state_at)
        if steps:
            new_conv = K.conv_states(xbc, conv_state.to(self.conv_w.dtype))
        xbc = F.silu(conv_out).to(h.dtype)            # activations in model dtype
        x, xdt, a, b, cc = self.ssd_inputs(xbc, dt_raw, torch.float32)
        if steps:
            y, new_ssm = K.ssd_steps(xdt, a, b, cc, ssm_state.float())
        elif state_at is None:
            y, new_ssm = K.ssd_chunked(xdt, a, b, cc, c.chunk_size, ssm_state.float())
        else:
            y, new_ssm, ssm_mid = K.ssd_chunked(xdt, a, b, cc, c.chunk_size, ssm_state.float(),
                                                state_at)
            mid = (conv_mid.to(conv_state.dtype), ssm_mid)
        y = y + self.D.float()[:, None] * x
        y = y.reshape(t, c.d_inner).to(h.dtype)
        y = K.gated_rms_norm(y, z, self.norm_w, c.n_groups, c.norm_eps)
        out = F.linear(y, self.w_out), new_conv.to(conv_state.dtype), new_ssm
        return out if state_at is None else (*out, mid)


class Attention(nn.Module):
    def __init__(self, cfg: TorchModelConfig, init: _Init):
        super().__init__()
        self.cfg = c = cfg
        self.wq = init.normal(c.q_heads * c.head_dim, c.hidden, std=c.hidden ** -0.5)
        self.wk = init.normal(c.kv_heads * c.head_dim, c.hidden, std=c.hidden ** -0.5)
        self.wv = init.normal(c.kv_heads * c.head_dim, c.hidden, std=c.hidden ** -0.5)
        self.wo = init.normal(c.hidden, c.q_heads * c.head_dim,
                              std=(c.q_heads * c.head_dim) ** -0.5)

    def qkv(self, h: Tensor, positions: Tensor, table_dtype: torch.dtype):
        c = self.cfg
        t = h.shape[0]
        q = F.linear(h, self.wq).view(t, c.q_heads, c.head_dim)
        k = F.linear(h, self.wk).view(t, c.kv_heads, c.head_dim)
        v = F.linear(h, self.wv).view(t, c.kv_heads, c.head_dim)
        return _positions(q, k, positions, c, table_dtype) + (v,)

    def forward(self, h: Tensor, start: int, layer: int, kv_pool: KVPool | None, block_ids):
        t = h.shape[0]
        positions = torch.arange(start, start + t, device=h.device)
        q, k, v = self.qkv(h, positions, torch.float32)
        if kv_pool is not None:
            kv_pool.write(layer, block_ids, positions, k, v)
        if start > 0:
            kp, vp = kv_pool.read(layer, block_ids, torch.arange(start, device=h.device))
            k = torch.cat([kp.to(k.dtype), k], dim=0)
            v = torch.cat([vp.to(v.dtype), v], dim=0)
        o = K.attention(q, k, v, start)
        return F.linear(o.reshape(t, -1), self.wo)


def _positions(q: Tensor, k: Tensor, positions: Tensor, c: TorchModelConfig,
               table_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """q, k with RoPE on their first ``c.rotary_dim`` channels (unchanged when 0)."""
    r = c.rotary_dim
    if r == 0:
        return q, k
    cos, sin = K.rope_tables(positions, r, c.rope_theta, table_dtype)
    if r == c.head_dim:
        return K.rope(q, cos, sin), K.rope(k, cos, sin)
    return (torch.cat([K.rope(q[..., :r], cos, sin), q[..., r:]], dim=-1),
            torch.cat([K.rope(k[..., :r], cos, sin), k[..., r:]], dim=-1))


class MLP(nn.Module):
    def __init__(self, cfg: TorchModelConfig, init: _Init):
        super().__init__()
        self.cfg = c = cfg
        if c.ffn_gated:
            self.w_gate = init.normal(c.ffn_dim, c.hidden, std=c.hidden ** -0.5)
        self.w_up = init.normal(c.ffn_dim, c.hidden, std=c.hidden ** -0.5)
        self.w_down = init.normal(c.hidden, c.ffn_dim, std=c.ffn_dim ** -0.5)

    def forward(self, h: Tensor) -> Tensor:
        if self.cfg.ffn_gated:
            u = F.silu(F.linear(h, self.w_gate)) * F.linear(h, self.w_up)
        else:
            u = torch.relu(F.linear(h, self.w_up)).square()
        return F.linear(u, self.w_down)


def full_fp32_on_cuda(device) -> None:
    """On CUDA, float32 matrix products and convolutions run in full float32, not TF32.

    PyTorch lets cuDNN convolutions (the Mamba conv1d) use TF32 by default, whose 10-bit
    mantissa would put rounding differences of ~1e-3 between a cached resume and a scratch
    pass: far above ``sim verify``'s float32 bound (1e-4) though nothing is wrong.  A CUDA
    model therefore turns TF32 off for the process (bf16 models are unaffected); the
    provenance of a GPU profile records the setting (``tf32``)."""
    if device is not None and torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


class HybridStack(nn.Module):
    """Embedding -> pre-RMSNorm residual blocks per ``cfg.pattern`` -> final RMSNorm.

    Weights are drawn on the CPU from ``torch.Generator().manual_seed(cfg.seed)`` in float32
    and then moved to ``device`` and ``cfg.dtype`` (SSM parameters and conv stay float32), so the
    same config gives the same model on every device.  Inference only (no gradients).
    """

    def __init__(self, cfg: TorchModelConfig, device=None):
        super().__init__()
        self.cfg = cfg
        init = _Init(cfg.seed)
        self.embed = init.normal(cfg.vocab, cfg.hidden, std=1.0)
        self.norms = nn.ParameterList()
        self.mixers = nn.ModuleList()
        for ch in cfg.pattern:
            self.norms.append(init.normal(cfg.hidden, std=0.1, mean=1.0))
            if ch == "M":
                self.mixers.append(Mamba2Mixer(cfg, init))
            elif ch == "*":
                self.mixers.append(Attention(cfg, init))
            else:
                self.mixers.append(MLP(cfg, init))
        self.final_norm = init.normal(cfg.hidden, std=0.1, mean=1.0)
        dt = torch_dtype(cfg.dtype)
        full_fp32_on_cuda(device)
        self.to(device=device if device is not None else "cpu", dtype=dt)
        for m in self.mixers:
            if isinstance(m, Mamba2Mixer):
                for name in Mamba2Mixer.FP32:
                    getattr(m, name).data = getattr(m, name).data.float()
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @torch.no_grad()
    def run(self, token_ids: Tensor, start: int, kv_block_ids, kv_pool: KVPool | None,
            state_in: MambaState | None, timer=None, steps: bool = False,
            state_at: int | None = None):
        """Hidden states ``(t, hidden)`` of positions [start, start+t) and the Mamba state after
        the last token.  ``timer(kind)`` (optional) returns a context manager wrapped around each
        block (kind ``mamba``/``attention``/``mlp``) and the rest (``other``).

        ``steps``: run the Mamba layers token by token and return the Mamba state after *each*
        token (a list of t states), as a speculative-decoding step keeps one per scheduled
        position; the caller keeps the one of the last accepted token.

        ``state_at`` (0 < r < t): return ``(hidden, state, state_r)``, ``state_r`` the Mamba
        state after the first r tokens, read from this same pass (an internal prefill
        checkpoint: vLLM's kernels hand that state out of the chunk's one launch)."""
        cfg = self.cfg
        timer = timer or (lambda kind: contextlib.nullcontext())
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device).reshape(-1)
        t = ids.numel()
        if t == 0:
            raise ValueError("forward over zero tokens")
        if start < 0:
            raise ValueError("start must be >= 0")
        if state_in is None:
            if start != 0:
                raise ValueError("state_in=None (zero Mamba state) is only valid with start == 0")
            state_in = MambaState.zeros(cfg, self.device)
        if len(state_in.layers) != cfg.num_mamba_layers:
            raise ValueError(f"state_in has {len(state_in.layers)} layers, "
                             f"model {cfg.num_mamba_layers}")
        if state_at is not None and (steps or not 0 < state_at < t):
            raise ValueError(f"state_at {state_at}: inside the {t} tokens, without steps")
        if start > 0 and kv_pool is None and cfg.num_attention_layers:
            raise ValueError("start > 0 needs a kv_pool holding positions [0, start)")
        with timer("other"):
            x = F.embedding(ids, self.embed)
        out_layers, mid_layers = [], []
        mi = ai = 0
        for ch, norm_w, mixer in zip(cfg.pattern, self.norms, self.mixers):
            with timer(KIND[ch]):
                h = K.rms_norm(x, norm_w, cfg.norm_eps)
                if ch == "M":
                    conv, ssm = state_in.layers[mi]
                    if state_at is None:
                        y, conv, ssm = mixer(h, conv.to(self.device), ssm.to(self.device), steps)
                    else:
                        y, conv, ssm, mid = mixer(h, conv.to(self.device), ssm.to(self.device),
                                                  False, state_at)
                        mid_layers.append(mid)
                    out_layers.append((conv, ssm))
                    mi += 1
                elif ch == "*":
                    y = mixer(h, start, ai, kv_pool, kv_block_ids)
                    ai += 1
                else:
                    y = mixer(h)
                x = x + y
        with timer("other"):
            x = K.rms_norm(x, self.final_norm, cfg.norm_eps)
        if steps:
            return x, [MambaState([(c[j], s[j]) for c, s in out_layers]) for j in range(t)]
        if state_at is not None:
            return x, MambaState(out_layers), MambaState(mid_layers)
        return x, MambaState(out_layers)


def forward_chunk(model: HybridStack, token_ids: Tensor, start: int, kv_block_ids,
                  kv_pool: KVPool | None, block_size: int, state_in: MambaState | None
                  ) -> tuple[Tensor, MambaState]:
    """Prefill positions [start, start + len(token_ids)) of one sequence.

    Writes the chunk's K/V into ``kv_pool`` at ``kv_block_ids[pos // block_size]``, offset
    ``pos % block_size``; reads the K/V of [0, start) the same way; starts the Mamba layers from
    ``state_in`` (None = zero state, only with start == 0).  Returns the last token's hidden
    state ``(hidden,)`` and the Mamba state after the chunk's last token.  ``kv_pool`` may be
    None only for a model without attention layers or with ``start == 0`` (nothing is cached).
    """
    if kv_pool is not None and kv_pool.block_size != block_size:
        raise ValueError(f"block_size {block_size} != kv_pool.block_size {kv_pool.block_size}")
    hs, state = model.run(token_ids, start, kv_block_ids, kv_pool, state_in)
    return hs[-1], state


def forward_scratch(model: HybridStack, token_ids: Tensor, block_size: int = 16) -> Tensor:
    """Last hidden state of one uncached pass over ``token_ids`` (a fresh internal pool)."""
    t = int(torch.as_tensor(token_ids).numel())
    nb = max(1, -(-t // block_size))
    pool = KVPool(model.cfg, nb, block_size, model.device) if model.cfg.num_attention_layers else None
    hs, _ = model.run(token_ids, 0, list(range(nb)), pool, None)
    return hs[-1]


# ----------------------------------------------------------------------------------------------
# float64 reference

@torch.no_grad()
def reference_forward(model: HybridStack, token_ids: Tensor, return_state: bool = False):
    """The whole stack in float64 from position 0: conv as an explicit tap sum, SSD by the plain
    recurrence (``state_t = exp(A_t) state_{t-1} + x_t (x) B_t``, ``y_t = state_t . C_t``),
    attention by an explicit softmax.  Uses the model's (possibly bf16-rounded) weights.
    Returns the last hidden ``(hidden,)`` in float64 (and the final MambaState in float64 when
    ``return_state``)."""
    cfg = model.cfg
    f64 = torch.float64
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=model.device).reshape(-1)
    t = ids.numel()
    x = F.embedding(ids, model.embed.to(f64))
    states = []
    for ch, norm_w, mixer in zip(cfg.pattern, model.norms, model.mixers):
        h = K.rms_norm(x, norm_w.to(f64), cfg.norm_eps)
        if ch == "M":
            m = mixer
            zxbcdt = F.linear(h, m.w_in.to(f64))
            z, xbc, dt_raw = torch.split(zxbcdt, [cfg.d_inner, cfg.conv_dim, cfg.mamba_heads], -1)
            kk = cfg.conv_kernel
            padded = torch.cat([xbc.new_zeros(kk - 1, cfg.conv_dim), xbc], dim=0)
            w = m.conv_w.to(f64)
            conv = m.conv_b.to(f64).expand(t, -1).clone()
            for j in range(kk):
                conv = conv + w[:, j] * padded[j:j + t]
            xbc = F.silu(conv)
            xr, xdt, a, b, cc = m.ssd_inputs(xbc, dt_raw, f64)
            y, s = K.ssd_sequential(xdt, a, b, cc)
            y = y + m.D.to(f64)[:, None] * xr
            y = K.gated_rms_norm(y.reshape(t, cfg.d_inner), z, m.norm_w.to(f64), cfg.n_groups,
                                 cfg.norm_eps)
            x = x + F.linear(y, m.w_out.to(f64))
            states.append((padded[padded.shape[0] - (kk - 1):].transpose(0, 1).clone(), s))
        elif ch == "*":
            m = mixer
            pos = torch.arange(t, device=model.device)
            q = F.linear(h, m.wq.to(f64)).view(t, cfg.q_heads, cfg.head_dim)
            k = F.linear(h, m.wk.to(f64)).view(t, cfg.kv_heads, cfg.head_dim)
            v = F.linear(h, m.wv.to(f64)).view(t, cfg.kv_heads, cfg.head_dim)
            q, k = _positions(q, k, pos, cfg, f64)
            o = K.attention_reference(q, k, v)
            x = x + F.linear(o.reshape(t, -1), m.wo.to(f64))
        else:
            m = mixer
            if cfg.ffn_gated:
                u = F.silu(F.linear(h, m.w_gate.to(f64))) * F.linear(h, m.w_up.to(f64))
            else:
                u = torch.relu(F.linear(h, m.w_up.to(f64))).square()
            x = x + F.linear(u, m.w_down.to(f64))
    x = K.rms_norm(x, model.final_norm.to(f64), cfg.norm_eps)
    if return_state:
        return x[-1], MambaState(states)
    return x[-1]
