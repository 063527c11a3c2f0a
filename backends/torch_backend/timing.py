"""Per-layer-kind prefill timing for calibrating the analytical cost model.

``time_prefill(model, new_tokens, cached, device, repeats)`` prefills ``new_tokens`` tokens of one
sequence after ``cached`` tokens whose K/V and Mamba state are already in the caches (built once,
untimed), and returns seconds per layer kind::

    {"mamba": s, "attention": s, "mlp": s, "other": s, "total": s}

Each kind is the sum over the model's blocks of that kind (``other`` = embedding, final norm);
``total`` is the wall time of the whole chunk.  One warm-up run, then ``repeats`` timed runs; the
median of each entry is returned.  On CUDA each block is bracketed by CUDA events (no sync
inside the pass, one sync at the end); on CPU by ``time.perf_counter``.  Rerunning the same chunk
is idempotent (it rewrites the same K/V, and the input state is never modified).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from .model import HybridStack, KIND
from .pools import KVPool, MambaState

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


def time_prefill(model: HybridStack, new_tokens: int, cached: int = 0, device=None,
                 repeats: int = 3, block_size: int = 16, seed: int = 0) -> dict[str, float]:
    """Median seconds per layer kind (and ``total``) to prefill ``new_tokens`` after ``cached``."""
    if new_tokens < 1 or cached < 0 or repeats < 1:
        raise ValueError("need new_tokens >= 1, cached >= 0, repeats >= 1")
    dev = torch.device(device) if device is not None else model.device
    if dev != model.device:
        raise ValueError(f"model is on {model.device}, asked to time on {dev}")
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

    once(_CudaTimer() if cuda else _CpuTimer())          # warm-up
    runs = [once(_CudaTimer() if cuda else _CpuTimer()) for _ in range(repeats)]
    return {k: statistics.median(r[k] for r in runs) for k in (*KINDS, "total")}


__all__ = ["time_prefill", "KINDS", "KIND"]
