"""The ``slo`` section of a scenario: per-request service-level objectives.

A request meets the SLOs when every objective given holds for it, as ``vllm bench serve
--goodput`` counts a good request: TTFT, TPOT (a request of one output token has TPOT 0)
and end-to-end latency each at or below its bound, in milliseconds (compared to the
nanosecond).  The run reports the share of requests that meet them (``slo_attainment``)
and the rate of those that do (``request_goodput``); ``sim sweep`` with a rate search
looks for the highest arrival rate at which a given share still meets them.
"""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from sim.errors import ConfigError
from sim.config.fields import check_num


def _within(value_s: float, bound_ms: float | None) -> bool:
    return bound_ms is None or round(value_s * 1e9) <= round(bound_ms * 1e6)


@dataclass(frozen=True)
class SLOSection:
    ttft_ms: float | None = None      # time to first token
    tpot_ms: float | None = None      # time per output token after the first
    e2e_ms: float | None = None       # arrival to last token

    def validate(self, p: str = "slo.") -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            check_num(p, name, v, 0.0, allow_none=True)
            if v is not None and v <= 0:
                raise ConfigError(p + name, f"must be a finite number > 0 (milliseconds), "
                                  f"got {show(v)}")

    @property
    def active(self) -> bool:
        """Whether any objective is set (else there is no attainment to report)."""
        return self.ttft_ms is not None or self.tpot_ms is not None or self.e2e_ms is not None

    def met(self, ttft_s: float, tpot_s: float, e2e_s: float) -> bool:
        """Whether one request meets every objective set (``tpot_s`` 0 for a request of
        one output token, as vLLM counts it).  Compared on the engine's clock, in whole
        nanoseconds, so that a request exactly at a bound meets it (``0.011`` s taken as
        11,000,000 ns x 1e-9 is a hair above the float ``11 / 1000``)."""
        return (_within(ttft_s, self.ttft_ms) and _within(tpot_s, self.tpot_ms)
                and _within(e2e_s, self.e2e_ms))

    def describe(self) -> str:
        """``TTFT <= 2000 ms, TPOT <= 50 ms`` (or ``none``), for reports."""
        parts = [f"{label} <= {v:g} ms" for label, v in
                 (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("e2e", self.e2e_ms))
                 if v is not None]
        return ", ".join(parts) or "none"
