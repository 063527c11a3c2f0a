"""The ``scheduler`` section of a scenario (vLLM ``SchedulerConfig`` names).

A plain frozen dataclass: the compiled scheduler copies its fields into typed
attributes of its own once, at construction (``sim/engine/scheduler.py``), so the
per-step reads stay native.  ``policy`` names a scheduler policy
(``sim/engine/request_queue.py``: ``fcfs``, vLLM's default; ``priority``, vLLM's
``--scheduling-policy priority``; ``lpm``, SGLang's longest-prefix-match order) and is
checked here, when the section is built, so a typo never reaches a run."""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from sim.cache.config import NO_LENGTH_LIMIT
from sim.errors import ConfigError

# scheduler.policy: the waiting queues by name, as vLLM names its scheduling policies (the
# engine's registry, ``sim.engine.request_queue.QUEUE_POLICIES``, builds one per name; config
# never imports the engine)
QUEUE_POLICY_NAMES: tuple[str, ...] = ("fcfs", "priority", "lpm")


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
    policy: str = "fcfs"
    # lpm only: a request that has waited this many scheduler steps since it arrived goes
    # ahead of the prefix order (the starvation bound; None: no bound) ...
    lpm_max_wait_steps: int | None = 256
    # ... and past this many waiting requests it stops re-sorting (one lookup each per step)
    lpm_max_queue: int = 128

    def __post_init__(self) -> None:
        self.check("scheduler.")

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
