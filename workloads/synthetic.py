"""Synthetic workloads: ``system_prompt`` (shared system prompts + private
suffixes, open loop) and ``multi_turn`` (chat sessions, closed loop)."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from workloads.base import (MAX_REQUESTS, MAX_TIME_S, MAX_TURNS, Dist, Fields, TraceRequest,
                            WorkloadError, big, check_int, output_stream, show,
                            time_limit_error)
from workloads.trace_records import request_id

WHERE = "workload"
REQUESTS_WHY = "the most requests a run may have"
TIME_WHY = "the latest time the simulator's clock holds"


@dataclass(frozen=True, slots=True)
class Arrivals:
    """An open-loop arrival process: ``poisson`` or ``gamma`` (renewal process whose
    inter-arrival times have mean ``1/rate_per_s`` and coefficient of variation ``cv``)."""

    process: str
    rate_per_s: float
    cv: float = 1.0

    def gaps(self, rng: np.random.Generator) -> Iterator[float]:
        mean = 1.0 / self.rate_per_s
        if self.process == "poisson":
            while True:
                yield float(rng.exponential(mean))
        shape = 1.0 / (self.cv * self.cv)
        while True:
            yield float(rng.gamma(shape, mean / shape))

    def describe(self) -> str:
        if self.process == "poisson":
            return f"poisson {self.rate_per_s:g}/s"
        return f"gamma {self.rate_per_s:g}/s cv {self.cv:g}"


def _int_dist(f: Fields, key: str, minimum: int, default: Any = None) -> Dist:
    if not f.has(key):
        if default is None:
            raise WorkloadError(f"{f.name(key)}: missing (required)")
        return default
    return Dist.parse(f.raw(key), f.name(key), integer=True, minimum=minimum)


# --------------------------------------------------------------------------- system_prompt

@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant of a multi-tenant ``system_prompt`` workload: its own system prompts
    (streams ``sys/<tenant>/<k>``), their popularity, and its own Poisson rate."""

    name: str
    num_system_prompts: int
    system_prompt_tokens: tuple[int, ...] | Dist
    rate_per_s: float
    popularity: str = "uniform"
    zipf_s: float = 1.1


TENANT_KEYS = ("name", "count", "num_system_prompts", "system_prompt_tokens", "popularity",
               "zipf_s", "rate_per_s")
# keys a tenant list replaces at the top of the workload
PER_TENANT = ("num_system_prompts", "system_prompt_tokens", "popularity", "zipf_s",
              "arrival", "rate_per_s", "cv")


