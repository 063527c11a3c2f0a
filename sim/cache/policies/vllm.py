"""``cache.policy: vllm`` (the default): stock vLLM 0.33.0 with ``--mamba-cache-mode align``.

Every vLLM switch is a key under ``cache:`` named as vLLM names it
(``CacheSwitches``); the exact rules live in ``sim/cache`` itself.
"""
from __future__ import annotations

from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies.base import CacheSwitches, NoOptions, PoolShape
from sim.errors import ConfigError


class VllmPolicy:
    """Stock vLLM 0.33.0: its LRU free queue evicts, every computed state it keeps is
    kept (align grid, retention, prompt and junction checkpoints)."""

    name = "vllm"
    options = NoOptions

    def cache_config(self, switches: CacheSwitches, shape: PoolShape) -> CacheConfig:
        lookahead = shape.num_prefill_lookahead
        if switches.disable_lookahead_block_hashes or switches.kv_connector:
            lookahead = 0
        try:
            return CacheConfig(
                groups=shape.groups, block_size=shape.block_size,
                hash_block_size=switches.hash_block_size, eagle=shape.uses_eagle,
                shared_prefix_checkpoint=switches.enable_mamba_shared_prefix_checkpoint,
                prompt_checkpoint=switches.prompt_checkpoint, num_blocks=shape.num_blocks,
                prefix_cache_retention_interval=switches.prefix_cache_retention_interval,
                num_hash_lookahead_tokens=lookahead,
                num_prefill_lookahead=shape.num_prefill_lookahead,
                eagle_groups=shape.eagle_groups if shape.eagle_groups else "attention",
                # every speculative method (vLLM: MambaSpec.num_speculative_blocks = k)
                mamba_num_speculative_blocks=shape.num_speculative_tokens,
                num_prefill_checkpoint_blocks=shape.prefill_checkpoints[0],
                prefill_checkpoint_alignment=shape.prefill_checkpoints[1],
                max_model_len=(shape.max_model_len if shape.max_model_len is not None
                               else NO_LENGTH_LIMIT))
        except ConfigError as e:
            field = {"shared_prefix_checkpoint": "enable_mamba_shared_prefix_checkpoint"
                     }.get(e.field_name, e.field_name)
            raise ConfigError("cache." + field, e.reason) from None

    def build(self, switches: CacheSwitches, options: NoOptions,
              shape: PoolShape) -> KVCacheManager:
        return KVCacheManager(self.cache_config(switches, shape))
