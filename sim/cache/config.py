"""Typed, validated configuration of the KV-cache manager.

Field names follow vLLM.  ``from_mapping`` validates once and raises
``ConfigError`` naming the field; nothing downstream re-checks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from sim.cache.specs import GroupSpec
from sim.errors import ConfigError

# The one table of renamed input keys: an old name -> the one name, vLLM 0.33.0's
# (``hash_block_size``: ``vllm/v1/core/kv_cache_utils.py``; the flag was renamed in
# vLLM 0.31).  Every input (scenario, ``--set``, sweep axis, case file, step case,
# run.json record) accepts the old names; every output writes only the one name.
ALIASES = {
    "prefix_match_unit": "hash_block_size",
    "enable_mamba_fine_grained_prefix_cache": "enable_mamba_shared_prefix_checkpoint",
    "layout": "groups",
}

# case files name the checkpoint flag as vLLM's unit tests build the manager
_CASE_FIELDS = {"enable_mamba_shared_prefix_checkpoint": "shared_prefix_checkpoint"}


def _nearest_units(g: int, h: int) -> str:
    """The hash units nearest ``h`` that divide every block (the divisors of their gcd
    ``g``), for an error message."""
    divisors = [d for d in range(1, g + 1) if g % d == 0]
    below = [d for d in divisors if d < h]
    above = [d for d in divisors if d > h]
    near = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return " or ".join(map(str, near))


def canonical_key(key: str) -> str:
    """The one name of an input key (old names from ``ALIASES``)."""
    return ALIASES.get(key, key)


def canonical_path(dotted: str) -> str:
    """A dotted field path with every old name replaced by the one name (``ALIASES``)."""
    return ".".join(canonical_key(p) for p in dotted.split("."))


def case_field(key: str) -> str:
    """The ``CacheConfig`` field a case file's key sets."""
    name = ALIASES.get(key, key)
    return _CASE_FIELDS.get(name, name)


def split_group(entry: str) -> tuple[str, int | None]:
    """``kind[@block]`` -> (kind, block or None).  An attention group may carry its own
    block size (vLLM builds each group's spec with its own; e.g. full@32 beside swa:128@8);
    without one it takes ``block_size``."""
    kind, sep, block = entry.partition("@")
    return kind, (int(block) if sep else None)


def group_problem(entry: object) -> bool:
    """True when ``entry`` is not a group kind this config takes."""
    if not isinstance(entry, str):
        return True
    kind, sep, block = entry.partition("@")
    if sep and (kind == "mamba" or not block.isdigit() or int(block) <= 0):
        return True
    return not (kind in ("full", "mamba") or (
        kind.startswith("swa:") and kind[4:].isdigit() and int(kind[4:]) > 0))


# max_model_len of a deployment that sets no limit (sim run without scheduler.max_model_len)
NO_LENGTH_LIMIT = (1 << 62) - 1   # (the largest machine-size int of the compiled build)


