"""A Mooncake record's block hash ids as its prompt (``workloads.base.HashIds``).

Compiled with the hot path (``sim/native.py``): it runs once per trace record and
loops over every hash id of the prompt, which interpreted costs a few per cent of a
simulated request."""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from workloads.base import HashIds

LIMIT: Final = 1 << 53   # hash ids are integers in [0, 2**53) (Final: inlined, not a global)


def hash_id_segments(ids: object, n_in: int, block: int, rid: str) -> HashIds | None:
    """The segments of a prompt of ``n_in`` tokens over ``block``-token hash ids
    (a Mooncake trace record, read by ``workloads.trace_records``), as a
    ``workloads.base.HashIds`` (the record's ids as plain data, read as segments):
    ``(h, 0, block)`` per id ``h`` (the stream ``mc/<h>``, named by its integer:
    ``workloads.base.Segment``), the last one cut to ``n_in``, and a private
    ``("mcu/<rid>", 0, rest)`` when the ids cover fewer than ``n_in`` tokens.
    None when ``ids`` is not a list of integers in ``[0, 2**53)`` (bools and
    floats included: JSON integers decode as int exactly).

    One pass checks the ids (~27 a record on the conversation trace); no tuple is
    built per id (the engine keys the ids: ``sim.engine.record.prompt_of``)."""
    if not isinstance(ids, list):
        return None
    out = vec[i64](capacity=len(ids))
    for h in ids:
        if type(h) is not int:
            return None
        v: int = h
        if v < 0 or v >= LIMIT:
            return None
        out = append(out, v)
    return layout_prompt(out, n_in, block, rid)


def layout_prompt(ids: vec[i64], n_in: i64, block: i64, rid: str) -> HashIds:
    """``hash_id_segments`` of ids already checked (``[0, 2**53)``): the tail's stream
    name is only built when the ids cover fewer than ``n_in`` tokens (it is read only
    then)."""
    name = f"mcu/{rid}" if block * len(ids) < n_in else ""
    return HashIds(ids, n_in, block, name)
