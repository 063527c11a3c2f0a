"""Arrivals at equal instants (the engine keeps them off SimPy's queue, on its own heap,
in the order a process per request would have had them: sim/engine/engine.py).

One time unit per step (``FixedStep``), so arrivals, step ends, finishes and think times
coincide on purpose.  What must hold, from vLLM's engine loop (new requests are added
before each step) and the closed loop of follow-up turns (a turn arrives its think time
after its previous turn *finishes*, the finish being known once that step's outputs are
processed):

* a request arriving at the instant a step ends is in the next step;
* requests arriving together are queued in trace order;
* a follow-up turn with no think time arrives at its previous turn's finish instant; an
  idle engine serves it at once, a busy one in its next step (that step was planned
  before the finish was processed);
* a follow-up of a turn rejected on arrival arrives its think time after that arrival.
"""
from __future__ import annotations

from dataclasses import dataclass

from backends.base import FixedStep
from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry, parse_prompt
from sim.config.scheduler import SchedulerConfig
from sim.engine.engine import Engine
from sim.engine.scheduler import Scheduler, SimRequest

UNIT_S = 1e-9   # one step = 1 ns


@dataclass
class _Trace:
    request_id: str
    arrival_s: float
    prompt: str
    output_tokens: int
    after: str | None = None
    think_s: float = 0.0


def _replay(traces: list[_Trace], max_model_len: int | None = None,
            jump: bool = True, max_num_seqs: int = 8) -> tuple[dict[str, SimRequest], list[list[str]], list[int],
                                        Engine]:
    """Replay ``traces``; returns the requests, each step's scheduled request ids (index =
    the step's start time in units), the start of each decode jump, and the engine."""
    kv = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16,
                                    hash_block_size=16, num_blocks=64))
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=max_num_seqs,
                                      max_model_len=max_model_len), kv)
    streams = StreamRegistry()
    by_id = {t.request_id: t for t in traces}
    made: dict[str, SimRequest] = {}

    def make(trace, index):
        r = SimRequest(kv.make_request(trace.request_id,
                                       parse_prompt(by_id[trace.request_id].prompt, streams)),
                       trace.output_tokens, index)
        r.out_stream = streams.id(f"out/{trace.request_id}")
        made[trace.request_id] = r
        return r

    eng = Engine(sched, FixedStep(UNIT_S), make, lambda r: None, jump=jump)
    steps: list[list[str]] = []
    jumps: list[int] = []   # start of each step that stood for several (a decode jump)

    def on_step(items, now, end, k):
        if k > 1:
            jumps.append(now)
        while len(steps) < now:
            steps.append([])
        for i in range(k):
            steps.append(sorted(it.req.cache.request_id for it in items))

    eng.on_step = on_step
    eng.run(traces)
    return made, steps, jumps, eng


def test_a_request_arriving_as_a_step_ends_is_in_the_next_step():
    made, steps, _, _ = _replay([_Trace("a", 0.0, "A:20", 4), _Trace("b", 1e-9, "B:20", 2)])
    assert made["b"].arrival_ns == 1 and made["b"].first_scheduled_ns == 1
    assert steps[0] == ["a"] and steps[1] == ["a", "b"]


def test_requests_arriving_together_queue_in_trace_order():
    # one request at a time: the order they are served in is the queue's
    traces = [_Trace(x, 2e-9, f"{x.upper()}:20", 1) for x in "cab"]
    made, _, _, _ = _replay([_Trace("z", 0.0, "Z:20", 1)] + traces, max_num_seqs=1)
    assert [made[x].index for x in "cab"] == [1, 2, 3]
    assert {made[x].arrival_ns for x in "cab"} == {2}
    starts = [made[x].first_scheduled_ns for x in "cab"]
    assert starts == sorted(starts) and len(set(starts)) == 3


def test_a_follow_up_without_think_time_arrives_at_the_finish():
    # idle engine: the follow-up is served at the finish instant
    made, _, _, _ = _replay([_Trace("a", 0.0, "A:20", 2), _Trace("b", 0.0, "B:8", 1, after="a")])
    a, b = made["a"], made["b"]
    assert a.finish_ns > 0 and b.arrival_ns == a.finish_ns
    assert b.first_scheduled_ns == a.finish_ns
    # busy engine (c still decoding): the step starting at the finish was planned
    # before the finish was processed; the follow-up joins the one after
    made, steps, _, _ = _replay([_Trace("a", 0.0, "A:20", 2), _Trace("c", 0.0, "C:20", 6),
                              _Trace("b", 0.0, "B:8", 1, after="a")])
    a, b, c = made["a"], made["b"], made["c"]
    t = a.finish_ns
    assert b.arrival_ns == t and c.finish_ns > t + 1
    assert b.first_scheduled_ns == t + 1
    assert steps[t] == ["c"] and steps[t + 1] == ["b", "c"]


def test_decode_jumps_change_nothing_at_equal_instants():
    traces = [_Trace("a", 0.0, "A:20", 9), _Trace("c", 0.0, "C:20", 30),
              _Trace("b", 0.0, "B:8", 5, after="a", think_s=4e-9),
              _Trace("d", 11e-9, "D:8", 3), _Trace("e", 0.0, "E:8", 2, after="d")]
    one, s1, j1, e1 = _replay(traces, jump=False)
    many, s2, j2, e2 = _replay(traces, jump=True)
    assert j2 and not j1
    key = [(r.arrival_ns, r.first_scheduled_ns, r.finish_ns) for r in one.values()]
    assert key == [(r.arrival_ns, r.first_scheduled_ns, r.finish_ns) for r in many.values()]
    assert s1 == s2 and e1.steps == e2.steps
    assert one["b"].arrival_ns == one["a"].finish_ns + 4


def test_a_follow_up_of_a_rejected_turn_arrives_its_think_time_after_it():
    made, _, _, eng = _replay([_Trace("a", 1e-9, "A:300", 2),
                            _Trace("b", 0.0, "B:8", 1, after="a", think_s=3e-9)],
                           max_model_len=256)
    assert [r.cache.request_id for r in eng.rejected] == ["a"]
    assert made["a"].arrival_ns == 1 and made["b"].arrival_ns == 4
    assert made["b"].num_output == 1
