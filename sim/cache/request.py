"""The cache model's view of a request: tokens as runs, prefix keys, progress."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import i64

from sim.cache.hashing import PrefixHasher, PrefixKeys, Run

if TYPE_CHECKING:
    from sim.cache.offload_jobs import ReqOffload


class CacheRequest:
    """What the KV-cache manager needs to know about one request.

    ``runs`` describe the token sequence (prompt, then any output tokens);
    ``block_hashes`` (vLLM's name) gives the keys of its hash units on demand
    and grows as tokens are appended.  ``num_computed_tokens`` is advanced by
    the caller (scheduler or case runner) *after* each ``allocate_slots``, as
    vLLM does.
    """

    __slots__ = ("request_id", "num_prompt_tokens", "num_tokens", "block_hashes",
                 "num_computed_tokens", "shared_prefix_boundary", "hasher", "report_mode",
                 "waiting", "replay", "replay_by", "offload")

    def __init__(self, request_id: str, runs: list[Run] | PrefixKeys, hasher: PrefixHasher,
                 report_mode: str | None = None):
        """``runs``: the prompt as runs, or its keys already built by ``hasher``
        (``StreamRegistry.keys_of``)."""
        self.request_id = request_id
        self.hasher = hasher
        self.block_hashes: PrefixKeys = (runs if isinstance(runs, PrefixKeys)
                                         else hasher.keys_of(runs))
        # (machine integers: no tagged-int checks in the compiled scheduler's arithmetic)
        self.num_prompt_tokens: i64 = self.block_hashes.total
        self.num_tokens: i64 = self.num_prompt_tokens
        self.num_computed_tokens: i64 = 0
        self.shared_prefix_boundary: i64 = 0
        self.report_mode = report_mode
        self.waiting = True
        # the prompt's replay boundaries, as the coordinator ``replay_by`` computed them
        # (``Coordinator.replay``: asked at every caching call of a sparse-retention run)
        self.replay: tuple[int, ...] = ()
        self.replay_by: object = None
        # the CPU tier's state of the request while its connector tracks it (read every
        # step the request is scheduled: no lookup by id)
        self.offload: ReqOffload | None = None

    @property
    def runs(self) -> list[Run]:
        """The token sequence as canonical runs (prompt, then outputs)."""
        return self.block_hashes.runs

    def append_tokens(self, runs: list[Run]) -> None:
        """Append output tokens (runs of them)."""
        for s, st, n in runs:
            self.append_run(s, st, n)

    def append_run(self, stream: i64, start: i64, n: i64) -> None:
        """Append one run of tokens (the engine appends one run of output
        tokens per request per step)."""
        self.block_hashes.append_run(stream, start, n)
        self.num_tokens += n
