"""A Mooncake record's block hash ids as prompt segments.

Compiled with the hot path (``sim/native.py``): it runs once per trace record and
loops over every hash id of the prompt, which interpreted costs a few per cent of a
simulated request."""
from __future__ import annotations

from typing import Any, Final

LIMIT: Final = 1 << 53   # hash ids are integers in [0, 2**53) (Final: inlined, not a global)


def hash_id_segments(ids: object, n_in: int, block: int,
                     rid: str) -> list[tuple[str | int, int, int]] | None:
    """The segments of a prompt of ``n_in`` tokens over ``block``-token hash ids
    (a Mooncake trace record, read by ``workloads.traces``):
    ``(h, 0, block)`` per id ``h`` (the stream ``mc/<h>``, named by its integer:
    ``workloads.base.Segment``), the last one cut to ``n_in``, and a private
    ``("mcu/<rid>", 0, rest)`` when the ids cover fewer than ``n_in`` tokens.
    None when ``ids`` is not a list of integers in ``[0, 2**53)`` (bools and
    floats included: JSON integers decode as int exactly).

    One pass checks and builds (~27 ids a record on the conversation trace): each
    segment holds the id object itself and two numbers boxed once per record (a
    tuple built from typed ints boxes each of them again, a new int object per
    segment above 256)."""
    if not isinstance(ids, list):
        return None
    full = n_in // block
    part = n_in - full * block
    zero: Any = 0
    size: Any = block        # (boxed once: every full block's length)
    k = full + 1 if part else full        # segments of the ids (sized once: no regrowth)
    if k > len(ids):
        k = len(ids)
    segs: list[Any] = [None] * k
    i = 0
    for h in ids:
        seg_id: Any = h    # (the id object itself: h is narrowed to int below, and a
        if type(h) is not int:        # narrowed int put in a tuple is boxed anew)
            return None
        v: int = h
        if v < 0 or v >= LIMIT:
            return None
        if i < full:
            segs[i] = (seg_id, zero, size)
        elif i == full and part:
            segs[i] = (seg_id, zero, part)
        i += 1
    covered = block * full if i >= full else block * i
    if i > full and part:
        covered += part
    if covered < n_in:
        segs.append((f"mcu/{rid}", 0, n_in - covered))
    return segs
