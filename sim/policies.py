"""Cache-manager policies, selectable by name from a scenario's ``cache.policy``.

A policy turns the scenario's ``cache`` section (plus the model's KV layout and
the speculative config) into a ``KVCacheManager``.  ``vllm`` is stock vLLM
0.33.0 with its switches named as vLLM names them; later policies (retention
variants, Marconi-style admission, an ideal cache) register here by name.
"""
from __future__ import annotations

from typing import Protocol

from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.config.cache import CacheSection
from sim.config.errors import ConfigError
from sim.config.speculative import SpecDecode


class CachePolicy(Protocol):
    name: str

    def build(self, cache: CacheSection, groups: tuple[str, ...], block_size: int,
              num_blocks: int, spec: SpecDecode,
              max_model_len: int | None = None) -> KVCacheManager: ...


class VllmPolicy:
    """Stock vLLM 0.33.0 (``--mamba-cache-mode align``)."""

    name = "vllm"

    def cache_config(self, cache: CacheSection, groups: tuple[str, ...], block_size: int,
                     num_blocks: int, spec: SpecDecode,
                     max_model_len: int | None = None) -> CacheConfig:
        lookahead = spec.num_prefill_lookahead
        if cache.disable_lookahead_block_hashes or cache.kv_connector:
            lookahead = 0
        try:
            return CacheConfig(
                groups=groups, block_size=block_size, hash_block_size=cache.hash_block_size,
                eagle=spec.uses_eagle,
                shared_prefix_checkpoint=cache.enable_mamba_shared_prefix_checkpoint,
                prompt_checkpoint=cache.prompt_checkpoint, num_blocks=num_blocks,
                prefix_cache_retention_interval=cache.prefix_cache_retention_interval,
                num_hash_lookahead_tokens=lookahead,
                num_prefill_lookahead=spec.num_prefill_lookahead, eagle_groups="attention",
                mamba_num_speculative_blocks=spec.num_speculative_tokens if spec.uses_eagle else 0,
                max_model_len=max_model_len if max_model_len is not None else NO_LENGTH_LIMIT)
        except ConfigError as e:
            field = {"shared_prefix_checkpoint": "enable_mamba_shared_prefix_checkpoint"
                     }.get(e.field_name, e.field_name)
            raise ConfigError("cache." + field, str(e).split(": ", 1)[1]) from None

    def build(self, cache, groups, block_size, num_blocks, spec,
              max_model_len: int | None = None) -> KVCacheManager:
        return KVCacheManager(self.cache_config(cache, groups, block_size, num_blocks, spec,
                                                max_model_len))


POLICIES: dict[str, CachePolicy] = {"vllm": VllmPolicy()}


def get_policy(name: str) -> CachePolicy:
    return POLICIES[name]
