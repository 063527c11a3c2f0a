"""Where a prefill chunk must end so Mamba states land where they can be reused.

vLLM 0.33.0's ``Scheduler._mamba_block_aligned_split`` (align mode), applied
after the ``long_prefill_token_threshold`` and token-budget caps.  Mamba state
is written only at chunk ends, so non-final chunks are floored to the block
grid, and the chunk stops early at the first mandatory position strictly
inside it: the next block boundary (chunk starting mid-block), the last
cacheable block position, the prompt checkpoint on the hash grid
(fine-grained mode) and the junction (exact with the shared-prefix flag,
block-floored without it).

With internal prefill checkpoints (every Mamba group reserves
``num_prefill_checkpoint_blocks``) the backend exports the prompt's reusable
state from inside the final chunk, so when that is possible
(``is_mamba_prefill_checkpoint_valid``) the final chunk drops the last-cache,
prompt-tail and mid-block stops (vLLM's ``use_internal_checkpoint``).
"""
from __future__ import annotations

from dataclasses import dataclass

from mypy_extensions import i64

from sim.cache.rules import mamba_checkpoint_position, prefill_checkpoint_valid


@dataclass(frozen=True)
class SplitPolicy:
    block_size: int            # scheduler block size (lcm of group block sizes)
    hash_block_size: int
    partial_hits: bool         # fine-grained (sub-block) hits are on
    drop_eagle: bool           # legacy EAGLE drop (not lookahead hashes)
    lookahead: int             # num_hash_lookahead_tokens
    shared_prefix_checkpoint: bool
    checkpoint_rule: str = "v0.33"
    # every Mamba group reserves internal prefill checkpoint blocks, and the first
    # Mamba group's alignment (0: none), as vLLM's Scheduler derives them
    prefill_checkpoints: bool = False
    prefill_checkpoint_alignment: int = 0

    def split(self, num_prompt: i64, num_tokens: i64, num_computed: i64, junction: i64,
              num_new: i64, new_local: i64, max_scheduled: i64, long_prefill: i64) -> i64:
        # (machine integers and statements, not min/max or conditional expressions:
        # Python ints here cost reference counts, and a product with a negative factor,
        # as the junction floor's when the junction lies below the start, a call into
        # CPython's long arithmetic)
        start = num_computed + new_local
        prefill_end = num_tokens - 1
        if prefill_end < num_prompt:
            prefill_end = num_prompt
        if start >= prefill_end:
            return num_new
        bs: i64 = self.block_size
        la: i64 = self.lookahead
        # the last cacheable block position and the prompt tail (a few integer operations:
        # cheaper than any memo of them)
        rule = self.checkpoint_rule
        last_cache = mamba_checkpoint_position(num_tokens, bs, self.drop_eagle, la, rule)
        tail: i64 = 0
        if self.partial_hits:
            tail = mamba_checkpoint_position(num_prompt, self.hash_block_size, self.drop_eagle,
                                             la, rule)
        end = start + num_new
        internal = False
        if self.prefill_checkpoints and end >= prefill_end:
            unit: i64 = bs
            if self.partial_hits:
                unit = self.hash_block_size
            ckpt = mamba_checkpoint_position(prefill_end, unit, self.drop_eagle, la, rule)
            internal = prefill_checkpoint_valid(start, end, ckpt, self.hash_block_size, bs,
                                                self.prefill_checkpoint_alignment)
            if internal:
                last_cache = 0
                tail = 0
        if end < prefill_end:
            limit = max_scheduled
            if 0 < long_prefill < limit:
                limit = long_prefill
            aligned = end // bs * bs
            if aligned > start or bs <= limit:
                end = aligned
        next_boundary = (start // bs + 1) * bs
        floored = start + (junction - start) // bs * bs
        junction_stop = floored
        if self.shared_prefix_checkpoint and junction <= num_prompt:
            junction_stop = junction
        # the first mandatory stop strictly inside (start, end), if any
        stop = end
        if start % bs != 0 and not internal and start < next_boundary < stop:
            stop = next_boundary
        if start < last_cache < stop:
            stop = last_cache
        if last_cache < tail < num_prompt and start < tail < stop:
            stop = tail
        if start < junction < end and start < junction_stop < stop:
            stop = junction_stop
        got = stop - start
        if got < 0:
            got = 0
        return got
