"""Model catalogue and vLLM's KV-cache page / block-size derivation for hybrid models.

Ground truth is ``docs/models.md`` (§1 page sizing, §2 shapes, §3 bytes, §4 block sizes,
§5 MTP), cross-checked against the source of vLLM 0.33.0 (the release the cache model follows).
Where the two disagree the vLLM 0.33.0 behaviour is implemented and the spot is marked
``vLLM 0.33.0:`` in the modules.

* ``spec`` -- :class:`ModelSpec`, one model's shapes (one catalogue entry or an inline
  definition), and its dtypes.
* ``catalogue`` -- :func:`get_model` / :func:`model_from_mapping`: look one up / build one
  from a mapping.
* ``layout`` -- :func:`derive_layout`: the page sizes and the attention block size vLLM picks
  (``Platform._align_hybrid_block_size``), with the steps written out in ``KVLayout.derivation``.
* ``drafter`` -- the speculative method vLLM runs for a model (what it refuses) and the
  drafter layers (MTP module, EAGLE head) it adds to the pool.
* ``pool`` -- how pages of different layers are unified and split into KV-cache groups.
* ``describe`` -- :func:`describe`: the text ``sim model NAME`` prints.

``tools/check_layout_vs_vllm.py`` checks ``derive_layout`` against vLLM 0.33.0's own derivation
(golden table ``tests/models/layout_vllm_golden.csv``).

Parameter counts (``total_params``, ``active_params``, ``mtp_params``) are *estimated from the
shapes* (projection matrices, embeddings, norms; biases and small gates ignored), not read from
checkpoints; they agree with the published sizes to a few per cent and are meant for weight
bytes and FLOPs only.

The package's public names are importable from ``sim.models`` itself.
"""
from __future__ import annotations

from sim.models.catalogue import CATALOGUE, get_model, model_from_mapping, model_names
from sim.models.describe import describe
from sim.models.layout import KVLayout, derive_layout, pool_groups
from sim.models.spec import DTYPE_BYTES, ModelSpec, UnknownModelError, resolve_dtype

__all__ = [
    "ModelSpec", "KVLayout", "UnknownModelError", "CATALOGUE", "model_names", "get_model",
    "model_from_mapping", "derive_layout", "describe", "resolve_dtype", "DTYPE_BYTES",
    "pool_groups",
]
