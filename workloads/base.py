"""The workload contract: :class:`TraceRequest`, :class:`WorkloadError`, and the
small pieces every kind shares (config field readers, length/time distributions).

Token identity: token ``p`` of stream ``s`` is the same token wherever it
appears, and distinct stream names never share a token.  A prompt is the
concatenation of its segments ``(stream, offset, length)`` = tokens
``offset .. offset+length-1`` of that stream.  The output tokens of request
``R`` are stream ``f"out/{R}"``, positions ``0 .. output_tokens-1``.

A stream is named by a string, or -- block-hash traces (Mooncake) -- by a
non-negative integer ``h``, the trace's hash id, which stands for the stream
``f"mc/{h}"`` (``segment_name``).  Hash ids are the bulk of a Mooncake
trace's segments: keeping them integers spares a string and a dictionary
entry per block (one run never mixes the two spellings of a stream).  Such a
trace's prompt is a :class:`HashIds`: plain data (its id array, the prompt's length,
the block, the private tail's name), read as the segments it stands for (iteration,
indexing, ``==`` with a list), not a tuple per id.  The engine builds its own prompt
type from those fields (``sim.engine.record.prompt_of``); the workloads import nothing
of the cache.
"""
from __future__ import annotations

from sim.errors import InputError

import difflib
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from librt.vecs import vec
from mypy_extensions import i64

Segment = tuple["str | int", int, int]   # (stream name, or a hash id; offset; length)


def segment_name(name: str | int) -> str:
    """The printable name of a segment's stream (``mc/<h>`` for hash id ``h``)."""
    return name if isinstance(name, str) else f"mc/{name}"


class HashIds:
    """A block-hash trace record's prompt (Mooncake: ``hash_ids``, ``input_length``) as
    plain data: ``ids``, the record's hash ids (machine integers in ``[0, 2**53)``, as
    the reader checked them: ``workloads.trace_records``), ``n_in`` the prompt's tokens,
    ``block`` the tokens a hash id stands for, ``tail_name`` the private stream that
    ends the prompt when the ids cover fewer than ``n_in`` tokens (``""`` when they
    cover it all).

    It reads as the list of segments it stands for (iteration, ``len``, indexing,
    slices, ``==`` with a list): ``(h, 0, block)`` for each id ``h`` used (the stream
    ``mc/<h>``, named by its integer), the last one cut to the prompt's length, then
    ``(tail_name, 0, tail)`` when the ids cover fewer tokens than the prompt.  The
    engine keys it straight from the four fields (``sim.engine.record.prompt_of``): no
    tuple per id is built on a run's way."""

    __slots__ = ("ids", "n_in", "block", "tail_name")

    def __init__(self, ids: vec[i64], n_in: int, block: int, tail_name: str) -> None:
        self.ids = ids
        self.n_in = n_in
        self.block = block
        self.tail_name = tail_name

    def layout(self) -> tuple[int, int, int]:
        """``(used, last, tail)``: the ids the prompt uses, the length of the last one's
        segment, the tokens past the ids (0: none)."""
        full, part = divmod(self.n_in, self.block)
        used = min(full + 1 if part else full, len(self.ids))
        last = part if used == full + 1 else self.block
        return used, last, self.n_in - (used - 1) * self.block - last if used else self.n_in

    def as_list(self) -> list[Segment]:
        """The segments as a list of tuples."""
        used, last, tail = self.layout()
        out: list[Segment] = [(self.ids[i], 0, self.block) for i in range(used - 1)]
        if used:
            out.append((self.ids[used - 1], 0, last))
        if tail > 0:
            out.append((self.tail_name, 0, tail))
        return out

    def __len__(self) -> int:
        used, _, tail = self.layout()
        return used + (1 if tail > 0 else 0)

    def __getitem__(self, i: int | slice) -> Segment | list[Segment]:
        return self.as_list()[i]

    def __iter__(self) -> Iterator[Segment]:
        return iter(self.as_list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashIds):
            return self.as_list() == other.as_list()
        if isinstance(other, list):
            return self.as_list() == other
        return False

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    # (equal to a list: unhashable as one)
    __hash__ = None   # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HashIds({self.as_list()!r})"


