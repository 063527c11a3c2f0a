"""What one setting would have changed for one request: re-evaluated, not guessed.

Each what-if flips one of vLLM's three prefix-cache switches that decide where Mamba
states exist (the junction flag, the retention interval, the hash unit) and replays the
run or case with only that change, up to and including the request's lookup
(``replay.run_lookup`` / ``replay.case_lookup``): the hit reported is the hit that request
gets in that replay, so it is what a full run with the flag flipped reports for it.

The values tried: the junction flag flipped; retention dense (``null``) when it is sparse
(0 or N), else 0 (``vllm serve``'s default); the hash unit the scheduler block (no partial
hits) when it is finer, else half the block.  ``hash_unit`` / ``retention`` choose others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sim.errors import InputError

#: (name, the vLLM / scenario ``cache:`` field, the case-file ``CacheConfig`` field)
SETTINGS = (
    ("junction_flag", "enable_mamba_shared_prefix_checkpoint", "shared_prefix_checkpoint"),
    ("retention", "prefix_cache_retention_interval", "prefix_cache_retention_interval"),
    ("hash_unit", "hash_block_size", "hash_block_size"),
)


@dataclass
class WhatIf:
    """One re-evaluated setting: ``hit`` the request's hit with ``setting`` at ``value``
    (None with a ``note`` saying why: an invalid value, a request refused, vLLM raising)."""

    name: str
    setting: str
    was: object
    value: object
    hit: int | None = None
    note: str | None = None


def alternatives(settings: dict, hash_unit: int | None = None,
                 retention: int | None | str = "auto") -> list[tuple[str, str, str, object, object]]:
    """(name, setting, case field, current value, value to try) for each what-if."""
    out = []
    for name, setting, case_field in SETTINGS:
        was = settings[setting]
        if name == "junction_flag":
            value: object = not was
        elif name == "retention":
            value = retention if retention != "auto" else (None if was is not None else 0)
        else:
            block = settings["scheduler_block_size"]
            if hash_unit is not None:
                value = hash_unit
            elif was < block:
                value = block
            else:
                value = block // 2 if block % 2 == 0 else None
        out.append((name, setting, case_field, was, value))
    return out


def evaluate(settings: dict, lookup: Callable[[str, str, object], tuple[int | None, str | None]],
             hash_unit: int | None = None, retention: int | None | str = "auto") -> list[WhatIf]:
    """Each what-if re-evaluated: ``lookup(setting, case_field, value)`` replays with that
    one change and returns (hit, note)."""
    out = []
    for name, setting, case_field, was, value in alternatives(settings, hash_unit, retention):
        w = WhatIf(name, setting, was, value)
        if name == "hash_unit" and value is None:
            w.note = "no other hash unit divides the block"
        elif value == was:
            w.hit, w.note = None, "the same value as the run"
        else:
            try:
                w.hit, w.note = lookup(setting, case_field, value)
            except InputError as e:          # the value is not valid for this layout
                w.note = str(e)
        out.append(w)
    return out
