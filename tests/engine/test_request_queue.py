"""Scheduler policies (``sim/engine/request_queue.py``): each queue's order, where a
preempted request goes back, whom it preempts; ``lpm`` reordering and its starvation bound
on step cases.  (``priority`` against vLLM's real Scheduler: test_golden_priority.py.)"""
from __future__ import annotations

import pytest

from sim.cache.case import CaseError
from sim.config.scheduler import SchedulerConfig
from sim.engine.request_queue import (QUEUE_POLICIES, FCFSQueue, LPMQueue, PriorityQueue,
                                      make_queue)
from sim.commands.steps import run_steps_data


class _Req:
    """The fields a queue reads of a request."""

    def __init__(self, name: str, priority: int = 0, arrival_ns: int = 0, index: int = 0):
        self.name, self.priority, self.arrival_ns, self.index = name, priority, arrival_ns, index


def _names(q) -> list[str]:
    return [r.name for r in q]


def test_registry_names_every_policy():
    assert sorted(QUEUE_POLICIES) == ["fcfs", "lpm", "priority"]
    assert isinstance(make_queue(SchedulerConfig()), FCFSQueue)
    assert isinstance(make_queue(SchedulerConfig(policy="priority")), PriorityQueue)
    q = make_queue(SchedulerConfig(policy="lpm", lpm_max_wait_steps=None, lpm_max_queue=7))
    assert isinstance(q, LPMQueue) and q.reorders and (q.max_wait_steps, q.max_queue) == (None, 7)


def test_fcfs_keeps_arrival_order_and_a_preempted_request_goes_to_the_front():
    q = FCFSQueue()
    a, b, c = _Req("a", index=0), _Req("b", index=1), _Req("c", index=2)
    q.add_request(a)
    q.add_request(b)
    q.prepend_request(c)
    assert _names(q) == ["c", "a", "b"] and q.peek_request() is c and q[0] is c
    assert q.pop_request() is c and len(q) == 2
    assert FCFSQueue.victim([a, b, c]) == 2          # the newest running request


def test_priority_orders_by_priority_then_arrival_and_has_no_front():
    q = PriorityQueue()
    reqs = [_Req("a", 2, 0, 0), _Req("b", 0, 5, 1), _Req("c", 0, 3, 2), _Req("d", 1, 0, 3),
            _Req("e", 0, 3, 4)]
    for r in reqs:
        q.add_request(r)
    assert _names(q) == ["c", "e", "b", "d", "a"]     # equal (priority, arrival): index
    assert q[0].name == "c" and q.peek_request().name == "c" and len(q) == 5
    late = _Req("f", 1, 9, 5)
    q.prepend_request(late)                           # back by its key, not to the front
    assert _names(q) == ["c", "e", "b", "d", "f", "a"]
    assert [q.pop_request().name for _ in range(6)] == ["c", "e", "b", "d", "f", "a"]
    assert not q


def test_priority_victim_is_the_largest_priority_then_the_latest_arrival():
    running = [_Req("a", 1, 0, 0), _Req("b", 3, 2, 1), _Req("c", 3, 1, 2), _Req("d", 0, 9, 3)]
    assert PriorityQueue.victim(running) == 1         # b: priority 3, arrived after c
    assert PriorityQueue.victim(running[2:]) == 0     # c, though d is newer


# ----------------------------------------------------------------------- lpm steps --
def _lpm_case(**cfg) -> dict:
    """One request warms a 256-token prefix; at step 5 a cold request arrives first, then
    three that share the prefix, behind ``max_num_seqs: 1`` (one admitted at a time)."""
    config = {"groups": ["full", "mamba"], "block_size": 16, "hash_block_size": 16,
              "max_num_seqs": 1}
    config.update(cfg)
    reqs = [{"id": "warm", "prompt": "S:256 W:16", "arrival_step": 0, "max_tokens": 1},
            {"id": "cold", "prompt": "B:272", "arrival_step": 5, "max_tokens": 10}]
    reqs += [{"id": f"hit{k}", "prompt": f"S:256 P{k}:16", "arrival_step": 5, "max_tokens": 10}
             for k in range(3)]
    return {"config": config, "requests": reqs}


def _admitted(cfg: dict) -> list[tuple[str, int, int]]:
    got = sorted(run_steps_data(_lpm_case(**cfg)), key=lambda r: r["first_scheduled_step"])
    return [(r["id"], r["first_scheduled_step"], r["hit"]) for r in got]


def test_lpm_admits_the_longest_prefix_hit_first():
    fcfs = _admitted({})
    lpm = _admitted({"policy": "lpm", "lpm_max_wait_steps": None})
    assert [r[0] for r in fcfs] == ["warm", "cold", "hit0", "hit1", "hit2"]
    assert [r[0] for r in lpm] == ["warm", "hit0", "hit1", "hit2", "cold"]   # cold starves
    assert all(hit == 256 for rid, _, hit in lpm if rid.startswith("hit"))
    assert dict((r[0], r[1]) for r in lpm)["hit0"] == 5        # admitted on arrival


def test_lpm_starvation_bound_puts_a_long_waiting_request_first():
    # hit0 runs steps 5-14; at step 15 cold has waited 10 >= 8 steps: it goes next
    got = _admitted({"policy": "lpm", "lpm_max_wait_steps": 8})
    assert [r[0] for r in got] == ["warm", "hit0", "cold", "hit1", "hit2"]
    assert dict((r[0], r[1]) for r in got)["cold"] == 15
    # a bound longer than the whole run changes nothing
    assert _admitted({"policy": "lpm", "lpm_max_wait_steps": 1000}) == \
        _admitted({"policy": "lpm", "lpm_max_wait_steps": None})


def test_lpm_stops_sorting_past_max_queue():
    # 4 waiting > 2 from the start: never re-sorted while they wait, so arrival order
    assert _admitted({"policy": "lpm", "lpm_max_queue": 2}) == _admitted({})


def test_priority_reorders_the_same_case_by_request_priority():
    case = _lpm_case(policy="priority")
    for r, p in zip(case["requests"], [0, 2, 1, 0, 1]):   # warm, cold, hit0, hit1, hit2
        r["priority"] = p
    got = sorted(run_steps_data(case), key=lambda r: r["first_scheduled_step"])
    assert [r["id"] for r in got] == ["warm", "hit1", "hit0", "hit2", "cold"]


@pytest.mark.parametrize("cfg, match", [
    ({"policy": "lifo"}, r"config\.policy: unknown policy 'lifo' \(choices: fcfs, lpm, priority\)"),
    ({"policy": "lpm", "lpm_max_queue": 0}, r"config\.lpm_max_queue: must be an integer >= 1"),
    ({"lpm_max_wait_steps": 5}, r"config\.lpm_max_wait_steps: only used by policy lpm"),
])
def test_bad_policy_keys_in_a_step_case(cfg, match):
    with pytest.raises(CaseError, match=match):
        run_steps_data(_lpm_case(**cfg))


def test_bad_request_priority_in_a_step_case():
    case = _lpm_case(policy="priority")
    case["requests"][1]["priority"] = "high"
    with pytest.raises(CaseError, match=r"requests\[1\]\.priority: must be an integer"):
        run_steps_data(case)


def test_the_config_accepts_exactly_the_queues_the_engine_builds():
    from sim.config.scheduler import QUEUE_POLICY_NAMES
    from sim.engine.request_queue import QUEUE_POLICIES

    assert sorted(QUEUE_POLICY_NAMES) == sorted(QUEUE_POLICIES)
