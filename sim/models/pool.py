"""How vLLM 0.33.0 turns the per-layer KV-cache specs of a hybrid model (target attention,
drafter attention, Mamba) into one block pool: page unification and KV-cache groups.

Written from the behaviour of ``vllm/v1/core/kv_cache_planning.py``
(``unify_kv_cache_spec_page_size``, ``_get_kv_cache_groups_uniform_page_size``,
``_get_kv_cache_bytes_per_block``) and ``get_global_kv_cache_groups`` (EAGLE groups), for the
layer-outer KV layouts the attention and Mamba backends of the catalogue models resolve to
(vLLM's default ``LBNHC``; the block-outer packing path is not taken).

Why a separate module: ``layout.py`` derives page and block sizes per layer; this module is
the one place that knows how layers with different pages share one pool.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    """Layers sharing one KV-cache spec after unification (vLLM's ``same_type_layers``)."""

    kind: str            # "attention" (target, with MTP / same-shape drafter layers) | "draft" | "mamba"
    num_layers: int
    block_size: int      # tokens per block of this bucket's groups
    page_bytes: int      # per layer and block, after unification (every bucket: the same)
    draft_layers: int = 0   # of num_layers, how many belong to the drafter (listed last)


@dataclass(frozen=True)
class PoolPlan:
    """The groups one pool block serves (``group_size`` pages, one per layer slot)."""

    group_size: int
    groups: tuple[tuple[str, int, bool], ...]   # per group: (bucket kind, block_size, holds drafter layers)
    padding_layer_slots: int
    page_bytes: int
    pool_block_bytes: int


def unify_pages(pages: dict[str, tuple[int, int, bool]]) -> dict[str, tuple[int, int]]:
    """vLLM's ``unify_kv_cache_spec_page_size`` on one spec per bucket.

    ``pages``: kind -> (page bytes, block size, is Mamba).  Every bucket ends with the largest
    page: a Mamba page is padded to it; an attention page that divides it multiplies its block
    size by the ratio; any other attention page is padded.  Returns kind -> (page, block)."""
    top = max(p for p, _, _ in pages.values())
    out: dict[str, tuple[int, int]] = {}
    for kind, (page, block, mamba) in pages.items():
        if page == top or mamba or top % page:
            out[kind] = (top, block)
        else:
            out[kind] = (top, block * (top // page))
    return out


def group_size_for(counts: list[int]) -> int:
    """The smallest bucket's layer count, or the largest when it is < 1.5x the smallest
    (vLLM's heuristic for drafters that add a few layers to one type)."""
    lo, hi = min(counts), max(counts)
    return hi if hi < lo * 1.5 else lo


def plan_pool(buckets: list[Bucket]) -> PoolPlan:
    """Split every bucket into ``ceil(n / group_size)`` groups of ``group_size`` slots
    (``layers[i::n_groups]``, so drafter layers, last in the bucket, land in the groups
    ``position % n_groups``); one pool block is ``group_size`` pages.  Buckets are given in
    the order the groups are listed."""
    buckets = [b for b in buckets if b.num_layers]
    pages = {b.page_bytes for b in buckets}
    if len(pages) != 1:
        raise ValueError(f"pool: pages not unified ({sorted(pages)})")
    page = pages.pop()
    gs = group_size_for([b.num_layers for b in buckets])
    groups: list[tuple[str, int, bool]] = []
    padding = 0
    for b in buckets:
        n = math.ceil(b.num_layers / gs)
        padding += n * gs - b.num_layers
        drafted = {p % n for p in range(b.num_layers - b.draft_layers, b.num_layers)}
        groups += [(b.kind, b.block_size, i in drafted) for i in range(n)]
    return PoolPlan(group_size=gs, groups=tuple(groups), padding_layer_slots=padding,
                    page_bytes=page, pool_block_bytes=gs * page)


def pool_groups(num_attention_layers: int, num_mamba_layers: int) -> dict[str, int]:
    """vLLM's KV-cache groups for one attention type + one Mamba type (uniform page size).

    vLLM 0.33.0 ``kv_cache_planning._get_kv_cache_groups_uniform_page_size``: group_size = the
    smaller layer count, or the larger one when it is < 1.5x the smaller; each type is split into
    ``ceil(n / group_size)`` groups (layers[i::n_groups]); every group is ``group_size`` layer
    slots wide, so one pool block costs ``group_size`` pages and narrower groups leave slots empty.
    """
    group_size = group_size_for([num_attention_layers, num_mamba_layers])
    ga = math.ceil(num_attention_layers / group_size)
    gm = math.ceil(num_mamba_layers / group_size)
    padding = (ga + gm) * group_size - num_attention_layers - num_mamba_layers
    return {"group_size": group_size, "num_attention_groups": ga, "num_mamba_groups": gm,
            "padding_layer_slots": padding}