@dataclass(frozen=True, slots=True)
class SystemPromptConfig:
    """``kind: system_prompt`` — K shared system prompts (stream ``sys/<k>``), each
    request = one of them + a private suffix (stream ``u/<request id>``).

    Multi-tenant: ``tenants:`` lists tenant groups instead of the prompts and the rate,
    each ``{name, count: N, num_system_prompts, system_prompt_tokens, popularity, zipf_s,
    rate_per_s}``; a group stands for ``count`` tenants (``<name>-<i>``), each with its own
    system prompts (drawn once per tenant when ``system_prompt_tokens`` is a
    distribution) and its own Poisson rate; the workload is their superposition (the
    next arrival of any tenant, that tenant with probability rate / total rate).  Suffix
    and output lengths, ``num_requests`` and ``duration_s`` stay at the top."""

    KIND: ClassVar[str] = "system_prompt"
    KEYS: ClassVar[tuple[str, ...]] = (
        "kind", "num_system_prompts", "system_prompt_tokens", "popularity", "zipf_s",
        "suffix_tokens", "output_tokens", "arrival", "rate_per_s", "cv", "num_requests",
        "duration_s", "tenants")

    num_system_prompts: int
    system_prompt_tokens: tuple[int, ...] | Dist   # K lengths, or sampled once per prompt
    suffix_tokens: Dist
    output_tokens: Dist
    arrival: Arrivals
    popularity: str = "uniform"
    zipf_s: float = 1.1
    num_requests: int | None = None
    duration_s: float | None = None
    tenants: tuple[Tenant, ...] | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str = WHERE) -> SystemPromptConfig:
        f = Fields(m, where, cls.KEYS)
        if f.has("tenants"):
            return cls._multi_tenant(f)
        k = f.int("num_system_prompts", minimum=1, maximum=MAX_REQUESTS, why=REQUESTS_WHY)
        spt = f.raw("system_prompt_tokens")
        if isinstance(spt, (list, tuple)):
            if len(spt) != k:
                raise WorkloadError(
                    f"{f.name('system_prompt_tokens')}: has {len(spt)} lengths but"
                    f" num_system_prompts is {k}")
            lengths: tuple[int, ...] | Dist = tuple(
                check_int(v, f"{f.name('system_prompt_tokens')}[{i}]", 1) for i, v in enumerate(spt))
        else:
            lengths = Dist.parse(spt, f.name("system_prompt_tokens"), integer=True, minimum=1)
        popularity = f.str("popularity", "uniform", ("uniform", "zipf"))
        if f.has("zipf_s") and popularity != "zipf":
            raise WorkloadError(f"{f.name('zipf_s')}: only used with popularity: zipf")
        zipf_s = f.number("zipf_s", 1.1, positive=True)
        arrival = _arrivals(f)
        num_requests, duration_s = _length(f)
        rate = arrival.rate_per_s
        if num_requests is not None and (duration_s is None or duration_s * rate > num_requests) \
                and num_requests / rate > MAX_TIME_S:
            raise time_limit_error(f.name("rate_per_s"), 0.0, f"{big(num_requests)} requests "
                                   f"at {rate:g}/s arrive over ~{num_requests / rate:.3g} s, "
                                   "which")
        if num_requests is None and duration_s * rate > MAX_REQUESTS:
            raise WorkloadError(f"{f.name('duration_s')}: {duration_s:g} s at {rate:g}/s is "
                                f"~{big(int(duration_s * rate))} requests, more than the "
                                f"{big(MAX_REQUESTS)} a run may have (give num_requests)")
        return cls(
            num_system_prompts=k, system_prompt_tokens=lengths,
            suffix_tokens=_int_dist(f, "suffix_tokens", 0),
            output_tokens=_int_dist(f, "output_tokens", 1),
            arrival=arrival, popularity=popularity, zipf_s=zipf_s,
            num_requests=num_requests, duration_s=duration_s)

    @classmethod
    def _multi_tenant(cls, f: Fields) -> SystemPromptConfig:
        for key in PER_TENANT:
            if f.has(key):
                raise WorkloadError(f"{f.name(key)}: set per tenant under tenants: (a tenant "
                                    f"list replaces {', '.join(PER_TENANT)})")
        raw = f.raw("tenants")
        where = f.name("tenants")
        if not isinstance(raw, list) or not raw:
            raise WorkloadError(f"{where}: expected a non-empty list of tenant groups "
                                f"({{name, count, num_system_prompts, system_prompt_tokens, "
                                f"rate_per_s}}), got {show(raw)}")
        tenants: list[Tenant] = []
        names: set[str] = set()
        for i, g in enumerate(raw):
            tf = Fields(g, f"{where}[{i}]", TENANT_KEYS)
            name = tf.str("name", f"t{i}")
            count = tf.int("count", 1, minimum=1)
            k = tf.int("num_system_prompts", 1, minimum=1)
            spt = tf.raw("system_prompt_tokens")
            if isinstance(spt, (list, tuple)):
                if len(spt) != k:
                    raise WorkloadError(f"{tf.name('system_prompt_tokens')}: has {len(spt)} "
                                        f"lengths but num_system_prompts is {k}")
                lengths: tuple[int, ...] | Dist = tuple(
                    check_int(v, f"{tf.name('system_prompt_tokens')}[{j}]", 1)
                    for j, v in enumerate(spt))
            else:
                lengths = Dist.parse(spt, tf.name("system_prompt_tokens"), integer=True,
                                     minimum=1)
            popularity = tf.str("popularity", "uniform", ("uniform", "zipf"))
            zipf_s = tf.number("zipf_s", 1.1, positive=True)
            rate = tf.number("rate_per_s", positive=True)
            for c in range(min(count, 100_001)):
                t = name if count == 1 else f"{name}-{c}"
                if t in names:
                    raise WorkloadError(f"{tf.name('name')}: tenant {t!r} twice")
                names.add(t)
                tenants.append(Tenant(t, k, lengths, rate, popularity, zipf_s))
        if len(tenants) > 100_000:
            raise WorkloadError(f"{where}: {len(tenants):,} tenants: at most 100,000")
        num_requests, duration_s = _length(f)
        total = sum(t.rate_per_s for t in tenants)
        return cls(num_system_prompts=sum(t.num_system_prompts for t in tenants),
                   system_prompt_tokens=(), suffix_tokens=_int_dist(f, "suffix_tokens", 0),
                   output_tokens=_int_dist(f, "output_tokens", 1),
                   arrival=Arrivals("poisson", total), num_requests=num_requests,
                   duration_s=duration_s, tenants=tuple(tenants))

    def popularity_weights(self) -> np.ndarray:
        """Probability of each system prompt (zipf: ``p_k ∝ 1/(k+1)^s``)."""
        return _weights(self.num_system_prompts, self.popularity, self.zipf_s)

    def _tenant_requests(self, seed: int) -> Iterator[TraceRequest]:
        rng = np.random.default_rng(seed)
        tenants = self.tenants or ()
        lengths = []
        cdfs = []
        for t in tenants:        # each tenant's prompts, drawn once, in tenant order
            if isinstance(t.system_prompt_tokens, tuple):
                lengths.append(list(t.system_prompt_tokens))
            else:
                lengths.append([t.system_prompt_tokens.sample(rng)
                                for _ in range(t.num_system_prompts)])
            c = np.cumsum(_weights(t.num_system_prompts, t.popularity, t.zipf_s))
            c[-1] = 1.0
            cdfs.append(c)
        pick = np.cumsum([t.rate_per_s for t in tenants], dtype=float)
        pick /= pick[-1]
        pick[-1] = 1.0

        def prompt(rng: np.random.Generator) -> tuple[str, int]:
            j = min(int(np.searchsorted(pick, rng.random(), side="right")), len(tenants) - 1)
            ten = tenants[j]
            k = ten.num_system_prompts
            p = min(int(np.searchsorted(cdfs[j], rng.random(), side="right")), k - 1) \
                if k > 1 else 0
            return f"sys/{ten.name}/{p}", lengths[j][p]

        yield from self._emit(rng, prompt, "tenants")

    def _emit(self, rng: np.random.Generator, prompt, rate_key: str) -> Iterator[TraceRequest]:
        """The requests: each arrival's system prompt (``prompt(rng)``: its stream and
        length), then its private suffix and output length, in that order of draws."""
        gaps = self.arrival.gaps(rng)
        t = 0.0
        i = 0
        while self.num_requests is None or i < self.num_requests:
            t += next(gaps)
            if self.duration_s is not None and t > self.duration_s:
                return
            if t > MAX_TIME_S or i >= MAX_REQUESTS:
                _past_limits(t, i, rate_key)
            name, length = prompt(rng)
            suffix = self.suffix_tokens.sample(rng)
            out = self.output_tokens.sample(rng)
            rid = request_id(i)
            segs = [(name, 0, length)]
            if suffix > 0:
                segs.append((f"u/{rid}", 0, suffix))
            yield TraceRequest(rid, t, segs, out)
            i += 1

    def requests(self, seed: int) -> Iterator[TraceRequest]:
        if self.tenants is not None:
            yield from self._tenant_requests(seed)
            return
        rng = np.random.default_rng(seed)
        k = self.num_system_prompts
        if isinstance(self.system_prompt_tokens, tuple):
            sys_len = list(self.system_prompt_tokens)
        else:
            sys_len = [self.system_prompt_tokens.sample(rng) for _ in range(k)]
        cdf = np.cumsum(self.popularity_weights())
        cdf[-1] = 1.0

        def prompt(rng: np.random.Generator) -> tuple[str, int]:
            p = int(np.searchsorted(cdf, rng.random(), side="right")) if k > 1 else 0
            p = min(p, k - 1)
            return f"sys/{p}", sys_len[p]

        yield from self._emit(rng, prompt, "rate_per_s")

    def describe(self) -> str:
        if self.tenants is not None:
            stop = [f"{self.num_requests} requests"] if self.num_requests is not None else []
            if self.duration_s is not None:
                stop.append(f"{self.duration_s:g} s")
            return (f"system_prompt: {len(self.tenants)} tenants, {self.num_system_prompts} "
                    f"prompts in all, suffix {self.suffix_tokens.describe()}, output "
                    f"{self.output_tokens.describe()}, poisson {self.arrival.rate_per_s:g}/s in "
                    f"all, {' or '.join(stop)}")
        lengths = (",".join(map(str, self.system_prompt_tokens))
                   if isinstance(self.system_prompt_tokens, tuple)
                   else self.system_prompt_tokens.describe())
        pop = f"zipf s={self.zipf_s:g}" if self.popularity == "zipf" else "uniform"
        stop = []
        if self.num_requests is not None:
            stop.append(f"{self.num_requests} requests")
        if self.duration_s is not None:
            stop.append(f"{self.duration_s:g} s")
        return (f"system_prompt: {self.num_system_prompts} prompts ({pop}) of {lengths} tokens,"
                f" suffix {self.suffix_tokens.describe()}, output {self.output_tokens.describe()},"
                f" {self.arrival.describe()}, {' or '.join(stop)}")


