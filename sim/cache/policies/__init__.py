"""Cache policies, selectable by name from a scenario's ``cache.policy``.

Adding one is one new file in this folder (a class with ``name``, ``options`` and
``build``; see ``base.CachePolicy``) plus one line in ``CACHE_POLICIES``.  New vLLM
behaviour arrives as a switch on ``vllm``, named as vLLM names it.
"""
from __future__ import annotations

from sim.cache.policies.base import CachePolicy, CacheSwitches, NoOptions, PoolShape
from sim.cache.policies.ideal import IdealPolicy
from sim.cache.policies.marconi import MarconiPolicy
from sim.cache.policies.none import NoCachePolicy
from sim.cache.policies.vllm import VllmPolicy

CACHE_POLICIES: dict[str, CachePolicy] = {
    "vllm": VllmPolicy(),
    "none": NoCachePolicy(),
    "ideal": IdealPolicy(),
    "marconi": MarconiPolicy(),
}


def get_policy(name: str) -> CachePolicy:
    """The policy registered as ``name`` (``KeyError`` when none is)."""
    return CACHE_POLICIES[name]


__all__ = ["CACHE_POLICIES", "CachePolicy", "CacheSwitches", "NoOptions", "PoolShape",
           "VllmPolicy", "get_policy"]
