"""The ``scheduler`` section of a scenario (vLLM ``SchedulerConfig`` names).

A plain frozen dataclass: the compiled scheduler copies its fields into typed
attributes of its own once, at construction (``sim/engine/scheduler.py``), so the
per-step reads stay native.  ``policy`` names a scheduler policy
(``sim/engine/request_queue.py``: ``fcfs``, vLLM's default; ``priority``, vLLM's
``--scheduling-policy priority``; ``lpm``, SGLang's longest-prefix-match order) and is
checked here, when the section is built, so a typo never reaches a run.

Every input dialect builds its scheduler limits through ``build_scheduler``: a
scenario's ``scheduler:`` section, and the scheduler keys of a step case's or a case
file's ``config:``.  Only the defaults differ (``DIALECT_DEFAULTS``); the types, the
ranges and vLLM's cross-field rules are checked by one function (``check_limits``)."""
from __future__ import annotations

from sim.config.fields import build_section, check_int, show  # (show: values in messages)

from dataclasses import dataclass, replace
from typing import Any

from sim.cache.config import NO_LENGTH_LIMIT
from sim.config.dialects import DIALECT_DEFAULTS
from sim.errors import ConfigError

# the section's own checks (``SchedulerConfig.check``, run when one is built) name the
# field under the scenario's section; another dialect's builder renames them
SECTION = "scheduler."

# scheduler.policy: the waiting queues by name, as vLLM names its scheduling policies (the
# engine's registry, ``sim.engine.request_queue.QUEUE_POLICIES``, builds one per name; config
# never imports the engine)
QUEUE_POLICY_NAMES: tuple[str, ...] = ("fcfs", "priority", "lpm")


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = DIALECT_DEFAULTS["scenario"]["max_num_batched_tokens"]
    max_num_seqs: int = DIALECT_DEFAULTS["scenario"]["max_num_seqs"]
    long_prefill_token_threshold: int = DIALECT_DEFAULTS["scenario"]["long_prefill_token_threshold"]
    num_speculative_tokens: int = 0
    # vLLM's max_model_len: prompts of this length or more are rejected (as the API server
    # does), outputs stop there, and positions of running requests stay below it.  None:
    # no limit (a server started with a large --max-model-len).
    max_model_len: int | None = None
    policy: str = "fcfs"
    # lpm only: a request that has waited this many scheduler steps since it arrived goes
    # ahead of the prefix order (the starvation bound; None: no bound) ...
    lpm_max_wait_steps: int | None = 256
    # ... and past this many waiting requests it stops re-sorting (one lookup each per step)
    lpm_max_queue: int = 128

    def __post_init__(self) -> None:
        self.check(SECTION)

    def check(self, prefix: str) -> None:
        """``ConfigError`` naming ``prefix + field`` for a policy key that is wrong."""
        if not isinstance(self.policy, str) or self.policy not in QUEUE_POLICY_NAMES:
            raise ConfigError(prefix + "policy", f"unknown policy {show(self.policy)} "
                              f"(choices: {', '.join(sorted(QUEUE_POLICY_NAMES))})")
        # (the compiled scheduler holds these in 64-bit machine integers)
        for name in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                     "num_speculative_tokens", "max_model_len"):
            v = getattr(self, name)
            if isinstance(v, int) and not isinstance(v, bool) and v > NO_LENGTH_LIMIT:
                raise ConfigError(prefix + name, f"must be below 2**62, got {v}")
        for name, lo, none_ok in (("lpm_max_wait_steps", 1, True), ("lpm_max_queue", 1, False)):
            v = getattr(self, name)
            if v is None and none_ok:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(prefix + name, f"must be an integer >= {lo}"
                                  f"{' or null' if none_ok else ''}, got {show(v)}")
        if self.policy != "lpm":
            defaults = SchedulerConfig.__dataclass_fields__
            for name in ("lpm_max_wait_steps", "lpm_max_queue"):
                if getattr(self, name) != defaults[name].default:
                    raise ConfigError(prefix + name, f"only used by policy lpm (policy is "
                                      f"{show(self.policy)})")


def check_limits(sched: SchedulerConfig, prefix: str) -> None:
    """``ConfigError`` naming ``prefix + field`` for a limit out of range, or one that
    vLLM's ``SchedulerConfig`` refuses beside another (a long-prefill threshold above
    the model length, a token budget below the sequence limit)."""
    check_int(prefix, "max_num_batched_tokens", sched.max_num_batched_tokens, 1)
    check_int(prefix, "max_num_seqs", sched.max_num_seqs, 1)
    check_int(prefix, "long_prefill_token_threshold", sched.long_prefill_token_threshold, 0)
    check_int(prefix, "max_model_len", sched.max_model_len, 2, allow_none=True)
    check_int(prefix, "num_speculative_tokens", sched.num_speculative_tokens, 0)
    if sched.max_model_len is not None and sched.long_prefill_token_threshold > sched.max_model_len:
        raise ConfigError(prefix + "long_prefill_token_threshold",
                          f"{sched.long_prefill_token_threshold} cannot be greater than "
                          f"max_model_len {sched.max_model_len} (vLLM rejects this)")
    if sched.max_num_batched_tokens < sched.max_num_seqs:
        raise ConfigError(prefix + "max_num_batched_tokens",
                          f"{sched.max_num_batched_tokens} is smaller than max_num_seqs "
                          f"{sched.max_num_seqs} (vLLM rejects this)")


def build_scheduler(data: Any, prefix: str = SECTION, dialect: str = "scenario"
                    ) -> SchedulerConfig:
    """The scheduler limits of one input dialect (a row of ``DIALECT_DEFAULTS``: a limit
    the mapping leaves out takes that row's default) from a mapping of ``SchedulerConfig``
    fields: unknown keys, wrong types, the section's own checks and ``check_limits``,
    each a ``ConfigError`` naming ``prefix + key``."""
    if isinstance(data, dict):
        data = {**DIALECT_DEFAULTS[dialect], **data}
    try:
        sched = build_section(SchedulerConfig, data, prefix)
    except ConfigError as e:
        raise _named(e, prefix) from None
    check_limits(sched, prefix)
    return sched


def with_model_len(sched: SchedulerConfig, max_model_len: int, prefix: str) -> SchedulerConfig:
    """``sched`` with the model length a dialect sets beside it (a step case's is a key
    of its cache), checked with the limits again."""
    try:
        sched = replace(sched, max_model_len=max_model_len)
    except ConfigError as e:
        raise _named(e, prefix) from None
    check_limits(sched, prefix)
    return sched


def _named(e: ConfigError, prefix: str) -> ConfigError:
    """``e`` naming its field under ``prefix`` where the section's own check named it
    under ``SECTION``."""
    if prefix == SECTION or not e.field_name.startswith(SECTION):
        return e
    return ConfigError(prefix + e.field_name.removeprefix(SECTION), e.reason)
