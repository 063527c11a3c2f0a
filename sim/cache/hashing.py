"""Chained prefix hashes over token *segments*, computed once and shared.

vLLM hashes a request's tokens in units of ``hash_block_size`` (the prefix
match unit): hash *i* chains over every token before it, so equal hashes mean
equal prefixes ``[0, (i + 1) * h)``.  With ``num_hash_lookahead_tokens = L``
each hash also covers the ``L`` tokens after its unit and is emitted only once
those tokens exist, i.e. hash *i* fingerprints ``[0, (i + 1) * h + L)``.

We never materialise token lists.  A prompt is a list of *runs*
``(stream, start, length)``: token ``p`` of stream ``s`` is a distinct token
for every ``(s, p)``; literal token ids live in stream ``LITERAL`` at their own
value.  The key of a unit is CPython's hash of the tuple ``(parent, stream,
start, length)`` (several runs: the flattened runs after a marker) — the
xxHash-style tuple hash over integers, which is not salted, so keys are equal
across processes and runs (PYTHONHASHSEED only salts str/bytes).  Parents
enter modulo 2**61 - 1, so a key has ~61 bits: the chance that two different
prefixes collide over a million-request trace (~1e8 units) is ~2e-3 for *some*
pair of units anywhere, and a collision only matters if both prefixes are
looked up against each other.  It is ~30x cheaper than a 64-bit blake2b digest
(bench/hash_bench.py), which is what makes hashing every prompt affordable.

Speed: a unit that lies inside one run is keyed by ``(parent, stream, start,
length)``, and consecutive such units are memoised as *chains*: the hashes of
a 57,600-token system prompt are computed once, and every later request that
starts with it copies that list slice instead of rehashing (bench/hash_bench.py).
"""
from __future__ import annotations

LITERAL = -1          # stream id of literal token ids (position = token id)
ROOT = 0              # parent hash of the first unit

Run = tuple[int, int, int]  # (stream id, start position in stream, length)

MULTI = -7            # marker that starts the key of a unit spanning several runs
CHAIN_MIN_UNITS = 16  # runs holding fewer units are hashed directly, not memoised


def canonical_runs(runs: list[Run]) -> list[Run]:
    """Merge adjacent runs that continue the same stream; drop empty runs.

    Two descriptions of the same token sequence must hash identically, so
    runs are made maximal before hashing.
    """
    out: list[Run] = []
    ps = pst = pn = -1          # (no run yet: stream ids are >= 0)
    for r in runs:
        s, st, n = r
        if n <= 0:
            continue
        if ps == s and pst + pn == st:
            pn += n
            out[-1] = (s, pst, pn)
            continue
        out.append(r if r.__class__ is tuple else (s, st, n))
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
    def unit_hash_single(parent: int, stream: int, start: int, length: int) -> int:
        return hash((parent, stream, start, length))

    @staticmethod
    def unit_hash_multi(parent: int, runs: list[Run]) -> int:
        flat = [parent, MULTI]
        for r in runs:
            flat.extend(r)
        return hash(tuple(flat))

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
        append = out.append
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
                        p = hash((p, s, q, need))
                        append(p)
                        q += need
                        c -= 1
                    for q in range(q, q + c * h, h):
                        p = hash((p, s, q, h))
                        append(p)
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
                    parent = hash((parent, MULTI, s, st + off, avail, s2, st2, rem))
                    append(parent)
                    k += 1
                    ri += 1
                    off = rem
                    continue
            flat = [parent, MULTI, s, st + off, avail]
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
            parent = hash(tuple(flat))
            append(parent)
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
                parent = hash((parent, s, st + off, need))
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
            append = chain.append
            if ln != h:   # the first unit of a sequence also covers the lookahead
                p = hash((p, stream, pos, ln))
                append(p)
                pos += ln
            for pos in range(pos, start + first_len + (cnt - 1) * h, h):
                p = hash((p, stream, pos, h))
                append(p)
            self._chain_units += cnt
        return chain
