"""``cache.policy: none``: prefix caching off, as ``vllm serve --no-enable-prefix-caching``
runs a hybrid model (vLLM 0.33.0): the baseline of every Pareto.

What vLLM does then, and so does this policy:

* ``KVCacheManager(enable_caching=False)`` builds ``KVCacheCoordinatorNoPrefixCache``:
  every lookup misses (hit 0, no junction), ``cache_blocks`` does nothing, and the
  requests' blocks carry no hash, so a freed block is simply free again.
* ``MambaModelConfig.verify_and_update_config`` turns ``mamba_cache_mode`` to ``none``
  and sizes the Mamba block at ``max_model_len``: a request holds its running state
  and one block per speculative token (``1 + K``, vLLM's ``max_memory_usage_bytes``
  for the mode), from its first allocation to its finish (``MambaManager``).
* The scheduler does not split prefill chunks on the Mamba block grid
  (``need_mamba_block_aligned_split`` is for align mode only), and no internal
  prefill checkpoint blocks are reserved (align mode only too).
* The attention block size is derived for mode ``none`` (``derive_layout``): the
  internal-checkpoint grid no longer widens it (GDN on FlashInfer).
* Block hashes are not needed, so the hash unit is the scheduler block and no
  lookahead is hashed; none of the prefix-cache switches under ``cache:`` apply.
"""
from __future__ import annotations

from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies.base import CacheSwitches, NoOptions, PoolShape


class NoCachePolicy:
    """Prefix caching off: no hit, nothing cached, Mamba in mode ``none``."""

    name = "none"
    options = NoOptions
    mamba_cache_mode = "none"    # the layout derivation's mode (``build_deployment``)

    def cache_config(self, shape: PoolShape) -> CacheConfig:
        """The manager vLLM builds with prefix caching off: Mamba groups in mode
        ``none``, one speculative state block per draft token (as the ``vllm`` policy
        counts them), no hashing switches."""
        return CacheConfig(
            groups=shape.groups, block_size=shape.block_size, mamba_cache_mode="none",
            num_blocks=shape.num_blocks,
            # every speculative method (vLLM: MambaSpec.num_speculative_blocks = k)
            mamba_num_speculative_blocks=shape.num_speculative_tokens,
            max_model_len=(shape.max_model_len if shape.max_model_len is not None
                           else NO_LENGTH_LIMIT))

    def build(self, switches: CacheSwitches, options: NoOptions,
              shape: PoolShape) -> KVCacheManager:
        return KVCacheManager(self.cache_config(shape), enable_caching=False)
