"""Prompt notation: ``"S:24 P:16"`` = the first 24 tokens of stream S, then the
first 16 of stream P.  Distinct stream names never share a token; a literal
list of integer token ids is also accepted."""
from __future__ import annotations

import re

from sim.cache.hashing import LITERAL, Run

_SEG = re.compile(r"^([A-Za-z_][A-Za-z0-9_.\-]*)(?:@(\d+))?:(\d+)$")


class StreamRegistry:
    """Maps stream names to small integer ids, in order of first use."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def id(self, name: str) -> int:
        sid = self.ids.get(name)
        if sid is None:
            sid = self.ids[name] = len(self.ids) + 1
        return sid

    def runs_of(self, segments: list[tuple[str, int, int]]) -> list[Run]:
        """The runs of a prompt given as ``(stream name, offset, length)`` segments."""
        return [(self.id(name), off, n) for name, off, n in segments]


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


def hash_id_segments(ids: object, n_in: int, block: int, names: dict[int, str],
                     rid: str) -> list[tuple[str, int, int]] | None:
    """The segments of a prompt of ``n_in`` tokens over ``block``-token hash ids
    (a Mooncake trace record, read by ``workloads.traces``; here to be compiled):
    ``("mc/<id>", 0, block)`` per id, the last one cut to ``n_in``, and a private
    ``("mcu/<rid>", 0, rest)`` when the ids cover fewer than ``n_in`` tokens.
    ``names`` keeps one string per hash id (later records reuse it and its cached
    hash).  None when ``ids`` is not a list of integers >= 0 (bools and floats
    included: JSON integers decode as int exactly)."""
    if not isinstance(ids, list):
        return None
    for h in ids:
        if type(h) is not int or h < 0:
            return None
    full = n_in // block
    part = n_in - full * block
    take = full + 1 if part else full
    segs: list[tuple[str, int, int]] = []
    covered = 0
    for i, h in enumerate(ids):
        if i >= take:
            break
        name = names.get(h)
        if name is None:
            name = names[h] = f"mc/{h}"
        n = part if i == full else block
        segs.append((name, 0, n))
        covered += n
    if covered < n_in:
        segs.append((f"mcu/{rid}", 0, n_in - covered))
    return segs