@dataclass(slots=True)
class TraceRequest:
    """One request of a workload, as the engine consumes it."""

    request_id: str
    arrival_s: float                 # absolute arrival time; for a follow-up turn: a lower bound only
    # prompt = concatenation of (stream name, offset, length); a block-hash trace's: its ids
    segments: list[Segment] | HashIds
    output_tokens: int               # tokens to generate (>= 1)
    session: str | None = None
    after: str | None = None         # request_id of the previous turn: this request arrives
    think_s: float = 0.0             # think_s after that one FINISHES (closed loop)
    priority: int = 0                # scheduler.policy priority: lower is served first (vLLM)
    index: int = -1                  # a fleet's arrival order, set when a router pre-routes it

    @property
    def prompt_tokens(self) -> int:
        """Number of prompt tokens (sum of the segment lengths; a block-hash trace's
        ``HashIds`` cover exactly its ``n_in``)."""
        segs = self.segments
        if isinstance(segs, HashIds):
            return segs.n_in
        return sum(seg[2] for seg in segs)


def output_stream(request_id: str) -> str:
    """Name of the stream holding the output tokens of ``request_id``."""
    return f"out/{request_id}"


class WorkloadError(InputError):
    """A bad workload config or trace line.  The message is one line naming the
    field (``workload.<field>``) or the file and line (``<path>:<lineno>``) and
    what is wrong."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


# --------------------------------------------------------------------------- values

def show(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a value for error messages (``sim.config.fields.show``:
    never writes a large value out whole)."""
    from sim.config.fields import show as short

    return short(value, limit)


# the largest token count (or priority magnitude) a request may carry: the compiled hot path
# holds them in 64-bit machine integers (sim/native.py); larger is a bad trace, not a run
# (the cache's NO_LENGTH_LIMIT, sim/cache/config.py: tests/workloads check they agree)
MAX_COUNT = (1 << 62) - 1

#: the most requests one workload may issue: a run keeps every request's row for
#: requests.csv (~0.3 KB each) and replays a few thousand a second, so ten million is
#: gigabytes and hours already; more is refused up front (or, for a trace, at the line)
MAX_REQUESTS = 10_000_000
#: the latest time (seconds) an arrival, a think time or a duration may reach: the
#: engine's clock counts integer nanoseconds in 64 bits (2**62 ns, ~146 years); 1e9 s
#: (~31.7 years) leaves the run itself room
MAX_TIME_S = 1e9
#: the most turns a chat session may have: every turn resends the whole conversation, so
#: a session's segments grow with the square of its turns
MAX_TURNS = 1000


def big(value: Any) -> str:
    """A count for a message: with thousands separators, or ``~2**N`` when huge."""
    if isinstance(value, int) and abs(value) >= 10 ** 21:
        return f"~2**{abs(value).bit_length() - 1}"
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) < 1e21 else f"{value:.3g}"
    return f"{value:,}"


def time_limit_error(name: str, value: float, what: str = "") -> "WorkloadError":
    return WorkloadError(f"{name}: {what or big(value) + ' s'} is past the "
                         f"{MAX_TIME_S:,.0f} s (~31.7 years) the simulator's clock holds")


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)


_MISSING: Any = object()


