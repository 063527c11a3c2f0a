"""The cache model's view of a request: tokens as runs, hashes, progress."""
from __future__ import annotations

from sim.cache.hashing import PrefixHasher, Run, canonical_runs


class CacheRequest:
    """What the KV-cache manager needs to know about one request.

    ``runs`` describe the token sequence (prompt, then any output tokens);
    ``block_hashes`` are its chained hashes at the hash unit, extended as
    tokens are appended.  ``num_computed_tokens`` is advanced by the caller
    (scheduler or case runner) *after* each ``allocate_slots``, as vLLM does.
    """

    __slots__ = ("request_id", "runs", "num_prompt_tokens", "num_tokens", "block_hashes",
                 "num_computed_tokens", "shared_prefix_boundary", "hasher", "report_mode",
                 "waiting")

    def __init__(self, request_id: str, runs: list[Run], hasher: PrefixHasher,
                 report_mode: str | None = None):
        self.request_id = request_id
        self.runs = canonical_runs(runs)   # (a new list: appends never touch the caller's)
        total = 0
        for r in self.runs:
            total += r[2]
        self.num_prompt_tokens = total
        self.num_tokens = self.num_prompt_tokens
        self.hasher = hasher
        self.block_hashes = hasher.hashes(self.runs, canonical=True)
        self.num_computed_tokens = 0
        self.shared_prefix_boundary = 0
        self.report_mode = report_mode
        self.waiting = True

    def append_tokens(self, runs: list[Run]) -> None:
        """Append output tokens; hashes are extended only when a unit completes."""
        for s, st, n in runs:
            self.append_run(s, st, n)

    def append_run(self, stream: int, start: int, n: int) -> None:
        """Append one run of tokens (the engine appends one run of output
        tokens per request per step)."""
        own = self.runs
        ls, lst, ln = own[-1]
        if ls == stream and lst + ln == start:
            own[-1] = (ls, lst, ln + n)
        else:
            own.append((stream, start, n))
        self.num_tokens += n
        h = self.hasher
        if (self.num_tokens - h.lookahead) // h.unit > len(self.block_hashes):
            h.extend(own, self.block_hashes)
