"""The scheduler limits each input dialect assumes when a file leaves them out, in one
table: a scenario describes a served model (vLLM's ``vllm serve`` defaults), a step case
one of vLLM's scheduler tests (its test helpers' small batches), a case file one request
at a time with no budget to speak of (the cache model alone).  The three parsers build
their limits with ``sim.config.scheduler.build_scheduler``, which reads their row here:
the checks are the same for all three, only these defaults differ."""
from __future__ import annotations

from typing import Final

DIALECT_DEFAULTS: Final[dict[str, dict[str, int]]] = {
    "scenario": {"max_num_batched_tokens": 8192, "max_num_seqs": 256,
                 "long_prefill_token_threshold": 0},
    "step case": {"max_num_batched_tokens": 8192, "max_num_seqs": 16,
                  "long_prefill_token_threshold": 0},
    # (one request at a time: a case file sets no max_num_seqs of its own)
    "case file": {"max_num_batched_tokens": 1 << 20, "max_num_seqs": 1,
                  "long_prefill_token_threshold": 0},
}
