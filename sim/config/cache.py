"""The ``cache`` section of a scenario: which cache policy, vLLM 0.33.0's switches under
vLLM's names (``CacheSwitches``, shared by every policy), and the keys the chosen policy
adds of its own (its ``options`` dataclass, see ``sim/cache/policies``)."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass, field, fields
from typing import Any

from sim.cache.config import ALIASES
from sim.cache.policies import CACHE_POLICIES
from sim.cache.policies.base import CacheSwitches
from sim.errors import ConfigError
from sim.config.fields import build_section


@dataclass(frozen=True)
class CacheSection(CacheSwitches):
    """The ``cache`` section of a scenario (vLLM ``CacheConfig`` names)."""

    policy: str = "vllm"
    # the policy's own keys (an instance of its ``options`` dataclass), set by from_mapping
    options: Any = field(default=None, init=False, compare=False)

    @classmethod
    def from_mapping(cls, d: dict, prefix: str = "cache.") -> "CacheSection":
        d = dict(d) if isinstance(d, dict) else d
        name = d.get("policy", "vllm") if isinstance(d, dict) else "vllm"
        if not isinstance(name, str) or name not in CACHE_POLICIES:
            raise ConfigError(prefix + "policy", f"unknown policy {show(name)} (known: "
                              f"{', '.join(sorted(CACHE_POLICIES))})")
        opt_cls = CACHE_POLICIES[name].options
        own = {f.name for f in fields(opt_cls) if f.init}
        mine = {}
        if isinstance(d, dict):
            for k in list(d):
                if k in own:
                    mine[k] = d.pop(k)
        sec = build_section(cls, d, prefix, ALIASES)
        for b in ("enable_mamba_shared_prefix_checkpoint", "disable_lookahead_block_hashes"):
            if not isinstance(getattr(sec, b), bool):
                raise ConfigError(prefix + b, f"must be true or false, got {show(getattr(sec, b))}")
        options = build_section(opt_cls, mine, prefix)
        validate = getattr(options, "validate", None)
        if validate is not None:
            validate(prefix)
        object.__setattr__(sec, "options", options)
        return sec
