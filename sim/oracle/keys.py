"""The one table from the simulator's case keys to the vLLM oracle's case keys.

The oracle (``$VLLM_ORACLE_DIR``) has two drivers with their own key names: ``oracle.py``
(vLLM's real KV-cache manager, what ``sim case`` models) and ``sched_oracle.py`` (its real
scheduler, what ``sim steps`` models).  Every translation between our ``config:`` keys and
theirs -- the differential testers, ``sim validate``, the golden makers -- reads this table,
so a key is named in exactly one place.  A row with ``None`` in a column has no counterpart
in that driver: a case that sets it cannot be sent there (``OracleKeyError``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KV = "oracle"              # module name of the KV-cache manager driver
STEPS = "sched_oracle"     # module name of the scheduler driver
OFFLOAD = "offload_oracle"  # the scheduler driver with the CPU tier (OffloadingConnector)
ORACLES = (KV, STEPS, OFFLOAD)
SAME = object()   # (a row's offload name: the scheduler driver's)

OMIT = object()   # "no value": the key is left out rather than written


class OracleKeyError(KeyError):
    """A case key the chosen oracle driver has no counterpart for."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Key:
    """One row: our key, its name in each driver, and ``oracle.py``'s default for it.

    ``kv_default`` is the value ``oracle.py`` uses when a case leaves the key out; it is what
    ``tools/make_goldens.py`` writes into a golden case (``OMIT``: write nothing).
    ``none_is_default``: our ``None`` means "the driver's own default" (block / gcd), so the
    key is left out of the oracle case rather than sent as ``null``.  ``offload``: the name
    in ``offload_oracle.py``, which takes every key of the scheduler driver and the tier's
    (``SAME``: the scheduler driver's name)."""
    ours: str
    kv: str | None
    steps: str | None
    kv_default: Any = OMIT
    none_is_default: bool = False
    offload: Any = SAME

    def oracle_name(self, oracle: str) -> str | None:
        if oracle == KV:
            return self.kv
        if oracle == OFFLOAD and self.offload is not SAME:
            return self.offload
        return self.steps


# Row order is the order tools/make_goldens.py writes a golden case's config in.
KEYS: tuple[Key, ...] = (
    Key("groups", "layout", "layout", kv_default=["full", "mamba"]),
    Key("block_size", "block", "block", kv_default=16),
    Key("mamba_block_size", "mamba_block", "mamba_block", none_is_default=True),
    Key("hash_block_size", "hash", "hash", none_is_default=True),
    Key("eagle", "eagle", "eagle", kv_default=False),
    Key("shared_prefix_checkpoint", "shared_prefix_checkpoint", "shared_prefix_checkpoint",
        kv_default=False),
    Key("mamba_cache_mode", "mamba_mode", "mamba_mode", kv_default="align"),
    Key("num_blocks", "num_blocks", "num_blocks", kv_default=256),
    Key("schedule", "schedule", None, kv_default="scheduler"),
    Key("long_prefill_token_threshold", "long_prefill_token_threshold",
        "long_prefill_token_threshold", kv_default=0),
    Key("max_num_batched_tokens", "max_num_scheduled_tokens", "max_num_batched_tokens",
        kv_default=1 << 20),
    Key("report_mode", "report_mode", "report_mode", kv_default=None),
    Key("prefix_cache_retention_interval", "retention", "retention", kv_default=None),
    Key("num_hash_lookahead_tokens", "lookahead", None, kv_default=0),
    # the scheduler driver only
    Key("eagle_lookahead_hashes", None, "eagle_lookahead_hashes"),
    Key("max_num_seqs", None, "max_num_seqs"),
    Key("num_speculative_tokens", None, "num_speculative_tokens"),
    Key("accepted_tokens", None, "accepted_tokens"),
    Key("max_model_len", None, "max_model_len"),
    # internal prefill checkpoints (vLLM's MambaSpec fields on every Mamba group; 0 = off)
    Key("num_prefill_checkpoint_blocks", "num_prefill_checkpoint_blocks",
        "num_prefill_checkpoint_blocks"),
    Key("prefill_checkpoint_alignment", "prefill_checkpoint_alignment",
        "prefill_checkpoint_alignment"),
    # per-group is_eagle_group flags (tools/oracle_groups.py, the oracle with that key added)
    Key("eagle_groups", "eagle_groups", None, offload="eagle_groups"),
    # the CPU tier (vLLM's --kv-offloading-size; offload_oracle.py): sizes in bytes, a chunk
    # of blocks_per_chunk GPU blocks of kv_bytes_per_block each (rounded up to the page),
    # transfers done a fixed number of steps after the step that issues them
    Key("kv_offloading_size_bytes", None, None, offload="kv_offloading_size_bytes"),
    Key("kv_bytes_per_block", None, None, offload="kv_bytes_per_block"),
    Key("page_size_alignment", None, None, offload="page_size_alignment"),
    Key("eviction_policy", None, None, offload="eviction_policy"),
    Key("offload_block_size", None, None, offload="offload_block_size"),
    Key("blocks_per_chunk", None, None, offload="blocks_per_chunk"),
    Key("transfer_steps", None, None, offload="transfer_steps"),
    Key("load_steps", None, None, offload="load_steps"),
    Key("store_steps", None, None, offload="store_steps"),
    Key("offload_prompt_only", None, None, offload="offload_prompt_only"),
)
BY_OURS: dict[str, Key] = {k.ours: k for k in KEYS}


