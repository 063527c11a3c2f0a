"""Prompts as stream segments, and the literal token ids both sides are given.

A differential case writes a prompt as segments ``(stream, offset, length)``: tokens
``offset .. offset + length - 1`` of a named stream.  Our side reads the ``NAME[@OFF]:LEN``
notation (or the literal ids); the oracle reads ``{"ids": [...]}``.  Token ``p`` of the
``k``-th stream (streams numbered in order of first use over the case) is
``(k + 1) * STREAM_STRIDE + p``, so two prompts share ids exactly where they share stream
segments.
"""
from __future__ import annotations

from typing import Iterable, Sequence

STREAM_STRIDE = 100_000

Segment = Sequence   # (stream name, offset, length): a tuple or a 3-item list


def stream_numbers(prompts: Iterable[Iterable[Segment]]) -> dict[str, int]:
    """Stream name -> its number, in order of first use over ``prompts``."""
    nums: dict[str, int] = {}
    for segs in prompts:
        for seg in segs:
            nums.setdefault(seg[0], len(nums))
    return nums


def token_ids(segs: Iterable[Segment], nums: dict[str, int]) -> list[int]:
    out: list[int] = []
    for name, off, ln in segs:
        base = (nums[name] + 1) * STREAM_STRIDE
        out.extend(range(base + off, base + off + ln))
    return out


def prompt_notation(segs: Iterable[Segment]) -> str:
    """Our prompt notation: ``NAME:LEN`` or ``NAME@OFF:LEN`` per segment."""
    return " ".join(f"{n}@{o}:{ln}" if o else f"{n}:{ln}" for n, o, ln in segs)


def parse_notation(prompt: str) -> list[tuple[str, int, int]]:
    """The inverse of ``prompt_notation`` (no checks: ``sim.cache.case`` validates)."""
    segs = []
    for part in prompt.split():
        name, length = part.rsplit(":", 1)
        off = 0
        if "@" in name:
            name, o = name.split("@", 1)
            off = int(o)
        segs.append((name, off, int(length)))
    return segs


def prompt_len(segs: Iterable[Segment]) -> int:
    return sum(s[2] for s in segs)


def normalise(segs: Iterable[Segment]) -> list[tuple]:
    """Merge runs that continue the same stream, drop empty ones."""
    out: list[list] = []
    for n, o, ln in segs:
        if ln <= 0:
            continue
        if out and out[-1][0] == n and out[-1][1] + out[-1][2] == o:
            out[-1][2] += ln
        else:
            out.append([n, o, ln])
    return [tuple(s) for s in out]


def truncate(segs: Iterable[Segment], n: int) -> list[tuple]:
    """The first ``n`` tokens of a prompt."""
    out = []
    left = n
    for name, off, ln in segs:
        if left <= 0:
            break
        take = min(ln, left)
        out.append((name, off, take))
        left -= take
    return out