def _weights(k: int, popularity: str, zipf_s: float) -> np.ndarray:
    """Probability of each of ``k`` prompts (zipf: ``p_k ∝ 1/(k+1)^s``)."""
    if popularity == "uniform":
        return np.full(k, 1.0 / k)
    w = 1.0 / np.arange(1, k + 1, dtype=float) ** zipf_s
    return w / w.sum()


def _past_limits(t: float, i: int, rate_key: str):
    """A synthetic workload whose draws went past the clock or the request limit."""
    if i >= MAX_REQUESTS:
        raise WorkloadError(f"{WHERE}: more than {big(MAX_REQUESTS)} requests, the most a run "
                            "may have (give num_requests)")
    raise time_limit_error(f"{WHERE}.{rate_key}", t, f"request {i + 1:,} arrives at "
                           f"{t:.3g} s, which")



def _length(f) -> tuple[int | None, float | None]:
    """How long a synthetic workload runs: ``num_requests`` and/or ``duration_s`` (at
    least one), each within what the simulator can finish."""
    num_requests = f.int("num_requests", None, minimum=0, maximum=MAX_REQUESTS,
                         why=REQUESTS_WHY)
    duration_s = f.number("duration_s", None, minimum=0.0, maximum=MAX_TIME_S, why=TIME_WHY)
    if num_requests is None and duration_s is None:
        raise WorkloadError(f"{f.name('num_requests')}: missing (give num_requests or duration_s)")
    return num_requests, duration_s

