"""The ``cache`` section of a scenario: which cache policy, and its switches under
vLLM 0.33.0's names (``CacheConfig``)."""
from __future__ import annotations

from dataclasses import dataclass

from sim.cache.config import ALIASES
from sim.config.errors import ConfigError
from sim.config.fields import build_section


@dataclass(frozen=True)
class CacheSection:
    """The ``cache`` section of a scenario (vLLM ``CacheConfig`` names)."""

    policy: str = "vllm"
    hash_block_size: int | None = None
    enable_mamba_shared_prefix_checkpoint: bool = False
    prefix_cache_retention_interval: int | None = 0     # vllm serve's default
    prompt_checkpoint: str = "v0.33"
    disable_lookahead_block_hashes: bool = False
    kv_connector: str | None = None

    @classmethod
    def from_mapping(cls, d: dict, prefix: str = "cache.") -> "CacheSection":
        from sim.policies import POLICIES

        sec = build_section(cls, d, prefix, ALIASES)
        for b in ("enable_mamba_shared_prefix_checkpoint", "disable_lookahead_block_hashes"):
            if not isinstance(getattr(sec, b), bool):
                raise ConfigError(prefix + b, f"must be true or false, got {getattr(sec, b)!r}")
        if sec.policy not in POLICIES:
            raise ConfigError(prefix + "policy",
                              f"unknown policy {sec.policy!r} (known: {', '.join(sorted(POLICIES))})")
        return sec
