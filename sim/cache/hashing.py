"""Chained prefix hashes over token *segments*, computed once and shared.

vLLM hashes a request's tokens in units of ``hash_block_size`` (the prefix
match unit): hash *i* chains over every token before it, so equal hashes mean
equal prefixes ``[0, (i + 1) * h)``.  With ``num_hash_lookahead_tokens = L``
each hash also covers the ``L`` tokens after its unit and is emitted only once
those tokens exist, i.e. hash *i* fingerprints ``[0, (i + 1) * h + L)``.

We never materialise token lists.  A prompt is a list of *runs*
``(stream, start, length)``: token ``p`` of stream ``s`` is a distinct token
for every ``(s, p)``; literal token ids live in stream ``LITERAL`` at their own
value.  The hash of a unit is ``blake2b(parent, runs of the unit)`` truncated
to 64 bits — deterministic across processes, and with 2**64 values the chance
that two different prefixes collide over a million-request trace is ~1e-7.

Speed: a unit that lies inside one run is keyed by ``(parent, stream, start,
length)``, and consecutive such units are memoised as *chains*: the hashes of
a 57,600-token system prompt are computed once, and every later request that
starts with it copies that list slice instead of rehashing (bench/hash_bench.py).
"""
from __future__ import annotations

import struct
from hashlib import blake2b

LITERAL = -1          # stream id of literal token ids (position = token id)
ROOT = 0              # parent hash of the first unit

Run = tuple[int, int, int]  # (stream id, start position in stream, length)

_PACK4 = struct.Struct("<Qqqq").pack


def _digest(data: bytes) -> int:
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def canonical_runs(runs: list[Run]) -> list[Run]:
    """Merge adjacent runs that continue the same stream; drop empty runs.

    Two descriptions of the same token sequence must hash identically, so
    runs are made maximal before hashing.
    """
    out: list[Run] = []
    for s, st, n in runs:
        if n <= 0:
            continue
        if out:
            ps, pst, pn = out[-1]
            if ps == s and pst + pn == st:
                out[-1] = (s, pst, pn + n)
                continue
        out.append((s, st, n))
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
    def unit_hash_single(parent: int, stream: int, start: int, length: int) -> int:
        return _digest(_PACK4(parent, stream, start, length))

    @staticmethod
    def unit_hash_multi(parent: int, runs: list[Run]) -> int:
        parts = [struct.pack("<Q", parent)]
        for s, st, n in runs:
            parts.append(struct.pack("<qqq", s, st, n))
        parts.append(b"M")  # multi-run marker: never equal to a single-run key
        return _digest(b"".join(parts))

    # -- whole sequences ----------------------------------------------------
    def hashes(self, runs: list[Run], start_hashes: list[int] | None = None) -> list[int]:
        """All emitted hashes of the token sequence ``runs``.

        ``start_hashes`` (optional) are hashes already known for a prefix of
        this same sequence (e.g. before output tokens were appended); they are
        kept and only later units are computed.
        """
        runs = canonical_runs(runs)
        total = sum(r[2] for r in runs)
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
        while k < n_units:
            need = h + la if k == 0 else h
            s, st, n = runs[ri]
            avail = n - off
            if avail >= need:
                # Units lying inside this run: as many as fit (and are emitted).
                first_len = need
                cnt = 1 + (avail - need) // h
                cnt = min(cnt, n_units - k)
                chain = self._chain(parent, s, st + off, first_len, cnt)
                out.extend(chain[:cnt] if len(chain) > cnt else chain)
                k += cnt
                parent = out[-1]
                consumed = first_len + (cnt - 1) * h
                off += consumed
                if off >= n and ri + 1 < len(runs):
                    ri += 1
                    off = 0
                continue
            # Unit spans several runs.
            pieces, ri, off = _take(runs, ri, off, need)
            parent = self.unit_hash_multi(parent, pieces)
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
        single = self.unit_hash_single
        while k < n_units:
            need = h + la if k == 0 else h
            s, st, n = runs[ri]
            if n - off >= need:
                parent = single(parent, s, st + off, need)
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
            single = self.unit_hash_single
            for _ in range(cnt - len(chain)):
                p = single(p, stream, pos, ln)
                chain.append(p)
                pos += ln
                ln = h
            self._chain_units += cnt
        return chain