@dataclass(frozen=True)
class CacheConfig:
    """The KV-cache manager as vLLM's unit tests build it.

    Defaults are the manager's own (dense retention, legacy EAGLE drop); a
    ``vllm serve`` deployment differs (retention 0, lookahead hashes) and the
    scenario layer sets those explicitly.
    """

    groups: tuple[str, ...] = ("full", "mamba")
    block_size: int = 16
    mamba_block_size: int | None = None
    hash_block_size: int | None = None
    eagle: bool = False
    shared_prefix_checkpoint: bool = False
    prompt_checkpoint: str = "v0.33"
    mamba_cache_mode: str = "align"
    num_blocks: int = 256
    report_mode: str | None = None
    prefix_cache_retention_interval: int | None = None
    num_hash_lookahead_tokens: int = 0
    # drafter runway at a chunk boundary (1 EAGLE-family, k multi-module MTP);
    # None = num_hash_lookahead_tokens, as the oracle builds the manager
    num_prefill_lookahead: int | None = None
    mamba_num_speculative_blocks: int = 0
    # internal prefill checkpoints (vLLM's MambaSpec fields, on every Mamba group):
    # MambaMixer2 sets 1 and 1, GDN with a checkpoint-exporting prefill sets its
    # alignment, MambaMixer (Jamba) and vLLM's unit tests leave them off (0)
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int = 1
    # which groups vLLM flags as EAGLE groups: "all" is its fallback when no
    # group is annotated (unit tests, the oracle); a served model flags the
    # groups holding the drafter's layers, i.e. full attention ("attention"),
    # or explicit group indices (vLLM's per-group ``KVCacheGroupSpec.is_eagle_group``;
    # e.g. [1] when only an SWA group holds them)
    eagle_groups: str | tuple[int, ...] = "all"
    # tokens scheduled but not yet settled (max_concurrent_batches x budget): sizes the
    # sliding-window admission cap; None = no cap (the manager-level oracle has none)
    max_in_flight_tokens: int | None = None
    max_model_len: int = 65536             # NO_LENGTH_LIMIT: none (sim run's default)
    # derived (filled by __post_init__)
    scheduler_block_size: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._validate()

    # -- derived values ---------------------------------------------------------
    @property
    def prefill_lookahead(self) -> int:
        if self.num_prefill_lookahead is None:
            return self.num_hash_lookahead_tokens
        return self.num_prefill_lookahead

    @property
    def eagle_drop(self) -> bool:
        """Legacy EAGLE trailing-unit drop: EAGLE without lookahead hashes."""
        return self.eagle and self.num_hash_lookahead_tokens == 0

    def group_specs(self) -> list[GroupSpec]:
        out = []
        for g in self.groups:
            kind, block = split_group(g)
            if kind == "full":
                out.append(GroupSpec("full", block or self.block_size))
            elif kind == "mamba":
                n = self.num_prefill_checkpoint_blocks
                out.append(GroupSpec("mamba", self.mamba_block_size or self.block_size,
                                     mamba_mode=self.mamba_cache_mode,
                                     prefill_checkpoint_blocks=n,
                                     prefill_checkpoint_alignment=(
                                         self.prefill_checkpoint_alignment if n > 0 else 0)))
            else:
                out.append(GroupSpec("swa", block or self.block_size,
                                     window=int(kind.split(":")[1])))
        return out

    def _validate(self) -> None:
        def pos_int(name, v, allow_none=False, allow_zero=False):
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(name, f"must be an integer, got {v!r}")
            if v > NO_LENGTH_LIMIT:
                raise ConfigError(name, f"must be below 2**62, got {v}")
            if v < 0 or (v == 0 and not allow_zero):
                raise ConfigError(name, f"must be {'>= 0' if allow_zero else 'positive'}, got {v}")

        if not self.groups:
            raise ConfigError("groups", "needs at least one group")
        for g in self.groups:
            if group_problem(g):
                raise ConfigError("groups", f"unknown group kind {g!r} (use full | mamba | "
                                            f"swa:<window>, attention kinds optionally @<block>)")
        pos_int("block_size", self.block_size)
        pos_int("mamba_block_size", self.mamba_block_size, allow_none=True)
        pos_int("hash_block_size", self.hash_block_size, allow_none=True)
        pos_int("num_blocks", self.num_blocks)
        if self.num_blocks < 2:
            raise ConfigError("num_blocks", "must be at least 2 (block 0 is the null block)")
        from sim.models.capacity import pool_memory_problem

        problem = pool_memory_problem(self.num_blocks)   # (one object per block)
        if problem is not None:
            raise ConfigError("num_blocks", problem)
        pos_int("num_hash_lookahead_tokens", self.num_hash_lookahead_tokens, allow_zero=True)
        pos_int("num_prefill_lookahead", self.num_prefill_lookahead, allow_none=True, allow_zero=True)
        pos_int("mamba_num_speculative_blocks", self.mamba_num_speculative_blocks, allow_zero=True)
        pos_int("num_prefill_checkpoint_blocks", self.num_prefill_checkpoint_blocks,
                allow_zero=True)
        pos_int("prefill_checkpoint_alignment", self.prefill_checkpoint_alignment)
        pos_int("max_in_flight_tokens", self.max_in_flight_tokens, allow_none=True)
        pos_int("max_model_len", self.max_model_len)
        pos_int("prefix_cache_retention_interval", self.prefix_cache_retention_interval,
                allow_none=True, allow_zero=True)
        for name in ("eagle", "shared_prefix_checkpoint"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        eg = self.eagle_groups
        if isinstance(eg, tuple):
            bad = [i for i in eg if isinstance(i, bool) or not isinstance(i, int)
                   or not 0 <= i < len(self.groups)]
            if bad or not eg or len(set(eg)) != len(eg):
                raise ConfigError("eagle_groups",
                                  f"must be all, attention or a list of distinct group indices "
                                  f"0..{len(self.groups) - 1}, got {list(eg)!r}")
        elif eg not in ("all", "attention"):
            raise ConfigError("eagle_groups", f"must be all, attention or a list of group "
                                              f"indices, got {eg!r}")
        if self.prompt_checkpoint not in ("v0.33", "seed"):
            raise ConfigError("prompt_checkpoint", f"must be v0.33 or seed, got {self.prompt_checkpoint!r}")
        if self.mamba_cache_mode not in ("align", "all", "none"):
            raise ConfigError("mamba_cache_mode", f"must be align, all or none, got {self.mamba_cache_mode!r}")
        if self.report_mode not in (None, "full", "incremental"):
            raise ConfigError("report_mode", f"must be full, incremental or null, got {self.report_mode!r}")
        specs = self.group_specs()
        sizes = [s.block_size for s in specs]
        sched = math.lcm(*sizes)
        object.__setattr__(self, "scheduler_block_size", sched)
        if len(specs) == 1:
            if self.hash_block_size not in (None, sizes[0]):
                raise ConfigError("hash_block_size",
                                  f"with a single KV-cache group hits land on the block size "
                                  f"({sizes[0]}); unset it or set it to {sizes[0]}")
            h = sizes[0]
        elif any(s.kind == "mamba" and s.mamba_mode != "align" for s in specs):
            h = sched
        else:
            h = self.hash_block_size if self.hash_block_size is not None else math.gcd(*sizes)
            bad = [b for b in sizes if b % h]
            if bad:
                distinct = sorted(set(sizes))
                not_h = (f"; not {', '.join(map(str, sorted(set(bad))))}"
                         if len(distinct) > 1 else "")
                raise ConfigError("hash_block_size",
                                  f"{h} must divide every group block size (here "
                                  f"{', '.join(map(str, distinct))} tokens{not_h}); use one "
                                  f"that does, e.g. {_nearest_units(math.gcd(*sizes), h)}")
        object.__setattr__(self, "hash_block_size", h)
        r = self.prefix_cache_retention_interval
        if r is not None:
            if not any(s.kind in ("mamba", "swa") for s in specs):
                if r != 0:
                    raise ConfigError("prefix_cache_retention_interval",
                                      "has no effect without a sliding-window or Mamba group; set 0")
            elif r % sched:
                raise ConfigError("prefix_cache_retention_interval",
                                  f"{r} must be a multiple of the scheduler block size ({sched})")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls) if f.init}

    @classmethod
    def from_mapping(cls, data: dict, prefix: str = "") -> "CacheConfig":
        """Build from a mapping; unknown keys are a ``ConfigError``."""
        kwargs = {}
        names = cls.field_names()
        for key, value in data.items():
            if not isinstance(key, str):
                raise ConfigError(prefix + str(key), "unknown key (field names are strings)")
            name = case_field(key)
            if name not in names:
                raise ConfigError(prefix + key, "unknown key")
            if name == "groups":
                if not isinstance(value, (list, tuple)):
                    raise ConfigError(prefix + key, "must be a list like [full, mamba]")
                value = tuple(str(v) for v in value)
            elif name == "eagle_groups" and isinstance(value, (list, tuple)):
                value = tuple(value)
            kwargs[name] = value
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(prefix + e.field_name, e.reason) from None
