"""GPU presets and the size of vLLM's KV-cache block pool on them.

``memory_bytes`` is the total CUDA reports for the device (``nvidia-smi`` total), which is what
vLLM multiplies by ``gpu_memory_utilization`` -- not the marketed capacity.  FLOP/s are dense
(no 2:4 sparsity) datasheet peaks; H200 facts follow ``docs/models.md`` §8.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from sim.models.layout import KVLayout
from sim.models.spec import ModelSpec

__all__ = ["GPUSpec", "H100", "H200", "B200", "GPUS", "get_gpu", "gpu_names", "KVBudget", "kv_budget",
           "num_kv_blocks", "DEFAULT_ACTIVATION_RESERVE_BYTES"]

MiB = 2**20
GiB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int          # total device memory as CUDA / nvidia-smi report it
    bf16_flops: float          # dense bf16 tensor-core peak, FLOP/s
    fp8_flops: float           # dense fp8 tensor-core peak, FLOP/s
    hbm_bytes_per_s: float     # peak HBM bandwidth, B/s
    source: str = ""
    compute_capability: tuple[int, int] = (9, 0)   # SM version: kernel choices depend on it

    @property
    def ridge_flops_per_byte(self) -> float:
        """bf16 roofline ridge point (FLOP per HBM byte)."""
        return self.bf16_flops / self.hbm_bytes_per_s


H100 = GPUSpec(
    name="H100", memory_bytes=81_559 * MiB, bf16_flops=989.4e12, fp8_flops=1978.9e12,
    hbm_bytes_per_s=3.35e12,
    source=("NVIDIA H100 SXM5 80 GB datasheet: 989.4 TFLOP/s bf16 dense, 1,979 fp8 dense, 3.35 TB/s HBM3; "
            "memory = nvidia-smi total 81,559 MiB [M]"))
H200 = GPUSpec(
    name="H200", memory_bytes=143_771 * MiB, bf16_flops=989.4e12, fp8_flops=1978.9e12,
    hbm_bytes_per_s=4.8e12,
    source=("models.md §8: H200 SXM 141 GB HBM3e at 4.8 TB/s, dense bf16 ~990 TFLOP/s (datasheet 989.4; "
            "same SMs as H100, fp8 1,979 dense); nvidia-smi total 143,771 MiB measured on this workplace's "
            "machines (which also measured 769-798 TFLOP/s bf16 matmul, ~4.3 TB/s D2D copy)"))
B200 = GPUSpec(
    name="B200", memory_bytes=183_359 * MiB, bf16_flops=2.25e15, fp8_flops=4.5e15,
    hbm_bytes_per_s=8.0e12, compute_capability=(10, 0),
    source=("NVIDIA HGX B200 datasheet: 180 GB HBM3e per GPU (192 GB physical), 8 TB/s, 2.25 PFLOP/s bf16 "
            "dense, 4.5 PFLOP/s fp8 dense [M]; memory = nvidia-smi total 183,359 MiB (179 GiB, 192.3e9 B) [M]"))

GPUS: dict[str, GPUSpec] = {g.name.lower(): g for g in (H100, H200, B200)}
_ALIASES = {"h100-sxm": "h100", "h100-sxm5": "h100", "h100-80gb": "h100", "h100_sxm": "h100",
            "h200-sxm": "h200", "h200-141gb": "h200", "b200-sxm": "b200"}


def gpu_names() -> list[str]:
    return [g.name for g in GPUS.values()]


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Preset by name, case-insensitively (``H100``, ``h200``, ``H100-SXM`` ...).

    Raises ``KeyError`` with a one-line message listing the valid names.
    """
    if isinstance(name, GPUSpec):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise KeyError(f"unknown GPU {name!r}; valid names: {', '.join(gpu_names())}")
    return GPUS[key]


# vLLM measures this by profiling one forward pass at max_num_batched_tokens (peak activations)
# plus non-torch memory and CUDA graphs; a few GiB for these models.  Pass the real figure when
# known (vLLM logs it as "non_kv_cache_memory" minus the weights).
DEFAULT_ACTIVATION_RESERVE_BYTES = 4 * GiB


@dataclass(frozen=True)
class KVBudget:
    """The numbers behind :func:`num_kv_blocks` (all per GPU)."""

    usable_bytes: int            # floor(memory_bytes x gpu_memory_utilization)
    weight_bytes: int            # weights held by this GPU
    reserve_bytes: int           # activations, CUDA graphs, non-torch memory
    available_bytes: int         # usable - weights - reserve
    layer_slots_per_block: int   # pages per pool block on this GPU
    block_bytes: int             # layer_slots_per_block x page_bytes
    num_blocks: int              # available // block_bytes (vLLM's num_gpu_blocks, incl. the null block)


