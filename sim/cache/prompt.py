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