class Fields:
    """Reads the fields of one config mapping at ``where`` (e.g. ``workload`` or
    ``workload.suffix_tokens``), raising :class:`WorkloadError` that name the
    field.  Unknown keys are rejected as soon as the reader is made."""

    def __init__(self, mapping: Any, where: str, allowed: Iterable[str]):
        if not isinstance(mapping, Mapping):
            raise WorkloadError(f"{where}: expected a mapping, got {show(mapping)}")
        self.m = mapping
        self.where = where
        allowed = list(allowed)
        for key in mapping:
            if key not in allowed:
                hint = ""
                if isinstance(key, str):
                    close = difflib.get_close_matches(key, allowed, n=1)
                    if close:
                        hint = f"; did you mean {close[0]!r}?"
                raise WorkloadError(
                    f"{self.name(key)}: unknown key (allowed: {', '.join(allowed)}){hint}")

    def name(self, key: Any) -> str:
        text = f"{self.where}.{key}"
        return text if len(text) <= 120 else text[:117] + "..."

    def has(self, key: str) -> bool:
        return key in self.m and self.m[key] is not None

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if not self.has(key):
            if default is _MISSING:
                raise WorkloadError(f"{self.name(key)}: missing (required)")
            return default
        return self.m[key]

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None,
            maximum: int | None = None, why: str = "") -> int:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        return check_int(value, self.name(key), minimum, maximum, why)

    def number(self, key: str, default: Any = _MISSING, minimum: float | None = None,
               positive: bool = False, maximum: float | None = None, why: str = "") -> float:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        return check_number(value, self.name(key), minimum, positive, maximum, why)

    def str(self, key: str, default: Any = _MISSING, choices: Iterable[str] | None = None) -> str:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value:
            raise WorkloadError(f"{self.name(key)}: expected a non-empty string, got {show(value)}")
        if choices is not None:
            choices = list(choices)
            if value not in choices:
                raise WorkloadError(
                    f"{self.name(key)}: must be one of {', '.join(choices)}, got {show(value)}")
        return value


def _hint(value: Any, want_int: bool) -> str:
    """``'1e6'`` (YAML 1.1 reads it as text): say so and how to write the number."""
    if not isinstance(value, str):
        return ""
    from sim.config.fields import _number_hint

    return _number_hint(value, want_int)


def check_int(value: Any, name: str, minimum: int | None = None,
              maximum: int | None = None, why: str = "") -> int:
    """An integer field: ``maximum`` (default: ``MAX_COUNT``, what the engine holds) and
    ``why`` (the reason for it, in the message)."""
    if not is_int(value):
        raise WorkloadError(f"{name}: expected an integer, got {show(value)}{_hint(value, True)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{name}: must be >= {minimum}, got {big(value)}")
    top = MAX_COUNT if maximum is None else maximum
    if value > top:
        limit = "below 2**62" if top == MAX_COUNT else f"at most {big(top)}"
        raise WorkloadError(f"{name}: must be {limit}"
                            f"{' (' + why + ')' if why else ''}, got {big(value)}")
    return value


def check_number(value: Any, name: str, minimum: float | None = None,
                 positive: bool = False, maximum: float | None = None, why: str = "") -> float:
    if not is_number(value):
        raise WorkloadError(f"{name}: expected a finite number, got {show(value)}"
                            f"{_hint(value, False)}")
    value = float(value)
    if positive and value <= 0:
        raise WorkloadError(f"{name}: must be > 0, got {value:g}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{name}: must be >= {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise WorkloadError(f"{name}: must be at most {maximum:g}"
                            f"{' (' + why + ')' if why else ''}, got {value:g}")
    return value


# --------------------------------------------------------------------------- distributions

DIST_KINDS = ("fixed", "uniform", "lognormal")


