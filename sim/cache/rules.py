"""Small position rules shared by the cache managers and the scheduler split.

Each is a pure function of integers, named as vLLM names the behaviour.
"""
from __future__ import annotations

from mypy_extensions import i64


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mamba_checkpoint_position(num_tokens: i64, unit: i64, drop_eagle: bool,
                              lookahead: i64 = 0, rule: str = "v0.33") -> i64:
    """Where a prompt of ``num_tokens`` keeps its reusable Mamba state.

    ``v0.33`` (vLLM 0.33.0, ``get_mamba_prefill_checkpoint_position``): one
    token (or the lookahead) is left for logits and the checkpoint's own hash;
    with the legacy EAGLE drop the state sits one unit below the prompt tail,
    where an EAGLE consumer resumes.

    ``seed`` (the rule before the fix the seed PR asked for): the state sits at
    the prompt tail on the ``unit`` grid, so an EAGLE consumer that drops one
    unit finds no state there.

    (Machine integers, and statements rather than ``max``: this runs a few times per
    scheduled prefill chunk; Python ints cost reference counts and calls here.)
    """
    if rule == "seed":
        tail = (num_tokens - lookahead) // unit * unit
        if tail < 0:
            tail = 0
        return tail
    proof_limit = num_tokens
    if not drop_eagle:
        if lookahead > 1:
            proof_limit -= lookahead
        else:
            proof_limit -= 1
    pos = proof_limit // unit * unit
    if drop_eagle:
        pos -= unit
    if pos < 0:
        pos = 0
    return pos


def prefill_checkpoint_valid(query_start: i64, query_end: i64, checkpoint: i64,
                             hash_block_size: i64, mamba_block_size: i64,
                             alignment: i64) -> bool:
    """Whether a prefill chunk ``[query_start, query_end)`` can export its Mamba
    state at ``checkpoint`` from inside the chunk (vLLM 0.33.0,
    ``is_mamba_prefill_checkpoint_valid``; ``alignment`` 0 is vLLM's None).

    The chunk must start on the hash grid, the exported column must lie past
    the column the chunk starts from, the checkpoint must be at least one hash
    unit into the chunk and strictly inside it, on the backend's alignment."""
    if alignment <= 0:
        return False
    initial_col = (query_start - 1) // mamba_block_size
    checkpoint_col = -(-query_end // mamba_block_size) - 2
    return (query_start % hash_block_size == 0
            and checkpoint_col > initial_col
            and query_start + hash_block_size <= checkpoint
            and query_start < checkpoint < query_end
            and (checkpoint - query_start) % alignment == 0)


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int,
                      use_eagle: bool) -> tuple[int, ...]:
    """Positions a later request replaying this prompt can resume at.

    A resend of the identical prompt is capped at ``n - 1``; a longer sibling
    matches the final aligned block.  EAGLE groups keep the block below both.
    Used by sparse retention (``prefix_cache_retention_interval`` 0 or N).
    """
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    b = scheduler_block_size
    resend = (num_prompt_tokens - 1) // b * b
    extension = num_prompt_tokens // b * b
    # the two positions, sorted, once each (no set and no sort: generic calls in the
    # compiled build, ~7k CPU instructions a request)
    lo = resend - b if resend > b else 0
    hi = extension - b if extension > b else 0
    if lo == hi:
        return (lo,)
    return (lo, hi) if lo < hi else (hi, lo)


def eagle_proof_margin(block_size: int, unit: int, fine_grained: bool) -> int:
    """Tokens an EAGLE group may match past a candidate before dropping them."""
    if fine_grained and block_size > unit:
        return unit
    return block_size
