"""system_prompt and multi_turn generators, and the distributions they sample."""
from collections import Counter

import numpy as np
import pytest

from workloads import Dist, WorkloadError, build_workload

SP = {
    "kind": "system_prompt",
    "num_system_prompts": 5,
    "system_prompt_tokens": {"dist": "uniform", "low": 100, "high": 4000},
    "popularity": "zipf",
    "suffix_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8, "max": 3000},
    "output_tokens": {"dist": "uniform", "low": 1, "high": 400},
    "rate_per_s": 20.0,
    "num_requests": 2000,
}

MT = {
    "kind": "multi_turn",
    "num_sessions": 40,
    "session_rate_per_s": 2.0,
    "turns": {"dist": "uniform", "low": 1, "high": 5},
    "system_prompt_tokens": 700,
    "user_tokens": {"dist": "lognormal", "mean": 60, "sigma": 0.5},
    "output_tokens": {"dist": "uniform", "low": 5, "high": 90},
    "think_time_s": {"dist": "uniform", "low": 1.0, "high": 30.0},
}


def sp(seed=0, **over):
    return list(build_workload({**SP, **over}, seed, None))


def key(reqs):
    return [(r.request_id, r.arrival_s, r.segments, r.output_tokens) for r in reqs]


# ----------------------------------------------------------------------------- system_prompt

def test_system_prompt_deterministic_given_seed():
    a, b, c = sp(7, num_requests=300), sp(7, num_requests=300), sp(8, num_requests=300)
    assert key(a) == key(b)
    assert [r.request_id for r in a] == [r.request_id for r in c] == [f"r{i:07d}" for i in range(300)]
    assert [r.prompt_tokens for r in a] != [r.prompt_tokens for r in c]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


def test_system_prompt_structure():
    reqs = sp(3, num_requests=500)
    sys_len: dict[str, int] = {}
    for r in reqs:
        (s, off, n), (u, uoff, un) = r.segments
        assert s.startswith("sys/") and 0 <= int(s[4:]) < 5 and off == 0 and 100 <= n <= 4000
        assert sys_len.setdefault(s, n) == n             # one length per system prompt
        assert (u, uoff) == (f"u/{r.request_id}", 0) and 0 < un <= 3000
        assert 1 <= r.output_tokens <= 400
        assert r.session is None and r.after is None and r.think_s == 0.0
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(reqs, reqs[1:]))


def test_zipf_makes_prompt_zero_the_most_popular():
    counts = Counter(r.segments[0][0] for r in sp(11))
    assert counts.most_common(1)[0][0] == "sys/0"
    assert counts["sys/0"] > counts["sys/1"] > counts["sys/4"]
    flat = Counter(r.segments[0][0] for r in sp(11, popularity="uniform"))
    assert max(flat.values()) < 1.25 * min(flat.values())


def test_poisson_mean_gap():
    rate = 20.0
    reqs = sp(5, num_requests=5000, rate_per_s=rate)
    gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
    assert abs(gaps.mean() - 1 / rate) < 0.1 / rate
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.1          # exponential: cv 1


def test_gamma_arrivals_have_the_asked_cv():
    reqs = sp(5, num_requests=5000, rate_per_s=4.0, arrival="gamma", cv=0.5)
    gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
    assert abs(gaps.mean() - 0.25) < 0.025
    assert abs(gaps.std() / gaps.mean() - 0.5) < 0.05


def test_duration_stops_generation():
    reqs = sp(2, num_requests=None, duration_s=50.0)
    assert all(r.arrival_s <= 50.0 for r in reqs)
    assert 800 < len(reqs) < 1200                                # ~ 20/s * 50 s
    assert len(sp(2, duration_s=50.0, num_requests=10)) == 10    # whichever comes first


def test_explicit_prompt_lengths_and_zero_suffix():
    reqs = sp(1, num_requests=50, num_system_prompts=3, system_prompt_tokens=[10, 20, 30],
              suffix_tokens=0, output_tokens=4)
    for r in reqs:
        assert len(r.segments) == 1                              # no empty suffix segment
        name, _, n = r.segments[0]
        assert n == {"sys/0": 10, "sys/1": 20, "sys/2": 30}[name]
        assert r.output_tokens == 4
    with pytest.raises(WorkloadError, match=r"^workload\.system_prompt_tokens: has 2 lengths"):
        sp(num_system_prompts=3, system_prompt_tokens=[10, 20])


def test_lognormal_mean_and_clipping():
    rng = np.random.default_rng(0)
    d = Dist.parse({"dist": "lognormal", "mean": 500, "sigma": 0.6}, "x", integer=True, minimum=1)
    xs = np.array([d.sample(rng) for _ in range(4000)])
    assert abs(xs.mean() - 500) < 25 and xs.dtype.kind == "i"
    c = Dist.parse({"dist": "lognormal", "mean": 500, "sigma": 1.5, "min": 100, "max": 800}, "x",
                   integer=True, minimum=1)
    ys = [c.sample(rng) for _ in range(2000)]
    assert min(ys) == 100 and max(ys) == 800
    u = Dist.parse({"dist": "uniform", "low": 3, "high": 5}, "x", integer=True)
    assert {u.sample(rng) for _ in range(200)} == {3, 4, 5}
    f = Dist.parse({"dist": "uniform", "low": 0.5, "high": 1.5}, "x", integer=False)
    assert all(0.5 <= f.sample(rng) < 1.5 for _ in range(100))


# ----------------------------------------------------------------------------- multi_turn

def mt(seed=0, **over):
    return list(build_workload({**MT, **over}, seed, None))


def test_multi_turn_follow_up_resends_the_conversation():
    reqs = mt(4)
    by_id = {r.request_id: r for r in reqs}
    follow = [r for r in reqs if r.after is not None]
    assert len(follow) > 20
    for r in follow:
        prev = by_id[r.after]
        n = len(prev.segments)
        assert r.segments[:n] == prev.segments                                   # previous prompt
        assert r.segments[n] == (f"out/{prev.request_id}", 0, prev.output_tokens)  # its answer
        assert r.segments[n + 1][:2] == (f"u/{r.request_id}", 0)                 # the new user text
        assert len(r.segments) == n + 2
        assert r.session == prev.session
        assert 1.0 <= r.think_s <= 30.0
        assert r.arrival_s == pytest.approx(prev.arrival_s + r.think_s)          # a lower bound
    for r in reqs:
        assert r.segments[0] == ("sys/0", 0, 700)                                # shared by all


def test_multi_turn_sessions_and_order():
    reqs = mt(9)
    sessions = Counter(r.session for r in reqs)
    assert len(sessions) == 40 and all(1 <= n <= 5 for n in sessions.values())
    firsts = [r for r in reqs if r.after is None]
    assert len(firsts) == 40
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(firsts, firsts[1:]))
    # each follow-up comes right after its session's previous turn
    for x, y in zip(reqs, reqs[1:]):
        if y.after is not None:
            assert y.after == x.request_id
    assert reqs[0].request_id == "s0000000-t00" and reqs[0].session == "s0000000"
    assert key(mt(9)) == key(reqs) and key(mt(10)) != key(reqs)


def test_multi_turn_without_system_prompt():
    reqs = mt(1, system_prompt_tokens=None, turns=2, think_time_s=None)
    first, second = reqs[0], reqs[1]
    assert first.segments == [(f"u/{first.request_id}", 0, first.prompt_tokens)]
    assert second.after == first.request_id and second.think_s == 0.0
    assert len(reqs) == 80