def _arrivals(f: Fields) -> Arrivals:
    process = f.str("arrival", "poisson", ("poisson", "gamma"))
    rate = f.number("rate_per_s", positive=True)
    if f.has("cv") and process != "gamma":
        raise WorkloadError(f"{f.name('cv')}: only used with arrival: gamma")
    cv = f.number("cv", 1.0, positive=True)
    return Arrivals(process, rate, cv)


# --------------------------------------------------------------------------- multi_turn

@dataclass(frozen=True, slots=True)
class MultiTurnConfig:
    """``kind: multi_turn`` — chat sessions arriving Poisson; turn ``k`` of a session
    resends the whole conversation: system prompt + (user_j + answer_j for each
    earlier turn j) + user_k, and arrives ``think_s`` after turn ``k-1`` finishes."""

    KIND: ClassVar[str] = "multi_turn"
    KEYS: ClassVar[tuple[str, ...]] = (
        "kind", "num_sessions", "num_requests", "session_rate_per_s", "turns",
        "system_prompt_tokens", "user_tokens", "output_tokens", "think_time_s")

    num_sessions: int | None         # sessions started (None: as many as num_requests needs)
    session_rate_per_s: float
    turns: Dist
    user_tokens: Dist
    output_tokens: Dist
    think_time_s: Dist
    system_prompt_tokens: Dist | None = None   # one prompt (stream sys/0) shared by all sessions
    num_requests: int | None = None  # requests in all (turns of every session); the last
                                     # session is cut short there

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str = WHERE) -> MultiTurnConfig:
        f = Fields(m, where, cls.KEYS)
        num_sessions = f.int("num_sessions", None, minimum=0, maximum=MAX_REQUESTS,
                             why=REQUESTS_WHY)
        num_requests = f.int("num_requests", None, minimum=0, maximum=MAX_REQUESTS,
                             why=REQUESTS_WHY)
        if num_sessions is None and num_requests is None:
            raise WorkloadError(f"{f.name('num_requests')}: missing (give num_requests and/or "
                                f"num_sessions)")
        sys_tokens = None
        if f.has("system_prompt_tokens"):
            sys_tokens = Dist.parse(f.raw("system_prompt_tokens"), f.name("system_prompt_tokens"),
                                    integer=True, minimum=1)
        think = Dist("fixed", False, value=0.0)
        if f.has("think_time_s"):
            think = Dist.parse(f.raw("think_time_s"), f.name("think_time_s"), integer=False,
                               minimum=0.0, maximum=MAX_TIME_S, why=TIME_WHY)
        rate = f.number("session_rate_per_s", positive=True)
        if num_sessions is not None and num_sessions / rate > MAX_TIME_S:
            raise time_limit_error(f.name("session_rate_per_s"), 0.0,
                                   f"{big(num_sessions)} sessions at {rate:g}/s start over "
                                   f"~{num_sessions / rate:.3g} s, which")
        turns = Dist.parse(f.raw("turns"), f.name("turns"), integer=True, minimum=1,
                           maximum=MAX_TURNS, why="a turn resends the whole conversation")
        mean_turns = {"fixed": turns.value, "uniform": (turns.low + turns.high) / 2}.get(
            turns.kind, turns.mean)
        if num_requests is None and num_sessions * mean_turns > MAX_REQUESTS:
            raise WorkloadError(f"{f.name('num_sessions')}: {big(num_sessions)} sessions of "
                                f"~{mean_turns:g} turns are ~{big(int(num_sessions * mean_turns))} "
                                f"requests, more than the {big(MAX_REQUESTS)} a run may have "
                                "(give num_requests)")
        return cls(
            num_sessions=num_sessions,
            session_rate_per_s=rate,
            turns=turns,
            user_tokens=_int_dist(f, "user_tokens", 1),
            output_tokens=_int_dist(f, "output_tokens", 1),
            think_time_s=think,
            system_prompt_tokens=sys_tokens, num_requests=num_requests)

    def requests(self, seed: int) -> Iterator[TraceRequest]:
        """Sessions in start order, each session's turns together; stops after
        ``num_sessions`` sessions or ``num_requests`` requests, whichever comes first (the
        draws do not depend on either, so a smaller count gives a prefix of a larger one)."""
        rng = np.random.default_rng(seed)
        sys_len = self.system_prompt_tokens.sample(rng) if self.system_prompt_tokens else 0
        t = 0.0
        mean_gap = 1.0 / self.session_rate_per_s
        issued = 0
        s = -1
        while True:
            s += 1
            if self.num_sessions is not None and s >= self.num_sessions:
                return
            if self.num_requests is not None and issued >= self.num_requests:
                return
            t += float(rng.exponential(mean_gap))
            if t > MAX_TIME_S:
                _past_limits(t, issued, "session_rate_per_s")
            session = f"s{s:07d}"
            turns = self.turns.sample(rng)
            history: list[tuple[str, int, int]] = [("sys/0", 0, sys_len)] if sys_len else []
            prev: TraceRequest | None = None
            for k in range(turns):
                rid = f"{session}-t{k:02d}"
                user = self.user_tokens.sample(rng)
                out = self.output_tokens.sample(rng)
                segs = history + [(f"u/{rid}", 0, user)]
                if prev is None:
                    req = TraceRequest(rid, t, segs, out, session=session)
                else:
                    think = self.think_time_s.sample(rng)
                    if prev.arrival_s + think > MAX_TIME_S:
                        _past_limits(prev.arrival_s + think, issued, "think_time_s")
                    req = TraceRequest(rid, prev.arrival_s + think, segs, out, session=session,
                                       after=prev.request_id, think_s=think)
                if issued >= MAX_REQUESTS:
                    _past_limits(0.0, issued, "num_sessions")
                yield req
                issued += 1
                if self.num_requests is not None and issued >= self.num_requests:
                    return
                history = segs + [(output_stream(rid), 0, out)]
                prev = req

    def describe(self) -> str:
        sys_part = (f"system {self.system_prompt_tokens.describe()} tokens, "
                    if self.system_prompt_tokens else "")
        count = " and ".join(
            ([f"{self.num_sessions} sessions"] if self.num_sessions is not None else [])
            + ([f"{self.num_requests} requests"] if self.num_requests is not None else []))
        return (f"multi_turn: {count} at {self.session_rate_per_s:g}/s,"
                f" {self.turns.describe()} turns, {sys_part}user {self.user_tokens.describe()},"
                f" output {self.output_tokens.describe()}, think {self.think_time_s.describe()} s")
