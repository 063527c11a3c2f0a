"""Cache policies, selectable by name from a scenario's ``cache.policy``.

Adding one is one new file in this folder (a class with ``name``, ``options`` and
``build``; see ``base.CachePolicy``) plus one line in ``CACHE_POLICIES`` (its
``"module:Class"``, imported when a scenario names it).  New vLLM
behaviour arrives as a switch on ``vllm``, named as vLLM names it.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

from sim.cache.policies.base import CachePolicy, CacheSwitches, NoOptions, PoolShape
from sim.cache.policies.vllm import VllmPolicy


class PolicyRegistry(MutableMapping):
    """Policy name -> policy.  A policy registered as ``"module:Class"`` is imported and
    made on first use: a run imports its own policy's module only (``marconi``'s
    brings numpy and the Marconi replay core, ~60 ms of ``sim run``'s start)."""

    def __init__(self, entries: dict[str, CachePolicy | str]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> CachePolicy:
        got = self._entries[name]
        if isinstance(got, str):
            module, _, cls = got.partition(":")
            got = self._entries[name] = getattr(importlib.import_module(module), cls)()
        return got

    def __setitem__(self, name: str, policy: CachePolicy | str) -> None:
        self._entries[name] = policy

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


CACHE_POLICIES: PolicyRegistry = PolicyRegistry({
    "vllm": VllmPolicy(),
    "none": "sim.cache.policies.none:NoCachePolicy",
    "ideal": "sim.cache.policies.ideal:IdealPolicy",
    "marconi": "sim.cache.policies.marconi:MarconiPolicy",
})


def get_policy(name: str) -> CachePolicy:
    """The policy registered as ``name`` (``KeyError`` when none is)."""
    return CACHE_POLICIES[name]


__all__ = ["CACHE_POLICIES", "CachePolicy", "CacheSwitches", "NoOptions", "PoolShape",
           "PolicyRegistry", "VllmPolicy", "get_policy"]
