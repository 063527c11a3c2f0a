"""Per-layer-kind prefill timing for calibrating the analytical cost model.

``time_prefill(model, new_tokens, cached, device, repeats)`` prefills ``new_tokens`` tokens of one
sequence after ``cached`` tokens whose K/V and Mamba state are already in the caches (built once,
untimed), and returns seconds per layer kind::

    {"mamba": s, "attention": s, "mlp": s, "other": s, "total": s}

Each kind is the sum over the model's blocks of that kind (``other`` = embedding, final norm);
``total`` is the wall time of the whole chunk.  ``warmup`` runs (one by default), then ``repeats``
timed runs; the median of each entry is returned.  On CUDA each block is bracketed by CUDA events (no sync
inside the pass, one sync at the end); on CPU by ``time.perf_counter``.  Rerunning the same chunk
is idempotent (it rewrites the same K/V, and the input state is never modified).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from .model import HybridStack, KIND
from .pools import KVPool, MambaState, StatePool

KINDS = ("mamba", "attention", "mlp", "other")


class _CpuTimer:
    def __init__(self):
        self.acc = dict.fromkeys(KINDS, 0.0)

    @contextlib.contextmanager
    def __call__(self, kind):
        t0 = time.perf_counter()
        yield
        self.acc[kind] += time.perf_counter() - t0

    def result(self) -> dict[str, float]:
        return dict(self.acc)


class _CudaTimer:
    def __init__(self):
        self.events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def __call__(self, kind):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        yield
        e1.record()
        self.events.append((kind, e0, e1))

    def result(self) -> dict[str, float]:
        torch.cuda.synchronize()
        acc = dict.fromkeys(KINDS, 0.0)
        for kind, e0, e1 in self.events:
            acc[kind] += e0.elapsed_time(e1) / 1000.0
        return acc


def same_device(a, b) -> bool:
    """``cuda`` names the current GPU: it is the model's ``cuda:0`` (``torch.device`` equality
    says otherwise, the index being None on one side)."""
    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def time_prefill(model: HybridStack, new_tokens: int, cached: int = 0, device=None,
                 repeats: int = 3, block_size: int = 16, seed: int = 0,
                 warmup: int = 1) -> dict[str, float]:
    """Median seconds per layer kind (and ``total``) to prefill ``new_tokens`` after ``cached``."""
    if new_tokens < 1 or cached < 0 or repeats < 1 or warmup < 0:
        raise ValueError("need new_tokens >= 1, cached >= 0, repeats >= 1, warmup >= 0")
    dev = torch.device(device) if device is not None else model.device
    if not same_device(dev, model.device):
        raise ValueError(f"model is on {model.device}, asked to time on {dev}")
    dev = model.device
    cuda = dev.type == "cuda"
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab, (cached + new_tokens,), generator=g).to(dev)
    nb = -(-(cached + new_tokens) // block_size)
    pool = KVPool(cfg, nb, block_size, dev) if cfg.num_attention_layers else None
    blocks = list(range(nb))
    state = None
    if cached:
        _, state = model.run(ids[:cached], 0, blocks, pool, None)
    else:
        state = MambaState.zeros(cfg, dev)
    chunk = ids[cached:]

    def once(timer):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.run(chunk, cached, blocks, pool, state, timer=timer)
        r = timer.result()             # syncs on CUDA
        r["total"] = time.perf_counter() - t0
        return r

    for _ in range(warmup):
        once(_CudaTimer() if cuda else _CpuTimer())      # warm-up
    runs = [once(_CudaTimer() if cuda else _CpuTimer()) for _ in range(repeats)]
    return {k: statistics.median(r[k] for r in runs) for k in (*KINDS, "total")}





# ----------------------------------------------------------------------------------------------
# the kernel grid: each piece of the torch backend's work on its own

def bench(fn, device, repeats: int = 5, warmup: int = 2) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls.

    On CUDA each call is bracketed by a pair of CUDA events (launches queue back to back;
    one synchronisation at the end reads them all); on a CPU by ``time.perf_counter``."""
    if repeats < 1 or warmup < 0:
        raise ValueError("need repeats >= 1, warmup >= 0")
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
        pairs = []
        for _ in range(repeats):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            pairs.append((e0, e1))
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) / 1e3 for e0, e1 in pairs]
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def summarize(samples: list[float]) -> dict[str, float]:
    """Median, 10th and 90th percentile and minimum of timing samples (seconds)."""
    s = sorted(samples)

    def q(p):
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"median_s": statistics.median(s), "p10_s": q(0.1), "p90_s": q(0.9), "min_s": s[0]}


