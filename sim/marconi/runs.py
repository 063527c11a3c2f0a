"""Token sequences as runs, and the requests a replay serves.

A token is ``(stream, position)``: token ``p`` of stream ``s`` is the same token wherever it
appears and distinct streams never share one (the token model of ``workloads/base.py``).  A
sequence is kept as *runs* ``(stream, start, length)`` = tokens ``start .. start+length-1`` of
``stream``, adjacent runs that continue one another merged, so a Mooncake prompt of 24 hash
blocks is 24 runs whatever its token count: the radix trees compare and split runs, never
single tokens, which keeps a hundred-million-token trace within seconds while staying exact at
the token level (a match may end anywhere inside a run).

Plain token-id lists are the special case of one-token runs ``(id, 0, 1)``: equal ids are
equal tokens at any position.  One replay never mixes the two spellings.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Run = tuple[Any, int, int]          # (stream, start, length)


def canonical(runs: Iterable[Run]) -> list[Run]:
    """``runs`` with empty runs dropped and each run that continues the one before merged into it."""
    out: list[Run] = []
    for s, t, n in runs:
        if n <= 0:
            continue
        if out:
            ps, pt, pn = out[-1]
            if ps == s and pt + pn == t:
                out[-1] = (ps, pt, pn + n)
                continue
        out.append((s, t, n))
    return out


def join(head: list[Run], tail: list[Run]) -> list[Run]:
    """``head`` followed by ``tail``, merging the run at the seam when it continues."""
    if not head:
        return list(tail)
    if not tail:
        return list(head)
    ps, pt, pn = head[-1]
    s, t, n = tail[0]
    if ps == s and pt + pn == t:
        return [*head[:-1], (ps, pt, pn + n), *tail[1:]]
    return [*head, *tail]


def split(runs: list[Run], k: int) -> tuple[list[Run], list[Run]]:
    """The first ``k`` tokens of ``runs`` and the rest (``0 < k < total``), cutting a run if needed."""
    head: list[Run] = []
    for j, (s, t, n) in enumerate(runs):
        if k < n:
            head.append((s, t, k))
            return head, [(s, t + k, n - k), *runs[j + 1:]]
        head.append((s, t, n))
        k -= n
        if k == 0:
            return head, list(runs[j + 1:])
    raise ValueError("split point beyond the runs")


def total(runs: Iterable[Run]) -> int:
    return sum(r[2] for r in runs)


class Seq:
    """One sequence (a prompt, or prompt + output) laid out for matching: parallel lists of
    the runs' streams, starts and lengths.  A *cursor* ``(i, off)`` is token ``off`` of run
    ``i``; the trees walk a sequence by cursors and never copy it."""

    __slots__ = ("streams", "starts", "lens", "length")

    def __init__(self, runs: list[Run]):
        runs = canonical(runs)          # equal content, equal runs: vLLM+ keys blocks by them
        self.streams = [r[0] for r in runs]
        self.starts = [r[1] for r in runs]
        self.lens = [r[2] for r in runs]
        self.length = sum(self.lens)

    def key(self, i: int, off: int) -> tuple[Any, int]:
        """The token at cursor ``(i, off)``: a radix node's children are keyed by their first token."""
        return self.streams[i], self.starts[i] + off

    def match(self, edge: list[Run], i: int, off: int) -> tuple[int, int, int]:
        """How many tokens of ``edge`` equal the sequence from cursor ``(i, off)`` on, and the
        cursor after them: ``(matched, i, off)``."""
        streams, starts, lens = self.streams, self.starts, self.lens
        n = len(lens)
        m = 0
        for s, t, ln in edge:
            eo = 0
            while eo < ln:
                if i >= n or streams[i] != s or starts[i] + off != t + eo:
                    return m, i, off
                k = min(ln - eo, lens[i] - off)
                m += k
                eo += k
                off += k
                if off == lens[i]:
                    i += 1
                    off = 0
        return m, i, off

    def advance(self, i: int, off: int, k: int) -> tuple[int, int]:
        """The cursor ``k`` tokens after ``(i, off)``."""
        lens = self.lens
        while k > 0:
            step = min(k, lens[i] - off)
            k -= step
            off += step
            if off == lens[i]:
                i += 1
                off = 0
        return i, off

    def runs(self, i: int, off: int, k: int | None = None) -> list[Run]:
        """The runs of the ``k`` tokens from cursor ``(i, off)`` (default: to the end)."""
        streams, starts, lens = self.streams, self.starts, self.lens
        if k is None:                               # the rest: the runs as they are
            out = list(zip(streams[i:], starts[i:], lens[i:]))
            if out and off:
                s, t, n = out[0]
                out[0] = (s, t + off, n - off)
            return out
        out = []
        left = k
        while left > 0 and i < len(lens):
            n = min(lens[i] - off, left)
            out.append((streams[i], starts[i] + off, n))
            left -= n
            i += 1
            off = 0
        return out


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a replay: its prompt and its output as runs.  Marconi inserts prompt +
    output after the request (its state after the last decoded token), so outputs matter."""

    request_id: str
    prompt: tuple[Run, ...]
    output: tuple[Run, ...] = ()

    @property
    def prompt_tokens(self) -> int:
        return total(self.prompt)

    def prompt_seq(self) -> Seq:
        return Seq(list(self.prompt))

    def full_seq(self) -> Seq:
        return Seq(join(list(self.prompt), list(self.output)))

    @classmethod
    def from_tokens(cls, request_id: str, prompt: Sequence[int],
                    output: Sequence[int] = ()) -> Request:
        """From token ids: each id a one-token run ``(id, 0, 1)``."""
        return cls(request_id, tuple((t, 0, 1) for t in prompt), tuple((t, 0, 1) for t in output))


def as_request(item: Any, index: int) -> Request:
    """A replay input as a :class:`Request`: a ``Request`` as is; a workload ``TraceRequest``
    (its ``segments``; output = ``output_tokens`` tokens of the stream ``out/<request id>``,
    as ``workloads.base.output_stream`` names it, so a later prompt that quotes this answer
    matches it); a list of token ids (no output); or a pair (prompt ids, output ids)."""
    if isinstance(item, Request):
        return item
    segments = getattr(item, "segments", None)
    if segments is not None:
        rid = str(item.request_id)
        out = int(getattr(item, "output_tokens", 0) or 0)
        return Request(rid, tuple(canonical(segments)),
                       ((f"out/{rid}", 0, out),) if out > 0 else ())
    rid = f"r{index:07d}"
    if isinstance(item, tuple) and len(item) == 2 and not isinstance(item[0], int):
        return Request.from_tokens(rid, list(item[0]), list(item[1]))
    return Request.from_tokens(rid, list(item))
