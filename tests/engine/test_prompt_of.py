"""A block-hash trace's prompt: the workload yields plain id data (``workloads.base.HashIds``),
which reads as the segments it stands for, and the engine builds the cache's prompt type
from it (``sim.engine.record.prompt_of``) whose keys are those of that list."""
from __future__ import annotations

import random

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.hashing import PrefixHasher
from sim.cache.prompt import HashIdPrompt, StreamRegistry
from sim.engine.record import prompt_of
from workloads.base import HashIds


def test_a_hash_id_record_reads_as_its_segments_and_keys_as_them():
    """The record is the list of segments it stands for (the ids used, the last cut to
    the prompt, then a private tail), and the engine's prompt built from it keys as that
    list does (the cache's layout of the ids and the record's agree)."""
    rng = random.Random(23)
    for _ in range(300):
        block = rng.choice([16, 64, 512])
        ids = [rng.choice([0, 1, 5, 7, 300, 2**40]) for _ in range(rng.randint(0, 9))]
        n_in = rng.randint(1, 12 * block)
        p = HashIds(vec[i64](ids), n_in, block, "mcu/r0000007")
        full, part = divmod(n_in, block)
        want = [(h, 0, block) for h in ids[:full]]
        if part and len(ids) > full:
            want.append((ids[full], 0, part))
        covered = sum(n for _, _, n in want)
        if covered < n_in:
            want.append(("mcu/r0000007", 0, n_in - covered))
        assert p == want and want == p and list(p) == want and len(p) == len(want)
        assert [p[i] for i in range(-len(want), len(want))] == want + want
        assert p[1:3] == want[1:3] and p[::-1] == want[::-1]
        assert sum(n for _, _, n in p) == n_in
        with pytest.raises(IndexError):
            p[len(want)]
        q = prompt_of(p)
        assert isinstance(q, HashIdPrompt)
        assert (q.used, q.last, q.tail) == p.layout()
        unit, la = rng.choice([1, 16, 64]), rng.choice([0, 3])
        reg_a, reg_b = StreamRegistry(), StreamRegistry()
        a = reg_a.keys_of(q, PrefixHasher(unit, la))
        b = reg_b.keys_of(want, PrefixHasher(unit, la))
        assert a.runs == b.runs and a.keys() == b.keys() and a.total == b.total
        assert reg_a.ids == reg_b.ids
    assert HashIds(vec[i64]([1]), 8, 16, "t") != [(1, 0, 16)]
    with pytest.raises(TypeError):
        hash(HashIds(vec[i64]([1]), 8, 16, "t"))


def test_a_list_of_segments_is_the_prompt_as_it_is():
    segs = [("S", 0, 24), (3, 0, 16)]
    assert prompt_of(segs) is segs


def test_the_workloads_limit_is_the_caches():
    """workloads.base.MAX_COUNT (the workloads import nothing of the cache) is the
    cache's NO_LENGTH_LIMIT."""
    from sim.cache.config import NO_LENGTH_LIMIT
    from workloads.base import MAX_COUNT

    assert MAX_COUNT == NO_LENGTH_LIMIT


def test_the_workloads_import_nothing_of_the_cache():
    """Workloads yield plain data; the engine builds the cache's types from it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bad = []
    for path in sorted((root / "workloads").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [(path.name, n) for n in names if n == "sim.cache" or n.startswith("sim.cache.")]
    assert bad == []
