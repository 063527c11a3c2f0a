"""What a cache policy is given and what it returns.

A policy turns vLLM's cache switches (``CacheSwitches``, the ``cache:`` keys every
policy shares), its own options (a frozen dataclass of the keys it adds under
``cache:``) and the pool the deployment provisions (``PoolShape``, plain data from
the assembly layer) into a ``KVCacheManager``.  The scheduler and the engine only
ever talk to that manager, so a policy is free in how it builds one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from sim.cache.kv_manager import KVCacheManager


@dataclass(frozen=True)
class CacheSwitches:
    """vLLM 0.33.0's prefix-cache switches, under vLLM's names (``CacheConfig``)."""

    hash_block_size: int | None = None
    enable_mamba_shared_prefix_checkpoint: bool = False
    prefix_cache_retention_interval: int | None = 0     # vllm serve's default
    prompt_checkpoint: str = "v0.33"
    disable_lookahead_block_hashes: bool = False
    kv_connector: str | None = None


@dataclass(frozen=True)
class PoolShape:
    """The provisioned pool and what the model and drafter need from it."""

    groups: tuple[str, ...]                 # KV-cache groups in layout order: full | mamba | swa:W
    block_size: int                         # attention (and align-mode Mamba) block, tokens
    num_blocks: int                         # pool blocks, null block included
    max_model_len: int | None = None        # None: no limit
    uses_eagle: bool = False                # an EAGLE-family drafter (EAGLE, MTP)
    num_speculative_tokens: int = 0
    num_prefill_lookahead: int = 0          # drafter runway at a chunk boundary
    # internal prefill checkpoints of every Mamba group (blocks, alignment)
    prefill_checkpoints: tuple[int, int] = (0, 1)
    # the groups holding the drafter's layers (vLLM's is_eagle_group), in pool order;
    # () = every attention group when the drafter is EAGLE-family
    eagle_groups: tuple[int, ...] = ()
    # what the pool's memory and a prefill cost, as plain numbers from the model (read by
    # the FLOP-aware eviction of ``cache.policy: marconi``): bytes of one pool block, and
    # (KV bytes per token, Mamba state bytes per sequence, prefill FLOPs per token, extra
    # prefill FLOPs per context token: ``sim.marconi.CostModel``'s fields); None: unknown
    block_bytes: int = 0
    costs: tuple[int, int, float, float] | None = None


@dataclass(frozen=True)
class NoOptions:
    """A policy that adds no keys of its own under ``cache:``."""


class CachePolicy(Protocol):
    """One cache policy: a name, its own ``cache:`` keys, and how it builds a manager."""

    name: str
    options: type[Any]          # frozen dataclass of the policy's own keys (defaults for all)

    def build(self, switches: CacheSwitches, options: Any, shape: PoolShape) -> KVCacheManager:
        ...
