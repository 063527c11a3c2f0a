"""Where vLLM 0.33.0's KV offloading connector fails one of its own assertions (an
exception of its own module: the connector's module is compiled, and an exception class is
not one mypyc compiles)."""
from __future__ import annotations

from sim.errors import InputError


class ConnectorAssertion(InputError):
    """vLLM's engine core dies there, so the replay stops too (``step``: the scheduler
    step it stopped at in a step case, -1 in a timed run)."""

    @classmethod
    def at(cls, now: int, steps: bool, message: str) -> "ConnectorAssertion":
        where = f"step {now}" if steps else f"at {now * 1e-9:.6f} s"
        return cls(f"{where}: vLLM 0.33.0 stops here: {message}")

    @property
    def step(self) -> int:
        # (from the message: SimPy re-raises a process's exception rebuilt from its args)
        head = str(self).split(":", 1)[0]
        return int(head.split()[-1]) if head.startswith("step ") else -1