def kv_budget(gpu: GPUSpec, model: ModelSpec, layout: KVLayout, *, gpu_memory_utilization: float = 0.9,
              tp: int = 1, num_gpus: int | None = None,
              activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
              kv_cache_memory_bytes: int | None = None) -> KVBudget:
    """See :func:`num_kv_blocks`; returns every intermediate figure.

    ``kv_cache_memory_bytes`` (vLLM's ``--kv-cache-memory-bytes``) replaces the profiled
    budget: vLLM 0.33.0's worker skips the memory profile and hands that many bytes to the
    planner (``available_bytes``), ignoring ``gpu_memory_utilization``; the planner's
    ``available_memory // bytes_per_block`` then sizes the pool as here.  It must still
    fit beside the weights and the reserve on the GPU (else vLLM runs out of memory)."""
    gpu = get_gpu(gpu)
    if not isinstance(gpu_memory_utilization, (int, float)) or isinstance(gpu_memory_utilization, bool) \
            or not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {gpu_memory_utilization!r}")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp: must be a positive integer, got {tp!r}")
    if tp != layout.tp:
        raise ValueError(f"tp: {tp} differs from the layout's TP {layout.tp} (derive the layout with tp={tp})")
    if layout.model != model.name:
        raise ValueError(f"layout: derived for {layout.model!r}, not {model.name!r}")
    if num_gpus is None:
        num_gpus = tp
    if not isinstance(num_gpus, int) or isinstance(num_gpus, bool) or num_gpus < tp or num_gpus % tp:
        raise ValueError(f"num_gpus: must be a multiple of tp {tp}, got {num_gpus!r}")
    if not isinstance(activation_reserve_bytes, int) or activation_reserve_bytes < 0:
        raise ValueError(f"activation_reserve_bytes: must be a non-negative integer, got "
                         f"{activation_reserve_bytes!r}")
    pp = num_gpus // tp
    weights_total = model.weight_bytes + (model.mtp_weight_bytes if layout.uses_mtp else 0)
    weights = math.ceil(weights_total / num_gpus)
    usable = int(gpu.memory_bytes * gpu_memory_utilization)
    available = usable - weights - activation_reserve_bytes
    if kv_cache_memory_bytes is not None:
        if isinstance(kv_cache_memory_bytes, bool) or not isinstance(kv_cache_memory_bytes, int) \
                or kv_cache_memory_bytes < 1:
            raise ValueError(f"kv_cache_memory_bytes: must be a positive integer, got "
                             f"{kv_cache_memory_bytes!r}")
        room = gpu.memory_bytes - weights - activation_reserve_bytes
        if kv_cache_memory_bytes > room:
            raise ValueError(
                f"kv_cache_memory_bytes: {kv_cache_memory_bytes / GiB:.2f} GiB does not fit on "
                f"{gpu.name} beside weights {weights / GiB:.1f} GiB per GPU and reserve "
                f"{activation_reserve_bytes / GiB:.1f} GiB ({gpu.memory_bytes / GiB:.1f} GiB; "
                f"at most {max(room, 0):,} bytes)")
        usable, available = gpu.memory_bytes, kv_cache_memory_bytes
    if available <= 0:
        raise ValueError(
            f"{model.name} does not fit on {gpu.name}: weights {weights / GiB:.1f} GiB per GPU "
            f"(over {num_gpus} GPU(s)) + reserve {activation_reserve_bytes / GiB:.1f} GiB exceed "
            f"{gpu_memory_utilization:g} x {gpu.memory_bytes / GiB:.1f} GiB = {usable / GiB:.1f} GiB")
    slots = math.ceil(layout.group_size / pp)
    block = slots * layout.page_bytes
    n = available // block
    if n < 1:
        raise ValueError(f"{model.name} on {gpu.name}: {available / GiB:.2f} GiB left for the KV cache "
                         f"holds no block of {block / GiB:.2f} GiB")
    return KVBudget(usable_bytes=usable, weight_bytes=weights, reserve_bytes=activation_reserve_bytes,
                    available_bytes=available, layer_slots_per_block=slots, block_bytes=block, num_blocks=n)


def num_kv_blocks(gpu: GPUSpec, model: ModelSpec, layout: KVLayout, *, gpu_memory_utilization: float = 0.9,
                  tp: int = 1, num_gpus: int | None = None,
                  activation_reserve_bytes: int = DEFAULT_ACTIVATION_RESERVE_BYTES,
                  kv_cache_memory_bytes: int | None = None) -> int:
    """Blocks in vLLM's KV-cache pool on one GPU (``num_gpu_blocks``; block 0 is the null block).

    ::

        available  = floor(memory_bytes x gpu_memory_utilization)
                     - weight_bytes / num_gpus - activation_reserve_bytes
        block      = page_bytes x ceil(group_size / pp)          (pp = num_gpus / tp)
        num_blocks = available // block

    vLLM's hybrid allocator (0.33.0 ``kv_cache_planning``) gives every layer the same page
    (``layout.page_bytes`` = ``block_size`` tokens of one attention layer = one padded Mamba
    state) and splits the layers into KV-cache groups of ``group_size`` layer slots each
    (:func:`sim.models.layout.pool_groups`).  It allocates ``group_size`` tensors of ``num_blocks``
    pages; a block id indexes one page in each tensor, so one pool block costs ``group_size``
    pages and belongs to one group at a time -- an attention block holds ``block_size`` tokens
    for ``group_size`` attention layers, a Mamba block one state for ``group_size`` Mamba layers.
    All groups draw from this one pool.

    * ``layout`` must be derived with the same ``tp``; per-GPU page sizes already account for TP.
    * ``num_gpus`` (default ``tp``) is the number of GPUs the weights are spread over; a multiple of
      ``tp``.  The factor ``pp = num_gpus / tp`` is treated as pipeline stages, each holding ~1/pp of
      every group's layers (an approximation of vLLM's per-stage projection of the groups).
    * Weights are ``total_params x dtype bytes`` (estimated from shapes), plus the MTP module when
      the layout uses MTP, split evenly (replicated norms and routers ignored).

    * ``kv_cache_memory_bytes`` (vLLM's ``--kv-cache-memory-bytes``): ``available`` is this
      byte budget instead, ``gpu_memory_utilization`` is ignored (see :func:`kv_budget`).

    Raises ``ValueError`` (one line) when the weights and reserve do not fit, or no block fits.
    """
    return kv_budget(gpu, model, layout, gpu_memory_utilization=gpu_memory_utilization, tp=tp,
                     num_gpus=num_gpus, activation_reserve_bytes=activation_reserve_bytes,
                     kv_cache_memory_bytes=kv_cache_memory_bytes).num_blocks
