"""The speculative method vLLM 0.33.0 runs for a model, and the drafter layers it adds to
the KV pool (``Drafter``).

Why its own module: which drafter a setting means (MTP module, EAGLE head, none) and what vLLM
refuses for it are questions of the model class, asked before any page is sized.

* ``mtp``: the model's own MTP module; its attention layers (``ModelSpec.mtp_pattern``) have the
  target's attention shape.
* ``eagle`` / ``eagle3``: an EAGLE head of ``draft_num_layers`` decoder layers with its own
  KV heads and head size (default: the catalogue's ``draft_*``, else one layer shaped like the
  target's attention).  vLLM refuses a variant the model class does not declare
  (``SupportsEagle`` / ``SupportsEagle3``; EAGLE-3 fails at model load without it).
* ``ngram`` / ``suffix`` (and ``external``, a drafter whose KV lives outside this pool): no
  drafter layers in the pool; the Mamba state still keeps ``k`` speculative rows and blocks.
* ``draft_model``: a whole second model's layers join the pool; not modelled, refused.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.models.spec import ModelSpec

SPEC_METHODS = ("auto", "mtp", "eagle", "eagle3", "ngram", "suffix", "external", "draft_model")


@dataclass(frozen=True)
class Drafter:
    """The resolved method and the attention layers its drafter puts in the pool."""

    method: str | None        # None without speculative decoding
    why: str                  # how ``auto`` was resolved (for the derivation text)
    mtp_attention_layers: int = 0
    eagle_layers: int = 0
    kv_heads: int = 0         # the EAGLE head's total KV heads
    head_dim: int = 0


def check_kv_heads(what: str, kv_heads: int, tp: int) -> None:
    """vLLM's ``QKVParallelLinear``: TP must divide the KV heads, or they divide TP
    (replicated, one per rank)."""
    if (kv_heads % tp) if tp < kv_heads else (tp % kv_heads):
        raise ValueError(f"{what}: {kv_heads} KV heads cannot be split over TP {tp} "
                         f"(vLLM needs one to divide the other)")


def resolve_drafter(m: ModelSpec, *, k: int, method: str, tp: int,
                    draft_num_layers: int | None = None, draft_num_kv_heads: int | None = None,
                    draft_head_dim: int | None = None) -> Drafter:
    """Resolve ``method`` for ``m`` and check it as vLLM would (``ValueError`` naming the
    setting: ``speculative_method``, ``draft_*``, ``tp``)."""
    if method not in SPEC_METHODS:
        raise ValueError(f"speculative_method: must be one of {', '.join(SPEC_METHODS)}, "
                         f"got {method!r}")
    draft = {"draft_num_layers": draft_num_layers, "draft_num_kv_heads": draft_num_kv_heads,
             "draft_head_dim": draft_head_dim}
    for name, v in draft.items():
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{name}: must be an integer >= 1, got {v!r}")
    if k == 0:
        if method not in ("auto", "external"):
            raise ValueError(f"speculative_method: {method!r} needs num_speculative_tokens >= 1")
        resolved, why = None, "none"
    elif method == "auto":
        if m.mtp_layers:
            resolved, why = "mtp", "auto -> mtp (the model ships MTP layers)"
        elif m.eagle_methods:
            resolved = m.eagle_methods[0]
            why = f"auto -> {resolved} (a default EAGLE head)"
        else:
            resolved = "ngram"
            why = f"auto -> ngram ({m.name} supports no EAGLE drafter in vLLM 0.33.0)"
    else:
        resolved, why = method, "set"
    if resolved == "draft_model":
        raise ValueError("speculative_method: draft_model is not modelled (a whole draft model's "
                         "layers join the pool); describe its attention as an EAGLE drafter")
    if resolved == "mtp" and not m.mtp_layers:
        raise ValueError(f"speculative_method: {m.name} has no MTP layers")
    if resolved in ("eagle", "eagle3") and resolved not in m.eagle_methods:
        iface, name = {"eagle": ("SupportsEagle", "EAGLE"), "eagle3": ("SupportsEagle3", "EAGLE-3")}[resolved]
        raise ValueError(f"speculative_method: {m.vllm_architecture or m.name} does not declare "
                         f"{iface} in vLLM 0.33.0, so it serves no {name} drafter (supported: "
                         f"{', '.join(m.eagle_methods) or 'none'})")
    given = [name for name, v in draft.items() if v is not None]
    if given and resolved not in ("eagle", "eagle3"):
        raise ValueError(f"{given[0]}: only an EAGLE drafter (eagle, eagle3) takes drafter "
                         f"settings, not {resolved or 'no speculative decoding'}")
    if resolved == "mtp":
        return Drafter(resolved, why, mtp_attention_layers=m.mtp_attention_layers)
    if resolved in ("eagle", "eagle3"):
        kv = draft_num_kv_heads or m.draft_num_kv_heads or m.kv_heads
        check_kv_heads("draft_num_kv_heads", kv, tp)
        return Drafter(resolved, why, eagle_layers=draft_num_layers or m.draft_num_layers,
                       kv_heads=kv, head_dim=draft_head_dim or m.draft_head_dim or m.head_dim)
    return Drafter(resolved, why)
