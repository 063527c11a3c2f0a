"""A Mooncake record's block hash ids as prompt segments.

Compiled with the hot path (``sim/native.py``): it runs once per trace record and
loops over every hash id of the prompt, which interpreted costs a few per cent of a
simulated request."""
from __future__ import annotations


def hash_id_segments(ids: object, n_in: int, block: int,
                     rid: str) -> list[tuple[str | int, int, int]] | None:
    """The segments of a prompt of ``n_in`` tokens over ``block``-token hash ids
    (a Mooncake trace record, read by ``workloads.traces``):
    ``(h, 0, block)`` per id ``h`` (the stream ``mc/<h>``, named by its integer:
    ``workloads.base.Segment``), the last one cut to ``n_in``, and a private
    ``("mcu/<rid>", 0, rest)`` when the ids cover fewer than ``n_in`` tokens.
    None when ``ids`` is not a list of integers in ``[0, 2**53)`` (bools and
    floats included: JSON integers decode as int exactly)."""
    if not isinstance(ids, list):
        return None
    for h in ids:
        if type(h) is not int or h < 0 or h >= 1 << 53:
            return None
    full = n_in // block
    part = n_in - full * block
    take = full + 1 if part else full
    segs: list[tuple[str | int, int, int]] = []
    covered = 0
    for i, h in enumerate(ids):
        if i >= take:
            break
        n = part if i == full else block
        segs.append((h, 0, n))
        covered += n
    if covered < n_in:
        segs.append((f"mcu/{rid}", 0, n_in - covered))
    return segs
