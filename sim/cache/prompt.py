"""Prompt notation: ``"S:24 P:16"`` = the first 24 tokens of stream S, then the
first 16 of stream P.  Distinct stream names never share a token; a literal
list of integer token ids is also accepted."""
from __future__ import annotations

import re
from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.hashing import LITERAL, PrefixHasher, PrefixKeys, Run

HASH_ID_BASE: Final = -2   # stream id of hash id h: HASH_ID_BASE - h (see StreamRegistry.runs_of)

_SEG = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)(?:@(\d+))?:(\d+)$")

Segment = tuple["str | int", int, int]   # (stream name, or a hash id; offset; length)


class HashIdPrompt:
    """A block-hash trace record's prompt (Mooncake: ``hash_ids``, ``input_length``) in
    the form its keys are built from: the record's ids, not a tuple per id.  The engine
    builds it from a workload's id record (``sim.engine.record.prompt_of``; the record
    defines the segments: ``workloads.base.HashIds``).

    It stands for the segments ``(h, 0, block)`` for each id ``h`` used (the stream
    ``mc/<h>``, named by its integer), the last one cut to the prompt's length, then
    ``(tail_name, 0, tail)`` when the ids cover fewer tokens than the prompt; the
    engine builds the prompt's keys straight from the ids (``StreamRegistry.keys_of``):
    a tuple per id, built and dropped per request, was ~4 k CPU instructions of a
    Mooncake request's ~270 k.  ``ids`` must hold ints ``>= 0`` (the reader checks:
    ``workloads.trace_records``), as machine integers (no int object per id: the reader
    writes them there, ``sim.engine.codecs.layout_record``)."""

    def __init__(self, ids: vec[i64], n_in: int, block: int, tail_name: str) -> None:
        full = n_in // block
        part = n_in - full * block
        k = full + 1 if part else full          # segments of the ids
        if k > len(ids):
            k = len(ids)
        covered = block * k
        if k == full + 1:                       # (the last id's segment is cut)
            covered = covered - block + part
        self.ids = ids
        self.used = k
        self.block = block
        self.last = block if k <= full else part   # the length of the last id's segment
        self.tail_name = tail_name
        self.tail = n_in - covered               # tokens past the ids (0: none)


class StreamRegistry:
    """Maps stream names to small integer ids, in order of first use."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, name: str) -> int:
        sid = self.ids.get(name)
        if sid is None:
            sid = self.ids[name] = len(self.ids) + 1
        return sid

    def runs_of(self, segments: list[Segment]) -> list[Run]:
        """The runs of a prompt given as ``(stream name, offset, length)`` segments.

        An integer name ``h >= 0`` (a block-hash trace's hash id, the stream
        ``mc/<h>``) maps to the stream id ``-2 - h``: no registry entry, and no
        clash with registered ids (>= 1) or ``LITERAL`` (-1)."""
        out: list[Run] = []
        for name, off, n in segments:
            if isinstance(name, str):
                out.append((self.id(name), off, n))
            else:
                out.append((HASH_ID_BASE - name, off, n))
        return out


    def keys_of(self, segments: list[Segment] | HashIdPrompt,
                hasher: PrefixHasher) -> PrefixKeys:
        """``hasher.keys_of(self.runs_of(segments))`` without the intermediate
        run tuples (the engine builds every request's keys this way); a
        ``HashIdPrompt`` is read from its ids."""
        keys = hasher.keys_of([])
        if isinstance(segments, HashIdPrompt):
            # (the ids straight into the key columns: no column of runs built first)
            keys.extend_ids(HASH_ID_BASE, segments.ids, segments.used, segments.block,
                            segments.last)
            if segments.tail > 0:
                keys.append_run(self.id(segments.tail_name), 0, segments.tail)
            return keys
        cap = len(segments)
        streams = vec[i64](capacity=cap)
        starts = vec[i64](capacity=cap)
        lengths = vec[i64](capacity=cap)
        for name, off, n in segments:
            # (a name is registered even for an empty segment, as runs_of does)
            streams = append(streams, self.id(name) if isinstance(name, str)
                             else HASH_ID_BASE - name)
            starts = append(starts, off)
            lengths = append(lengths, n)
        keys.extend_columns(streams, starts, lengths)
        return keys


def parse_prompt(spec, streams: StreamRegistry) -> list[Run]:
    """Runs of a prompt given as ``"NAME:LEN ..."`` (``NAME@OFF:LEN`` starts at
    an offset) or as a list of integer token ids.  Raises ``ValueError``."""
    if isinstance(spec, list):
        if not spec:
            raise ValueError("empty token list")
        runs: list[Run] = []
        for t in spec:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"token ids must be non-negative integers, got {t!r}")
            runs.append((LITERAL, t, 1))
        return runs
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"expected 'NAME:LEN ...' or a list of token ids, got {spec!r}")
    runs = []
    for part in spec.split():
        m = _SEG.match(part)
        if not m:
            raise ValueError(f"bad segment {part!r} (want NAME:LEN, e.g. S:24)")
        name, off, length = m.group(1), int(m.group(2) or 0), int(m.group(3))
        if length <= 0:
            raise ValueError(f"segment {part!r} has no tokens")
        runs.append((streams.id(name), off, length))
    return runs

