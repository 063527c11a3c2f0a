"""Chained prefix hashes over token *segments*, computed once and shared.

vLLM hashes a request's tokens in units of ``hash_block_size`` (the prefix
match unit): hash *i* chains over every token before it, so equal hashes mean
equal prefixes ``[0, (i + 1) * h)``.  With ``num_hash_lookahead_tokens = L``
each hash also covers the ``L`` tokens after its unit and is emitted only once
those tokens exist, i.e. hash *i* fingerprints ``[0, (i + 1) * h + L)``.

We never materialise token lists.  A prompt is a list of *runs*
``(stream, start, length)``: token ``p`` of stream ``s`` is a distinct token
for every ``(s, p)``; literal token ids live in stream ``LITERAL`` at their own
value.  The key of a unit chains its parent's key with ``(stream, start,
length)`` (a unit spanning several runs: a marker, then every run) through
``unit_key``: a 57-bit state in two lanes modulo the primes ``P1 < 2**29`` and
``P2 < 2**28``.  Every input is absorbed into both lanes by affine steps that
cross-feed the lanes, then each lane is cubed (a permutation, as ``P % 3 == 2``),
so for fixed inputs the step is a bijection of the state: two different prefixes
never merge afterwards, and they coincide only if one step happens to map them
to the same state (~1 in 2**57).  Over a million-request trace (~1e8 units, a
pool of ~1e5 cached blocks, ~2e8 probes) the chance of even one false hit is
~1e-4.  Why not a digest or CPython's tuple hash: every value stays below 2**62,
so the compiled build (sim/native.py) computes a key in machine integers with
no allocation, and ``key << GROUP_BITS | group`` still fits: a key costs ~210
CPU instructions there, against ~1,700 for the tuple hash (callgrind), itself
~30x cheaper than a blake2b digest.  Keys are plain integers: equal across
processes, runs and builds.

Speed: a unit that lies inside one run is keyed by ``(parent, stream, start,
length)``, and consecutive such units are memoised as *chains*: the hashes of
a 57,600-token system prompt are computed once, and every later request that
starts with it copies that list slice instead of rehashing (bench/hash_bench.py).
"""
from __future__ import annotations

from typing import Final

from mypy_extensions import i64

LITERAL: Final = -1          # stream id of literal token ids (position = token id)
ROOT: Final = 0              # parent hash of the first unit

Run = tuple[int, int, int]  # (stream id, start position in stream, length)

MULTI: Final = -7            # marker that starts the key of a unit spanning several runs

# unit_key's lanes: primes just below 2**29 and 2**28 with P % 3 == 2, and bases
P1: Final = 536_870_909      # 2**29 - 3
P2: Final = 268_435_367      # 2**28 - 89
B1: Final = 208_919_972
B2: Final = 223_891_578
KEY_SPACE: Final = P1 * P2   # keys lie in [0, KEY_SPACE), below 2**57


def unit_key(parent: int, stream: int, start: int, length: int) -> int:
    """The key of a unit of ``length`` tokens of ``stream`` from ``start``, after
    the prefix keyed ``parent`` (see the module docstring).

    ``i64``: 64-bit machine integers in the compiled build, plain ints in the
    source; no intermediate value reaches 2**62, so both compute the same."""
    p: i64 = parent
    a: i64 = p // P2
    b: i64 = p - a * P2
    a = (a * B1 + b + stream) % P1
    b = (b * B2 + a + stream) % P2
    a = (a * B1 + b + start) % P1
    b = (b * B2 + a + start) % P2
    a = (a * B1 + b + length) % P1
    b = (b * B2 + a + length) % P2
    a = a * a % P1 * a % P1
    b = b * b % P2 * b % P2
    return a * P2 + b


def unit_key_multi(parent: int, values: list[int]) -> int:
    """The key of a unit spanning several runs: ``values`` = MULTI, then
    ``stream, start, length`` of each piece."""
    p: i64 = parent
    a: i64 = p // P2
    b: i64 = p - a * P2
    x: i64
    for x in values:
        a = (a * B1 + b + x) % P1
        b = (b * B2 + a + x) % P2
    a = a * a % P1 * a % P1
    b = b * b % P2 * b % P2
    return a * P2 + b


