"""The ``scheduler`` section of a scenario (vLLM ``SchedulerConfig`` names).

A plain frozen dataclass: the compiled scheduler copies its fields into typed
attributes of its own once, at construction (``sim/engine/scheduler.py``), so the
per-step reads stay native."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    num_speculative_tokens: int = 0
    # vLLM's max_model_len: prompts of this length or more are rejected (as the API server
    # does), outputs stop there, and positions of running requests stay below it.  None:
    # no limit (a server started with a large --max-model-len).
    max_model_len: int | None = None