def oracle_keys(oracle: str) -> dict[str, str]:
    """our key -> the driver's key, for the keys ``oracle`` takes."""
    _check(oracle)
    return {k.ours: n for k in KEYS if (n := k.oracle_name(oracle)) is not None}


def to_oracle_config(cfg: dict, oracle: str) -> dict:
    """Our ``config:`` mapping as the driver's case keys (values copied as they are)."""
    names = oracle_keys(oracle)
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        if key not in names:
            raise OracleKeyError(f"config.{key}: the vLLM oracle ({oracle}.py) has no "
                                 f"counterpart for this key")
        if value is None and BY_OURS[key].none_is_default:
            continue
        out[names[key]] = _copy(value)
    return out


def from_oracle_config(case: dict, oracle: str, defaults: bool = False) -> dict:
    """The driver's case keys (those in this table; others are ignored) as our ``config:``
    keys, in table order.  ``defaults``: also write ``oracle.py``'s default for every key
    the case leaves out (rows with a ``kv_default``)."""
    _check(oracle)
    out: dict[str, Any] = {}
    for k in KEYS:
        name = k.oracle_name(oracle)
        if name is None:
            continue
        if name in case:
            out[k.ours] = _copy(case[name])
        elif defaults and oracle == KV and k.kv_default is not OMIT:
            out[k.ours] = _copy(k.kv_default)
    return out


def unmapped_oracle_keys(case: dict, oracle: str, also: set[str] | frozenset = frozenset()
                         ) -> set[str]:
    """Keys of a driver's case that neither this table nor ``also`` names."""
    names = set(oracle_keys(oracle).values())
    return set(case) - names - set(also)


def _check(oracle: str) -> None:
    if oracle not in ORACLES:
        raise ValueError(f"unknown oracle driver {oracle!r} (known: {', '.join(ORACLES)})")


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def draw_prefill_checkpoints(rng: Any, cfg: dict, unit: int) -> bool:
    """The testers' ``ckpt`` profile draw for one case: vLLM's internal prefill checkpoints
    on in ~70 % of cases (``num_prefill_checkpoint_blocks`` 1; alignment 1, sometimes left to
    its default, sometimes ``unit`` (the hash unit) or 16), else 0 or the keys left out.
    Returns whether they are on.  One draw order for both testers, so a seed names a case."""
    if rng.random() < 0.7:
        cfg["num_prefill_checkpoint_blocks"] = 1
        r = rng.random()
        if r < 0.45:
            cfg["prefill_checkpoint_alignment"] = 1
        elif r < 0.6:
            pass   # the default, 1
        elif r < 0.8:
            cfg["prefill_checkpoint_alignment"] = unit
        else:
            cfg["prefill_checkpoint_alignment"] = 16
        return True
    if rng.random() < 0.5:
        cfg["num_prefill_checkpoint_blocks"] = 0
    return False
