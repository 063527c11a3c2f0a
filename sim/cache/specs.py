"""The frozen specs at the bottom of the cache: what one KV-cache group is
(vLLM's ``kv_cache_interface.py`` specs, as far as hit lengths need them).

Compiled with the hot path (``sim/native.py``): managers and the coordinator
read these fields on every lookup."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GroupSpec:
    """A KV-cache group: ``kind`` is full | swa | mamba."""

    kind: str
    block_size: int
    window: int = 0
    mamba_mode: str = "align"
    # vLLM's MambaSpec.num_prefill_checkpoint_blocks / prefill_checkpoint_alignment:
    # a Mamba layer that can export its state inside a prefill chunk (MambaMixer2,
    # GDN with a checkpoint-exporting prefill) reserves that many blocks per chunk.
    # ``prefill_checkpoint_alignment`` 0 stands for vLLM's None (no checkpoints).
    prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int = 0

    @property
    def label(self) -> str:
        return f"swa:{self.window}" if self.kind == "swa" else self.kind