#: what :func:`time_kernels` times, and what each row means
KERNELS = {
    "mamba2_prefill": "one Mamba2 mixer over a chunk of t new tokens from a carried state "
                      "(in_proj, causal conv1d, chunked SSD scan, gated RMSNorm, out_proj)",
    "mamba2_ssd_scan": "the chunked SSD scan alone (ssd_chunked, float32) over t tokens",
    "mamba2_decode": "one Mamba2 mixer over t decode positions token by token, keeping every "
                     "position's state (a decode / speculative-verify step)",
    "attention_prefill": "one attention mixer over t new tokens with no cached prefix "
                         "(QKV, K/V written to the paged pool, causal SDPA, out proj)",
    "attention_prefill_cached": "one attention mixer over t new tokens after c cached tokens "
                                "(cached K/V gathered from the paged pool, masked SDPA)",
    "mlp": "one MLP block over t tokens (its matrix products)",
    "state_save": "one sequence's Mamba state (every Mamba layer's conv + SSM state) stored "
                  "into a state-pool block",
    "state_restore": "one sequence's Mamba state loaded (copied) out of a state-pool block",
    "state_block_copy": "a Mamba state block copied to another block (copy-on-write)",
    "kv_block_copy": "one KV block copied to another block in every attention layer "
                     "(copy-on-write of a partial prefix hit)",
}


def time_kernels(model: HybridStack, tokens=(1, 16, 64, 256), cached=(0, 256),
                 decode_tokens=(1, 2, 4), repeats: int = 5, warmup: int = 2,
                 block_size: int = 16, seed: int = 0) -> list[dict]:
    """Time the torch backend's kernels one by one on ``model``'s device (first layer of each
    kind; inputs, states and cached K/V drawn at random, never zeros).

    Rows: ``{"kernel", "tokens", "cached", "median_s", "p10_s", "p90_s", "min_s", "repeats",
    "warmup", "timer", "bytes"}`` (``bytes`` for the state and block copies, else None); the
    kernels are :data:`KERNELS`.  ``attention_prefill_cached`` runs for every nonzero entry
    of ``cached``; the others ignore it (0)."""
    cfg = model.cfg
    dev = model.device
    timer = "cuda_events" if dev.type == "cuda" else "perf_counter"
    g = torch.Generator().manual_seed(seed)
    dt = model.dtype
    rows: list[dict] = []

    def rand(*shape, dtype=dt, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=dev, dtype=dtype)

    def add(kernel, t, c, fn, nbytes=None):
        with torch.inference_mode():
            s = summarize(bench(fn, dev, repeats, warmup))
        rows.append({"kernel": kernel, "tokens": t, "cached": c, **s, "repeats": repeats,
                     "warmup": warmup, "timer": timer, "bytes": nbytes})

    kinds = {KIND[ch]: m for ch, m in zip(cfg.pattern, model.mixers)}
    mamba, attn, mlp = kinds.get("mamba"), kinds.get("attention"), kinds.get("mlp")
    k1 = cfg.conv_kernel - 1
    conv0 = rand(cfg.conv_dim, k1, scale=0.5)
    ssm0 = rand(cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state, dtype=torch.float32, scale=0.1)
    for t in tokens:
        h = rand(t, cfg.hidden)
        if mamba is not None:
            add("mamba2_prefill", t, 0, lambda h=h: mamba(h, conv0, ssm0))
            xs = rand(t, cfg.mamba_heads, cfg.mamba_head_dim, dtype=torch.float32, scale=0.1)
            a = -rand(t, cfg.mamba_heads, dtype=torch.float32).abs() * 0.1
            b = rand(t, cfg.mamba_heads, cfg.d_state, dtype=torch.float32)
            cc = rand(t, cfg.mamba_heads, cfg.d_state, dtype=torch.float32)
            from .kernels import ssd_chunked
            add("mamba2_ssd_scan", t, 0,
                lambda xs=xs, a=a, b=b, cc=cc: ssd_chunked(xs, a, b, cc, cfg.chunk_size, ssm0))
        if mlp is not None:
            add("mlp", t, 0, lambda h=h: mlp(h))
        if attn is not None:
            for c in sorted(set(cached) | {0}):
                nb = -(-(c + t) // block_size)
                pool = KVPool(cfg, nb, block_size, dev)
                for layer_kv in pool.kv:
                    layer_kv.copy_(rand(*layer_kv.shape))
                blocks = list(range(nb))
                add("attention_prefill_cached" if c else "attention_prefill", t, c,
                    lambda h=h, c=c, pool=pool, blocks=blocks: attn(h, c, 0, pool, blocks))
    if mamba is not None:
        for t in decode_tokens:
            h = rand(t, cfg.hidden)
            add("mamba2_decode", t, 0, lambda h=h: mamba(h, conv0, ssm0, True))
    if cfg.num_mamba_layers:
        sp = StatePool(cfg, 2, dev)
        for tens in (*sp.conv, *sp.ssm):
            tens.copy_(rand(*tens.shape, dtype=tens.dtype))
        st = sp.load(0)
        nbytes = sp.bytes_per_block
        add("state_save", 0, 0, lambda: sp.store(1, st), nbytes)
        add("state_restore", 0, 0, lambda: sp.load(0), nbytes)
        add("state_block_copy", 0, 0, lambda: sp.copy(0, 1), nbytes)
    if cfg.num_attention_layers:
        kp = KVPool(cfg, 2, block_size, dev)
        for layer_kv in kp.kv:
            layer_kv.copy_(rand(*layer_kv.shape))

        def kv_copy():
            for layer_kv in kp.kv:
                layer_kv[1].copy_(layer_kv[0])
        add("kv_block_copy", 0, 0, kv_copy, kp.bytes_per_block)
    return rows


__all__ = ["time_prefill", "time_kernels", "bench", "summarize", "KERNELS", "KINDS", "KIND"]
