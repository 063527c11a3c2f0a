"""Real-compute backend: a pure-PyTorch hybrid Mamba2/attention stack with paged caches.

It exists to prove that resuming a prefill from cached state (attention K/V in paged blocks, the
Mamba conv + SSM state of a block boundary) equals prefilling from scratch, and to time layer
kinds for calibration.  See ``model.py`` for the forward pass and ``pools.py`` for the caches.

    cfg = TorchModelConfig.scaled(get_model("nemotron-h-8b"), num_layers=4, width_div=8)
    model = HybridStack(cfg, "cpu")
    last, state = forward_chunk(model, ids[:p], 0, blocks, kv_pool, bs, None)
    last, state = forward_chunk(model, ids[p:], p, blocks, kv_pool, bs, state)
"""
from .config import TorchModelConfig
from .kernels import ssd_chunked, ssd_sequential
from .model import HybridStack, forward_chunk, forward_scratch, reference_forward
from .pools import KVPool, MambaState, StatePool
from .timing import time_prefill

__all__ = [
    "TorchModelConfig", "HybridStack", "forward_chunk", "forward_scratch", "reference_forward",
    "KVPool", "StatePool", "MambaState", "ssd_chunked", "ssd_sequential", "time_prefill",
]
