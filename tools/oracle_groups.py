#!/usr/bin/env python3
"""The vLLM oracle with per-group block sizes and per-group EAGLE flags (run in its venv).

``oracle.py`` (``$VLLM_ORACLE_DIR``) builds every attention group with one ``block`` and flags
no group as an EAGLE group.  vLLM 0.33.0 itself builds each ``KVCacheGroupSpec`` with its own
spec (a full-attention group of 32 beside a sliding-window group of 8) and flags the groups
holding the drafter's layers (``KVCacheGroupSpec.is_eagle_group``; the coordinator falls back to
every group only when none is flagged).  This wrapper keeps ``oracle.py`` as it is and adds two
case keys on top of its own:

* ``layout`` entries ``kind@B`` (``full@32``, ``swa:64@8``): that group's spec gets block size B;
* ``eagle_groups``: a list of group indices whose ``is_eagle_group`` is set.

It calls ``oracle.py``'s ``make_config`` with those stripped, then replaces the affected specs'
``block_size`` / the groups' flag with ``dataclasses.replace`` (vLLM's own dataclasses; nothing
of vLLM is copied), so every other rule stays the oracle's.  Usage, with the oracle's python::

    $PY tools/oracle_groups.py [--oracle-dir DIR] --file cases.json > answers.json

Its answers for ``tests/golden/cases/groups/oracle_cases.json`` are kept in
``tests/golden/cases/groups/oracle.out.json``; ``tools/make_goldens.py`` turns them into goldens.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def _default_dir() -> str:
    """The one oracle locator (``sim/oracle/worker.py``; stdlib only, so it imports in the
    oracle's own venv with the project on ``sys.path``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sim.oracle.worker import default_oracle_dir

    return str(default_oracle_dir())


def patch(oracle) -> None:
    """Wrap ``oracle.make_config`` with the two keys above."""
    original = oracle.make_config

    def make_config(case: dict):
        layout = list(case.get("layout", ["full", "mamba"]))
        blocks = [int(k.partition("@")[2]) if "@" in k else None for k in layout]
        plain = dict(case, layout=[k.partition("@")[0] for k in layout])
        plain.pop("eagle_groups", None)
        cfg = original(plain)
        flagged = set(case.get("eagle_groups", ()))
        groups = []
        for i, g in enumerate(cfg.kv_cache_groups):
            spec = g.kv_cache_spec
            if blocks[i] is not None:
                spec = dataclasses.replace(spec, block_size=blocks[i])
            groups.append(dataclasses.replace(g, kv_cache_spec=spec,
                                              is_eagle_group=i in flagged))
        cfg.kv_cache_groups = groups
        return cfg

    oracle.make_config = make_config

    # A layout with one group (``["swa:64"]``, ``["full"]``): vLLM builds a
    # ``UnitaryKVCacheCoordinator``, which keeps ``hash_block_size`` only in its block pool (it
    # asserts it equals the group's block size) and has no per-group probe.  ``oracle.py`` reads
    # ``coordinator.hash_block_size`` and calls ``find_longest_cache_hit_per_group``, which only
    # the hybrid coordinator has, so every one-group case died with AttributeError.  That is the
    # driver, not vLLM: no vLLM code reads either name on a unitary coordinator.  Give the
    # driver both on the instance -- the pool's own value, and the one group's lookup (its
    # ``find_longest_cache_hit``) as the one-entry per-group answer.
    original_manager = oracle.make_manager

    def make_manager(case: dict, cfg):
        manager = original_manager(case, cfg)
        coord = manager.coordinator
        if len(cfg.kv_cache_groups) == 1 and not hasattr(coord, "hash_block_size"):
            coord.hash_block_size = manager.block_pool.hash_block_size

            def per_group(block_hashes, max_length):
                blocks, hit, _ = coord.find_longest_cache_hit(block_hashes, max_length)
                return blocks, [hit]

            coord.find_longest_cache_hit_per_group = per_group
        return manager

    oracle.make_manager = make_manager


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--oracle-dir", default=_default_dir())
    ap.add_argument("--file", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.oracle_dir)
    out = sys.stdout
    sys.stdout = sys.stderr   # whatever vLLM prints while importing stays out of the answer
    import oracle  # noqa: E402  (the oracle's own module, in its own venv)

    patch(oracle)
    cases = json.loads(Path(args.file).read_text())
    answers = [oracle.run_case(c) for c in cases]
    out.write(json.dumps(answers, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