CHAIN_MIN_UNITS: Final = 16  # runs holding fewer units are hashed directly, not memoised


def canonical_runs(runs: list[Run]) -> list[Run]:
    """Merge adjacent runs that continue the same stream; drop empty runs.

    Two descriptions of the same token sequence must hash identically, so
    runs are made maximal before hashing.
    """
    out: list[Run] = []
    ps = pst = pn = -1          # (no run yet: pst + pn = -2 is no run's start)
    for s, st, n in runs:
        if n <= 0:
            continue
        if ps == s and pst + pn == st:
            pn += n
            out[-1] = (s, pst, pn)
            continue
        out.append((s, st, n))
        ps, pst, pn = s, st, n
    return out


def _take(runs: list[Run], ri: int, off: int, need: int) -> tuple[list[Run], int, int]:
    """The next ``need`` tokens from run ``ri`` at offset ``off``, possibly across
    runs; returns them as pieces and the cursor after them."""
    pieces: list[Run] = []
    while need > 0:
        s, st, n = runs[ri]
        take = min(need, n - off)
        pieces.append((s, st + off, take))
        need -= take
        off += take
        if off >= n and ri + 1 < len(runs):
            ri += 1
            off = 0
    return pieces, ri, off


class PrefixHasher:
    """Computes the hash list of a run sequence for one (unit, lookahead).

    One instance per cache manager; it owns the chain memo.  The memo is a
    pure accelerator (bounded, cleared when full), so results never depend on
    what was memoised.
    """

    def __init__(self, unit: int, lookahead: int = 0, memo_limit: int = 4_000_000):
        if unit <= 0:
            raise ValueError("hash unit must be positive")
        if lookahead < 0:
            raise ValueError("num_hash_lookahead_tokens must be >= 0")
        self.unit = unit
        self.lookahead = lookahead
        self.memo_limit = memo_limit
        # (parent, stream, start, first_len) -> list of consecutive unit hashes
        self._chains: dict[tuple[int, int, int, int], list[int]] = {}
        self._chain_units = 0

    # -- single units -------------------------------------------------------
    @staticmethod
    def unit_hash_multi(parent: int, runs: list[Run]) -> int:
        flat = [MULTI]
        for r in runs:
            flat.extend(r)
        return unit_key_multi(parent, flat)

    # -- whole sequences ----------------------------------------------------
    def hashes(self, runs: list[Run], start_hashes: list[int] | None = None,
               canonical: bool = False) -> list[int]:
        """All emitted hashes of the token sequence ``runs``.

        ``start_hashes`` (optional) are hashes already known for a prefix of
        this same sequence (e.g. before output tokens were appended); they are
        kept and only later units are computed.  ``canonical``: the caller
        already merged the runs (``canonical_runs``).
        """
        if not canonical:
            runs = canonical_runs(runs)
        total = 0
        for r in runs:
            total += r[2]
        h, la = self.unit, self.lookahead
        out: list[int] = list(start_hashes) if start_hashes else []
        # boundary (exclusive end) of unit i is (i + 1) * h + la
        n_units = max(0, (total - la) // h)
        if len(out) >= n_units:
            del out[n_units:]
            return out
        # Position in tokens where the next unit's content starts.
        k = len(out)
        pos = 0 if k == 0 else k * h + la
        parent = out[-1] if out else ROOT
        # Locate run containing pos.
        ri, off = 0, pos
        while ri < len(runs) and off >= runs[ri][2]:
            off -= runs[ri][2]
            ri += 1
        last_ri = len(runs) - 1
        while k < n_units:
            need = h + la if k == 0 else h
            s, st, n = runs[ri]
            avail = n - off
            if avail >= need:
                # Units lying inside this run: as many as fit (and are emitted).
                cnt = min(1 + (avail - need) // h, n_units - k)
                q = st + off
                if cnt >= CHAIN_MIN_UNITS:
                    chain = self._chain(parent, s, q, need, cnt)
                    out.extend(chain[:cnt] if len(chain) > cnt else chain)
                    parent = out[-1]
                else:
                    p = parent
                    c = cnt
                    if need != h:
                        p = unit_key(p, s, q, need)
                        out.append(p)
                        q += need
                        c -= 1
                    for _ in range(c):   # (a constant-step loop: compiled to a C loop)
                        p = unit_key(p, s, q, h)
                        out.append(p)
                        q += h
                    parent = p
                k += cnt
                off += need + (cnt - 1) * h
                if off >= n and ri < last_ri:
                    ri += 1
                    off = 0
                continue
            # Unit spans several runs (same key as ``unit_hash_multi``).
            rem = need - avail
            if ri < last_ri:
                s2, st2, n2 = runs[ri + 1]
                if n2 > rem or (n2 == rem and ri + 1 == last_ri):
                    # the common case: it ends inside the next run
                    parent = unit_key_multi(parent, [MULTI, s, st + off, avail, s2, st2, rem])
                    out.append(parent)
                    k += 1
                    ri += 1
                    off = rem
                    continue
            flat = [MULTI, s, st + off, avail]
            while True:
                ri += 1
                s, st, n = runs[ri]
                if n >= rem:
                    flat += (s, st, rem)
                    off = rem
                    if off >= n and ri < last_ri:
                        ri += 1
                        off = 0
                    break
                flat += (s, st, n)
                rem -= n
            parent = unit_key_multi(parent, flat)
            out.append(parent)
            k += 1
        return out

    def extend(self, runs: list[Run], out: list[int]) -> None:
        """Append to ``out`` (the hashes of a prefix of ``runs``) the hashes of
        every unit ``runs`` now completes.  ``runs`` must be canonical.  Walks
        the runs from the end (new units sit near the end) and does not touch
        the chain memo: appended tokens (outputs) are private to one request."""
        h, la = self.unit, self.lookahead
        total = 0
        for r in runs:
            total += r[2]
        n_units = max(0, (total - la) // h)
        k = len(out)
        if k >= n_units:
            return
        pos = 0 if k == 0 else k * h + la
        # locate the run holding ``pos`` scanning backwards
        ri = len(runs) - 1
        start = total - runs[ri][2]
        while start > pos:
            ri -= 1
            start -= runs[ri][2]
        off = pos - start
        parent = out[-1] if out else ROOT
        while k < n_units:
            need = h + la if k == 0 else h
            s, st, n = runs[ri]
            if n - off >= need:
                parent = unit_key(parent, s, st + off, need)
                off += need
            else:
                pieces, ri, off = _take(runs, ri, off, need)
                parent = self.unit_hash_multi(parent, pieces)
            out.append(parent)
            k += 1
            if off >= runs[ri][2] and ri + 1 < len(runs):
                ri += 1
                off = 0

    def _chain(self, parent: int, stream: int, start: int, first_len: int, cnt: int) -> list[int]:
        key = (parent, stream, start, first_len)
        chain = self._chains.get(key)
        if chain is None:
            if self._chain_units > self.memo_limit:
                self._chains.clear()
                self._chain_units = 0
            chain = []
            self._chains[key] = chain
        if len(chain) < cnt:
            h = self.unit
            if chain:
                p = chain[-1]
                pos = start + first_len + (len(chain) - 1) * h
                ln = h
            else:
                p = parent
                pos = start
                ln = first_len
            if ln != h:   # the first unit of a sequence also covers the lookahead
                p = unit_key(p, stream, pos, ln)
                chain.append(p)
                pos += ln
            end = start + first_len + (cnt - 1) * h
            while pos < end:
                p = unit_key(p, stream, pos, h)
                chain.append(p)
                pos += h
            self._chain_units += cnt
        return chain
