"""The ``kv_offloading`` section of a scenario: vLLM 0.33.0's native CPU tier.

``size_gb`` is ``vllm serve --kv-offloading-size`` (GiB of host memory for the replica,
the total over its GPUs: vLLM splits it over the ranks, each keeping its shard of every
chunk); 0 or an absent section turns the tier off, and the run is then exactly what it
was without one.  The other fields are ``--kv-transfer-config``'s
``kv_connector_extra_config``: ``eviction_policy`` (``lru`` | ``arc``), ``block_size``
(tokens per offloaded chunk: a multiple of the one block size every group has) or
``blocks_per_chunk`` (GPU blocks per chunk; not both), ``offload_prompt_only`` (vLLM's
default: only prompt chunks are stored).

A chunk holds one KV-cache group's ``blocks_per_chunk`` GPU blocks (a Mamba state takes a
whole chunk), so the tier holds ``floor(size_gb * 2**30 / round_up(bytes of one pool block
per GPU * GPUs * blocks_per_chunk, 4096))`` chunks (vLLM's ``CPUOffloadingSpec``).

``load_bandwidth_gb_s`` / ``store_bandwidth_gb_s`` (GB/s, 1e9 bytes a second, each GPU's
own host link, one direction each: loads host -> GPU, stores GPU -> host) time the
transfers in ``sim run``.  Default 50: a PCIe 5.0 x16 link carries 32 GT/s x 16 lanes x
128/130 = 63 GB/s each way before packet overhead, and pinned host <-> device copies
reach about 80 % of that (the figure CUDA's ``bandwidthTest`` reports on Gen5 hosts);
set what your hosts measure.  Step cases (``sim steps``) time transfers in steps instead
(``transfer_steps``), as the offload oracle does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.errors import ConfigError
from sim.config.fields import build_section, check_int, check_num, show

GIB = 1 << 30
PAGE = 4096          # the host page a chunk is rounded up to (mmap.PAGESIZE on x86-64)


@dataclass(frozen=True)
class KVOffloadingSection:
    size_gb: float = 0.0
    eviction_policy: str = "lru"
    block_size: int | None = None
    blocks_per_chunk: int | None = None
    offload_prompt_only: bool = True
    load_bandwidth_gb_s: float = 50.0
    store_bandwidth_gb_s: float = 50.0

    @property
    def enabled(self) -> bool:
        return self.size_gb > 0

    @property
    def size_bytes(self) -> int:
        return int(self.size_gb * GIB)

    @classmethod
    def from_value(cls, value: Any, prefix: str = "kv_offloading.") -> "KVOffloadingSection":
        if value is None:
            return cls()
        if not isinstance(value, dict):
            raise ConfigError(prefix.rstrip("."), f"expected a mapping of fields, got "
                              f"{show(value)}")
        sec = build_section(cls, value, prefix)
        sec.validate(prefix)
        return sec

    def validate(self, p: str = "kv_offloading.") -> None:
        check_num(p, "size_gb", self.size_gb, 0.0)
        if self.eviction_policy not in ("lru", "arc"):
            raise ConfigError(p + "eviction_policy",
                              f"must be lru or arc, got {show(self.eviction_policy)}")
        check_int(p, "block_size", self.block_size, 1, allow_none=True)
        check_int(p, "blocks_per_chunk", self.blocks_per_chunk, 1, allow_none=True)
        if self.block_size is not None and self.blocks_per_chunk is not None:
            raise ConfigError(p + "block_size", "set block_size or blocks_per_chunk, not both "
                              "(vLLM refuses both)")
        if not isinstance(self.offload_prompt_only, bool):
            raise ConfigError(p + "offload_prompt_only",
                              f"must be true or false, got {show(self.offload_prompt_only)}")
        for name in ("load_bandwidth_gb_s", "store_bandwidth_gb_s"):
            check_num(p, name, getattr(self, name), 0.0)
            if getattr(self, name) <= 0:
                raise ConfigError(p + name, f"must be a number > 0 (GB/s), got "
                                  f"{getattr(self, name)!r}")

    def chunk_blocks(self, block_sizes: list[int], p: str = "kv_offloading.") -> int:
        """GPU blocks per chunk for groups of these block sizes (vLLM's
        ``build_offloading_config``)."""
        if self.block_size is None:
            return self.blocks_per_chunk or 1
        sizes = set(block_sizes)
        if len(sizes) != 1:
            raise ConfigError(p + "block_size", f"needs one block size in every KV-cache group "
                              f"(here {sorted(sizes)}); use blocks_per_chunk")
        b = sizes.pop()
        if self.block_size % b:
            raise ConfigError(p + "block_size", f"{self.block_size} is not a multiple of the "
                              f"GPU block size {b}")
        return self.block_size // b

    def num_chunks(self, block_bytes: int, num_gpus: int, bpc: int) -> tuple[int, int]:
        """(host chunks, bytes of one chunk over all GPUs)."""
        chunk = -(-block_bytes * num_gpus * bpc // PAGE) * PAGE
        return self.size_bytes // chunk, chunk