@dataclass(frozen=True, slots=True)
class Dist:
    """A length (``integer=True``) or time distribution.

    * ``{dist: fixed, value}`` (a bare number is shorthand for this)
    * ``{dist: uniform, low, high}`` — integers: ``low..high`` inclusive; floats: ``[low, high)``
    * ``{dist: lognormal, mean, sigma, min?, max?}`` — ``mean`` is the arithmetic mean
      of the distribution (before clipping), ``sigma`` the standard deviation of its log;
      integer samples are rounded, then every sample is clipped to ``[min, max]``
      (``min`` defaults to the field's lower bound, ``max`` to no limit).
    """

    kind: str
    integer: bool
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    mean: float = 0.0
    sigma: float = 0.0
    min: float = 0.0
    max: float | None = None
    # what no sample may pass, beside ``max`` (the field's limit: MAX_COUNT tokens, or
    # MAX_TIME_S seconds; a lognormal's tail is not bounded by its mean)
    cap: float | None = None

    @classmethod
    def parse(cls, spec: Any, where: str, *, integer: bool, minimum: float = 0,
              maximum: float | None = None, why: str = "") -> Dist:
        """Validate a distribution spec at config path ``where``; every value it may
        take lies in ``[minimum, maximum]`` (integers: at most ``MAX_COUNT`` by default;
        ``why``: the reason for ``maximum``, in the message)."""
        def check(value, name, lo):
            if integer:
                return check_int(value, name, lo, maximum, why)
            return check_number(value, name, lo, maximum=maximum, why=why)
        if not isinstance(spec, Mapping):
            if (integer and is_int(spec)) or (not integer and is_number(spec)):
                return cls("fixed", integer, value=check(spec, where, minimum))
            want = "an integer" if integer else "a number"
            raise WorkloadError(
                f"{where}: expected {want} or a mapping {{dist: fixed|uniform|lognormal, ...}},"
                f" got {show(spec)}")
        if "dist" not in spec:
            raise WorkloadError(f"{where}.dist: missing (one of {', '.join(DIST_KINDS)})")
        kind = spec["dist"]
        if kind not in DIST_KINDS:
            raise WorkloadError(f"{where}.dist: must be one of {', '.join(DIST_KINDS)}, got {show(kind)}")
        if kind == "fixed":
            f = Fields(spec, where, ("dist", "value"))
            return cls(kind, integer, value=check(f.raw("value"), f.name("value"), minimum))
        if kind == "uniform":
            f = Fields(spec, where, ("dist", "low", "high"))
            low = check(f.raw("low"), f.name("low"), minimum)
            high = check(f.raw("high"), f.name("high"), low)
            return cls(kind, integer, low=low, high=high)
        f = Fields(spec, where, ("dist", "mean", "sigma", "min", "max"))
        mean = f.number("mean", positive=True, maximum=maximum, why=why)
        sigma = f.number("sigma", minimum=0.0, maximum=10.0,
                         why="exp(sigma) already spans ~22,000 x")
        lo = check(f.raw("min"), f.name("min"), minimum) if f.has("min") else minimum
        hi = check(f.raw("max"), f.name("max"), lo) if f.has("max") else None
        cap = float(maximum) if maximum is not None else (float(MAX_COUNT) if integer else None)
        return cls(kind, integer, mean=mean, sigma=sigma, min=lo, max=hi, cap=cap)

    def sample(self, rng: np.random.Generator) -> Any:
        """One sample (an ``int`` for integer distributions, else a ``float``)."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            if self.integer:
                return int(rng.integers(self.low, self.high + 1))
            return float(rng.uniform(self.low, self.high)) if self.high > self.low else float(self.low)
        mu = math.log(self.mean) - self.sigma * self.sigma / 2.0
        x = float(rng.lognormal(mu, self.sigma))
        if self.integer:
            x = float(round(x)) if math.isfinite(x) else x
        x = max(x, self.min)
        if self.max is not None:
            x = min(x, self.max)
        if self.cap is not None and x > self.cap:
            x = self.cap
        if self.integer:
            return min(int(x), MAX_COUNT) if math.isfinite(x) else int(self.min)
        return x

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.value:g}"
        if self.kind == "uniform":
            return f"U[{self.low:g},{self.high:g}]"
        clip = ""
        if self.min or self.max is not None:
            clip = f" in [{self.min:g},{'inf' if self.max is None else format(self.max, 'g')}]"
        return f"lognormal(mean {self.mean:g}, sigma {self.sigma:g}{clip})"
