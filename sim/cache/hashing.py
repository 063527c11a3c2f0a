"""Prefix keys over token *segments*, computed on demand in O(1) each.

vLLM hashes a request's tokens in units of ``hash_block_size`` (the prefix
match unit): hash *i* chains over every token before it, so equal hashes mean
equal prefixes ``[0, (i + 1) * h)``.  With ``num_hash_lookahead_tokens = L``
each hash also covers the ``L`` tokens after its unit and is emitted only once
those tokens exist, i.e. hash *i* fingerprints ``[0, (i + 1) * h + L)``.  All
the cache needs of a hash is that property: equal keys exactly when the
fingerprinted prefixes are equal.

We never materialise token lists.  A prompt is a list of *runs*
``(stream, start, length)``: token ``p`` of stream ``s`` is a distinct token
for every ``(s, p)``; literal token ids live in stream ``LITERAL`` at their own
value.  Runs are kept *canonical* (maximal: no run continues the previous
one), so a token sequence has exactly one description, and the description of
a prefix is the sequence's runs cut at the prefix end.  The key of the prefix
``[0, e)`` is therefore

    ``unit_key(chain[r], stream_r, start_r, e - begin_r)``

where run ``r`` holds token ``e - 1`` (it begins at token ``begin_r``) and
``chain[r]`` is the key of the prefix made of the runs before it
(``chain[0] = ROOT``, ``chain[r + 1] = unit_key(chain[r], run r)``; a prefix
ending exactly at a run end gets ``chain[r + 1]``, as it must).  Building a
request costs one ``unit_key`` per *run* (a Mooncake prompt: ~25 runs against
~200 units), and a key costs one ``unit_key`` when somebody asks for it: the
lookup walks, and the block ends the cache registers.  The keys inside one run
share everything ``unit_key`` absorbs before the length, so each run keeps that
state (``unit_pre(chain[r], stream_r, start_r)``) and a key only finishes it
(``unit_end``): about half the arithmetic of a whole ``unit_key``.  A 57,600-token system
prompt is one run: its keys need no chain walk and no memo.

``unit_key`` is a 57-bit state in two lanes modulo the primes ``P1 < 2**29``
and ``P2 < 2**28``.  Every input is absorbed into both lanes by affine steps
that cross-feed the lanes, then each lane is cubed (a permutation, as
``P % 3 == 2``), so for fixed inputs the step is a bijection of the state: two
different prefixes before a run never merge by extending them with the same
piece, and two prefixes coincide only if a step maps them to the same state
(~1 in 2**57).  Over a million-request trace (~1e8 distinct prefixes, a pool
of ~1e5 cached blocks, ~2e8 probes) the chance of even one false hit is
~1e-4.  Every value stays below 2**62, so the compiled build (sim/native.py)
computes a key in machine integers with no allocation, and
``key << GROUP_BITS | group`` still fits: a key costs ~210 CPU instructions
there.  Keys are plain integers: equal across processes, runs and builds.
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

LITERAL: Final = -1          # stream id of literal token ids (position = token id)
ROOT: Final = 0              # key of the empty prefix

Run = tuple[int, int, int]  # (stream id, start position in stream, length)

# unit_key's lanes: primes just below 2**29 and 2**28 with P % 3 == 2, and bases
P1: Final = 536_870_909      # 2**29 - 3
P2: Final = 268_435_367      # 2**28 - 89
B1: Final = 208_919_972
B2: Final = 223_891_578
KEY_SPACE: Final = P1 * P2   # keys lie in [0, KEY_SPACE), below 2**57


def unit_key(parent: i64, stream: i64, start: i64, length: i64) -> i64:
    """The key of a unit of ``length`` tokens of ``stream`` from ``start``, after
    the prefix keyed ``parent`` (see the module docstring).

    ``i64``: 64-bit machine integers in the compiled build, plain ints in the
    source; no intermediate value reaches 2**62, so both compute the same."""
    return unit_end(unit_pre(parent, stream, start), length)


def unit_pre(parent: i64, stream: i64, start: i64) -> i64:
    """``unit_key``'s state after absorbing ``parent``, ``stream`` and ``start``: the
    part every key inside one run shares (a run's keys differ only in ``length``), so
    a run computes it once (``PrefixKeys.pre``) and each key finishes it with
    ``unit_end``.  Packed as ``a << 28 | b`` (a < 2**29, b < 2**28: shifts, no
    division, unpack it)."""
    p = parent
    a: i64 = p // P2
    b: i64 = p - a * P2
    a = (a * B1 + b + stream) % P1
    b = (b * B2 + a + stream) % P2
    a = (a * B1 + b + start) % P1
    b = (b * B2 + a + start) % P2
    return (a << 28) | b


def unit_end(pre: i64, length: i64) -> i64:
    """The key ``unit_key`` makes from ``unit_pre``'s state and ``length``."""
    a: i64 = pre >> 28
    b: i64 = pre & 0xFFFFFFF
    a = (a * B1 + b + length) % P1
    b = (b * B2 + a + length) % P2
    a = a * a % P1 * a % P1
    b = b * b % P2 * b % P2
    return a * P2 + b


def canonical_runs(runs: list[Run]) -> list[Run]:
    """Merge adjacent runs that continue the same stream; drop empty runs.

    Two descriptions of the same token sequence must hash identically, so
    runs are made maximal before hashing.
    """
    out: list[Run] = []
    ps = pst = pn = -1          # (no run yet: pst + pn = -2 is no run's start)
    for run in runs:
        s, st, n = run
        if n <= 0:
            continue
        if ps == s and pst + pn == st:
            pn += n
            out[-1] = (s, pst, pn)
            continue
        out.append(run)          # (the caller's tuple: no new one, no re-boxing)
        ps, pst, pn = s, st, n
    return out


def _last_below(begins: vec[i64], e: i64, lo: i64, hi: i64) -> i64:
    """The last index in ``[lo, hi]`` whose begin is below ``e`` (``begins`` is
    increasing and ``begins[lo] < e``)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if begins[mid] < e:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixKeys:
    """The keys of one request's token sequence at the hash unit (vLLM's
    ``request.block_hashes``), computed on demand.

    ``count`` is the number of hashes vLLM would hold: unit *i* is emitted
    once its tokens and the lookahead after it exist.  ``key(i)`` is the key
    of the prefix ``[0, (i + 1) * unit + lookahead)``.  The runs are held as
    columns (stream, start, first token), so appending output tokens that
    continue the last run -- every decode step -- only moves ``total``.
    """

    def __init__(self, runs: list[Run], unit: int, lookahead: int):
        """``runs``: any description of the tokens; made canonical here (empty runs
        dropped, a run continuing the previous one merged into it), as
        ``canonical_runs`` does."""
        # (plain ints, not i64: callers build bit masks and products of them that
        # must not wrap; the walks copy them into machine-integer locals)
        self.unit = unit
        self.lookahead = lookahead
        # The columns are librt vecs of machine integers: no boxed int per value in
        # the compiled build (every value lies in [-2**62, 2**62); keys below 2**57)
        self.streams = vec[i64]()
        self.starts = vec[i64]()
        self.begins = vec[i64]()       # begins[r]: first token of run r in the sequence
        # pre[r]: unit_pre(key of the runs before run r, stream, start): a key inside
        # run r is unit_end(pre[r], key end - begins[r])
        self.pre = vec[i64]()
        self.cursor: i64 = 0           # run of the last key asked for (walks are local)
        # tokens and emitted units (machine integers: read at every lookup and caching
        # call; a shift or a product a caller builds of them stays far below 2**62)
        self.total: i64 = 0
        self.count: i64 = 0
        # the total at which ``count`` next grows: appending tokens below it leaves the
        # count as it is, with no division (``append_run``, every decode step)
        self.count_end: i64 = 0
        # the last run's stream and the stream position that would continue it (when
        # there is a run), kept by ``_set_total``: ``append_run``'s test for a continued
        # run without reading three columns
        self.tail_stream: i64 = 0
        self.tail_next: i64 = -1
        # the keys at the ends of blocks 0 .. len(memo) - 1 of ``memo_scale`` units (0:
        # none kept), filled by the CPU tier's connector (``memo_block_keys``: every
        # complete chunk's key at a request's first lookup); the GPU cache's walks at
        # that scale read them there instead of hashing the same keys again
        self.memo = vec[i64]()
        self.memo_scale: i64 = 0
        if runs:
            streams = vec[i64]()
            starts = vec[i64]()
            lengths = vec[i64]()
            for s, st, n in runs:
                streams = append(streams, s)
                starts = append(starts, st)
                lengths = append(lengths, n)
            self.extend_columns(streams, starts, lengths)
        else:
            self._set_total(0)

    def extend_columns(self, streams_in: vec[i64], starts_in: vec[i64],
                       lengths_in: vec[i64]) -> None:
        """Append the runs ``(streams_in[i], starts_in[i], lengths_in[i])`` in
        order, kept canonical: an empty run is dropped, a run continuing the
        last one is merged into it (``canonical_runs``'s rule; one ``append_run``
        per run, without a call per run)."""
        last = len(self.begins) - 1
        have = last >= 0
        if not have:
            # fresh columns sized for these runs and a few more (a request's outputs
            # add one run per step at most: usually one stream continued)
            cap = len(lengths_in) + 4
            self.streams = vec[i64](capacity=cap)
            self.starts = vec[i64](capacity=cap)
            self.begins = vec[i64](capacity=cap)
            self.pre = vec[i64](capacity=cap)
        streams = self.streams
        starts = self.starts
        begins = self.begins
        pre = self.pre
        total: i64 = self.total
        ps: i64 = 0                    # the last run: stream, start, first token, state
        pst: i64 = 0
        pb: i64 = 0
        pp: i64 = 0
        p: i64 = ROOT
        if have:
            ps = streams[last]
            pst = starts[last]
            pb = begins[last]
            pp = pre[last]
        for i in range(len(lengths_in)):
            n = lengths_in[i]
            if n <= 0:
                continue
            s = streams_in[i]
            st = starts_in[i]
            if have:
                if s == ps and pst + (total - pb) == st:
                    total += n         # continues the last run: merged
                    continue
                p = unit_end(pp, total - pb)
            pp = unit_pre(p, s, st)
            streams = append(streams, s)
            starts = append(starts, st)
            begins = append(begins, total)
            pre = append(pre, pp)
            ps = s
            pst = st
            pb = total
            have = True
            total += n
        self.streams = streams
        self.starts = starts
        self.begins = begins
        self.pre = pre
        self._set_total(total)

    def extend_ids(self, first_stream: i64, ids: vec[i64], used: i64, block: i64,
                   last: i64) -> None:
        """Append the runs ``(first_stream - ids[i], 0, block)`` for ``i < used``, the
        last one ``last`` tokens long: a block-hash trace's prompt read from its ids
        (``prompt.HashIdPrompt``), with no column of runs built first.  What
        ``extend_columns`` makes of those runs when the columns are empty: no run of
        them is empty, and none continues the one before it (each starts at 0 after
        one of at least one token).  Columns that hold runs take the general way."""
        if len(self.begins) or used <= 0 or block <= 0 or last <= 0:
            streams = vec[i64](capacity=used)
            starts = vec[i64](capacity=used)
            lengths = vec[i64](capacity=used)
            for i in range(used):
                streams = append(streams, first_stream - ids[i])
                starts = append(starts, 0)
                lengths = append(lengths, block if i < used - 1 else last)
            self.extend_columns(streams, starts, lengths)
            return
        cap = used + 4      # (and a few more: the tail, the outputs' runs)
        streams = vec[i64](capacity=cap)
        starts = vec[i64](capacity=cap)
        begins = vec[i64](capacity=cap)
        pre = vec[i64](capacity=cap)
        total: i64 = 0
        p: i64 = ROOT
        for i in range(used):
            s: i64 = first_stream - ids[i]
            if i:
                p = unit_end(p, block)    # (the key after the previous run's block tokens)
            p = unit_pre(p, s, 0)
            streams = append(streams, s)
            starts = append(starts, 0)
            begins = append(begins, total)
            pre = append(pre, p)
            total += block
        self.streams = streams
        self.starts = starts
        self.begins = begins
        self.pre = pre
        self._set_total(total - block + last)

    def _set_total(self, total: i64) -> None:
        """The sequence now has ``total`` tokens: so many units are emitted."""
        self.total = total
        unit: i64 = self.unit
        c: i64 = (total - self.lookahead) // unit
        if c < 0:
            c = 0
        self.count = c
        self.count_end = (c + 1) * unit + self.lookahead
        last: i64 = len(self.begins) - 1
        if last >= 0:
            self.tail_stream = self.streams[last]
            self.tail_next = self.starts[last] + (total - self.begins[last])
        else:
            self.tail_next = -1

    @property
    def runs(self) -> list[Run]:
        """The canonical runs (built on demand: compute backends, tests)."""
        out: list[Run] = []
        last = len(self.begins) - 1
        for r in range(last + 1):
            end = self.begins[r + 1] if r < last else self.total
            out.append((self.streams[r], self.starts[r], end - self.begins[r]))
        return out

    def append_run(self, stream: i64, start: i64, n: i64) -> None:
        """Append ``n`` tokens of ``stream`` from ``start`` (merged into the last
        run when they continue it, so the runs stay canonical)."""
        total: i64 = self.total
        nxt: i64 = self.tail_next
        if start == nxt and stream == self.tail_stream and len(self.begins) > 0:
            # the last run grows (once per request per step): the count only moves
            # once the total reaches ``count_end``
            total += n
            if n >= 0 and total < self.count_end:
                self.total = total
                self.tail_next = nxt + n
            else:
                self._set_total(total)
            return
        last: i64 = len(self.begins) - 1
        p: i64 = ROOT
        if last >= 0:
            p = unit_end(self.pre[last], total - self.begins[last])
        self.pre = append(self.pre, unit_pre(p, stream, start))
        self.streams = append(self.streams, stream)
        self.starts = append(self.starts, start)
        self.begins = append(self.begins, total)
        self._set_total(total + n)

    def locate(self, e: i64) -> i64:
        """The run holding token ``e - 1`` (``0 < e <= total``): ``begins[r] < e <=
        begins[r + 1]`` (``run_at``'s search, which keeps the run it found)."""
        self.run_at(e)
        return self.cursor

    def run_at(self, e: i64) -> tuple[i64, i64, i64]:
        """What a key ending at token ``e`` needs of the run holding token ``e - 1``:
        ``(pre, begin, end)``; every key ending in ``(begin, end]`` is
        ``unit_end(pre, key end - begin)``, so walks over consecutive keys search the
        runs once per run (``keys_at``, and the lookups in ``managers``)."""
        # (walks are local: look next to the last run asked for before searching)
        begins = self.begins
        last: i64 = len(begins) - 1
        r: i64 = self.cursor
        if r > last:
            r = last
        if r < last and begins[r + 1] < e:
            r += 1
            steps: i64 = 0
            while r < last and begins[r + 1] < e:
                if steps == 4:
                    r = _last_below(begins, e, r + 1, last)
                    break
                r += 1
                steps += 1
        elif begins[r] >= e:
            r -= 1
            if begins[r] >= e:
                r = _last_below(begins, e, 0, r - 1)
        self.cursor = r
        end: i64 = self.total
        if r < len(begins) - 1:
            end = begins[r + 1]
        return self.pre[r], begins[r], end

    def key(self, i: i64) -> i64:
        """The key of unit ``i`` (``0 <= i < count``; IndexError otherwise, as
        vLLM's hash list raises)."""
        if i < 0 or i >= self.count:
            raise IndexError("list index out of range")
        ms = self.memo_scale
        if ms:
            # (a block end the CPU tier's connector keyed already)
            q: i64 = i + 1
            if q <= len(self.memo) * ms:
                c: i64 = q // ms
                if c * ms == q:
                    return self.memo[c - 1]
        e: i64 = (i + 1) * self.unit + self.lookahead
        pre, b0, _end = self.run_at(e)
        return unit_end(pre, e - b0)

    def keys_at(self, units: list[int]) -> list[int]:
        """``[key(i) for i in units]`` for increasing ``units`` (each < ``count``),
        walking the runs left to right: one run search per run, not per key."""
        out: list[int] = []
        if not units:
            return out
        if units[-1] >= self.count or units[0] < 0:
            raise IndexError("list index out of range")
        unit = self.unit
        la = self.lookahead
        pre: i64 = 0
        b0: i64 = 0
        nxt: i64 = -1    # last token of the located run (-1: none located yet)
        for i in units:
            e = (i + 1) * unit + la
            if e > nxt:
                pre, b0, nxt = self.run_at(e)
            out.append(unit_end(pre, e - b0))
        return out

    def block_keys(self, first: i64, last: i64, scale: i64) -> vec[i64]:
        """The keys at the ends of blocks ``first`` .. ``last - 1`` of ``scale`` units
        (units ``(j + 1) * scale - 1``; each < ``count``), as ``keys_at`` walks them, in
        a vec: machine integers, no boxed key (the cache's block registration)."""
        memo = self.memo
        if scale == self.memo_scale and 0 <= first and last <= len(memo):
            out = vec[i64](capacity=last - first if last > first else 0)
            for j in range(first, last):
                out = append(out, memo[j])
            return out
        return self.add_block_keys(vec[i64](), first, last, scale)

    def memo_block_keys(self, last: i64, scale: i64) -> vec[i64]:
        """The keys at the ends of blocks 0 .. ``last - 1`` of ``scale`` units, kept
        (``memo``: the first scale asked for; another is computed anew each time, into a
        new vec) and returned: a vec the caller only reads."""
        if self.memo_scale == 0:
            self.memo_scale = scale
        if scale != self.memo_scale:
            return self.add_block_keys(vec[i64](), 0, last, scale)
        memo = self.memo
        if len(memo) < last:
            memo = self.memo = self.add_block_keys(memo, len(memo), last, scale)
        return memo

    def add_block_keys(self, out: vec[i64], first: i64, last: i64, scale: i64) -> vec[i64]:
        """``out`` with ``block_keys(first, last, scale)`` appended (the CPU tier's chunk
        keys, grown as the request's hashes are)."""
        if first >= last:
            return out
        if (last * scale - 1 >= self.count) or first < 0:
            raise IndexError("list index out of range")
        step: i64 = scale * self.unit
        e: i64 = (first + 1) * step + self.lookahead
        pre: i64 = 0
        b0: i64 = 0
        nxt: i64 = -1    # last token of the located run (-1: none located yet)
        j = first
        while j < last:
            if e > nxt:
                pre, b0, nxt = self.run_at(e)
            out = append(out, unit_end(pre, e - b0))
            e += step
            j += 1
        return out

    def keys(self) -> list[int]:
        """Every emitted key, in order (tests and tools)."""
        out: list[int] = []
        for i in range(self.count):
            out.append(self.key(i))
        return out


class PrefixHasher:
    """The hash unit and lookahead of one cache manager: makes each request's
    ``PrefixKeys``."""

    def __init__(self, unit: int, lookahead: int = 0):
        if unit <= 0:
            raise ValueError("hash unit must be positive")
        if lookahead < 0:
            raise ValueError("num_hash_lookahead_tokens must be >= 0")
        self.unit = unit
        self.lookahead = lookahead

    def keys_of(self, runs: list[Run]) -> PrefixKeys:
        """Keys over the token sequence ``runs`` (any description)."""
        return PrefixKeys(runs, self.unit, self.lookahead)

    def hashes(self, runs: list[Run]) -> list[int]:
        """All emitted keys of the token sequence ``runs`` (any description)."""
        return PrefixKeys(runs, self.unit, self.lookahead).keys()
