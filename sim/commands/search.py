"""Max sustainable load: the highest arrival-rate scale at which a given share of the
requests still meets the scenario's SLOs (``slo:``), found by bisection.

``sim sweep --search rate`` (or a ``search:`` section in the sweep file) runs it for
every point.  A *scale* multiplies the workload's arrival rate: ``rate_per_s``
(``system_prompt``), ``session_rate_per_s`` (``multi_turn``: sessions start faster; a
follow-up turn still waits its think time) or divides a trace's ``time_scale``
(``mooncake``, ``azure``, ``jsonl``: the same requests, arriving closer together).  The
scenario as written is scale 1.

The search doubles (or halves) the scale from 1 until one run meets the goal and another
misses it, then bisects between them (geometric midpoints) until the two are within
``tolerance`` of each other; the answer is the highest scale that met it.  This assumes
attainment falls as the rate grows, as it does for a queue; every run it made is listed
(``search.csv``), so a non-monotone case shows.  Same inputs, same runs, same answer.
"""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

import math
from dataclasses import dataclass
from typing import Any, Callable

from sim.errors import ConfigError
from sim.config.fields import build_section, check_num

SCALED_FIELD = {"system_prompt": "rate_per_s", "multi_turn": "session_rate_per_s",
                "mooncake": "time_scale", "azure": "time_scale", "jsonl": "time_scale"}
FOUND, ABOVE, BELOW = "found", "above max_scale", "below min_scale"


@dataclass(frozen=True)
class RateSearch:
    """The ``search:`` section of a sweep file (every key optional)."""

    by: str = "rate"              # what is searched: the arrival-rate scale (the one search)
    attainment: float = 0.9       # share of requests that must meet every SLO
    tolerance: float = 0.05       # stop when the highest met and lowest missed scale differ by this
    min_scale: float = 1 / 64
    max_scale: float = 64.0

    def validate(self, p: str = "search.") -> None:
        if self.by != "rate":
            raise ConfigError(p + "by", f"must be rate (the arrival-rate scale), got {show(self.by)}")
        check_num(p, "attainment", self.attainment, 0.0, 1.0)
        if self.attainment <= 0:
            raise ConfigError(p + "attainment", "must be > 0 (a share of requests, e.g. 0.9)")
        check_num(p, "tolerance", self.tolerance, 1e-6)
        check_num(p, "min_scale", self.min_scale, 1e-9)
        check_num(p, "max_scale", self.max_scale, 1e-9)
        if not self.min_scale <= 1.0 <= self.max_scale:
            raise ConfigError(p + "min_scale", f"the scales must bracket 1 (the scenario as "
                              f"written): min_scale {self.min_scale:g} <= 1 <= max_scale "
                              f"{self.max_scale:g}")


def parse_search(data: Any) -> RateSearch:
    """A ``search:`` mapping (or ``rate``, or null for the defaults) as a ``RateSearch``;
    a ``ConfigError`` naming ``search.<field>`` otherwise."""
    if data is None or data == "rate":
        data = {}
    s = build_section(RateSearch, data, "search.")
    s.validate()
    return s


def rate_overrides(workload: dict, scale: float) -> dict:
    """The dotted overrides that run ``workload`` at ``scale`` times its arrival rate."""
    kind = workload.get("kind")
    field = SCALED_FIELD.get(kind)
    if field is None:
        raise ConfigError("workload.kind", f"a rate search cannot scale the arrivals of "
                          f"{show(kind)} (it scales {', '.join(SCALED_FIELD)})")
    if field == "time_scale":
        return {f"workload.{field}": float(workload.get(field, 1.0)) / scale}
    return {f"workload.{field}": float(workload[field]) * scale}


@dataclass
class Probe:
    """One run of the search."""

    scale: float
    arrival_rate: float       # requests/s over the arrival span
    attainment: float
    goodput: float            # requests/s meeting every SLO
    meets: bool


@dataclass
class SearchResult:
    scale: float | None       # highest scale that met the goal (None: none did)
    outcome: str              # FOUND, ABOVE (met even at max_scale), BELOW (missed at min_scale)
    probes: list[Probe]
    best: Any                 # what ``run`` returned for the scale reported (or the last run)


def search_rate(run: Callable[[float], tuple[dict, Any]], cfg: RateSearch,
                log: Callable[[str], None] = lambda line: None) -> SearchResult:
    """Bisect the scale.  ``run(scale)`` simulates and returns ``(summary, payload)``; the
    payload of the reported scale comes back as ``best``."""
    probes: list[Probe] = []
    kept: dict[str, Any] = {}     # "met": payload of the latest run that met the goal (the
                                  # highest scale so far: the search only moves up from one)

    def meets(scale: float) -> bool:
        summary, payload = run(scale)
        a = summary["slo_attainment"]
        ok = a >= cfg.attainment
        probes.append(Probe(scale, summary["arrival_rate"], a, summary["request_goodput"], ok))
        log(f"rate x{scale:.4g} ({summary['arrival_rate']:.4g} req/s arriving): "
            f"{a:.1%} meet the SLOs (goal {cfg.attainment:.1%}) -> "
            f"{'meets' if ok else 'misses'}")
        kept["last"] = payload
        if ok:
            kept["met"] = payload
        return ok

    lo: float | None = None
    hi: float | None = None
    if meets(1.0):
        lo = 1.0
        x = 2.0
        while x <= cfg.max_scale * (1 + 1e-12):
            if not meets(x):
                hi = x
                break
            lo = x
            x *= 2.0
        if hi is None:
            return SearchResult(lo, ABOVE, probes, kept["met"])
    else:
        hi = 1.0
        x = 0.5
        while x >= cfg.min_scale * (1 - 1e-12):
            if meets(x):
                lo = x
                break
            hi = x
            x /= 2.0
        if lo is None:
            return SearchResult(None, BELOW, probes, kept["last"])
    while hi / lo > 1.0 + cfg.tolerance:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, FOUND, probes, kept["met"])


def describe(result: SearchResult, cfg: RateSearch) -> str:
    """One line: the answer, with the arrival rate it means."""
    goal = f"{cfg.attainment:.0%} of requests within the SLOs"
    if result.scale is None:
        return f"even rate x{result.probes[-1].scale:.4g} misses {goal}"
    p = next(p for p in result.probes if p.scale == result.scale)
    head = "at least " if result.outcome == ABOVE else ""
    return (f"max rate {head}x{result.scale:.4g} ({p.arrival_rate:.4g} req/s arriving, "
            f"{p.attainment:.1%} within the SLOs, goodput {p.goodput:.4g} req/s) for {goal}")
