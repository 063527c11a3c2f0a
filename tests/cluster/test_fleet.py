"""A fleet of replicas on one clock behind a router (sim/cluster): each replica runs
exactly as it would alone.

* ``cluster.replicas: 1`` gives every column of every output of the run without a
  ``cluster`` section (plus the ``replica`` column), open and closed loop;
* a fleet decomposes: each replica's requests, cut out of the trace with the instants
  the router handed them over and replayed alone on one replica, get the same hit, TTFT
  and end-to-end latency, for every router policy, on athena and on a Mooncake slice;
* two engines of different scenarios side by side on one SimPy environment (no router)
  each give what they give alone (no state shared between engines);
* same inputs and seed, the same bytes.
"""
from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import simpy

from sim.cluster.fleet import replica_scenarios
from sim.cluster.routers import ROUTERS
from sim.config.scenario import load_scenario
from sim.engine.arrivals import ns
from sim.commands.run import simulate, write_run
from workloads import build_workload

ROOT = Path(__file__).resolve().parents[2]
ATHENA = ROOT / "scenarios" / "athena.yaml"
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
MULTI = ROOT / "scenarios" / "multi-turn.yaml"
MOONCAKE = ROOT / "scenarios" / "mooncake-conversation.yaml"
MOONCAKE_HEAD = ROOT / "tests" / "fixtures" / "mooncake_conversation_head.jsonl"


def _strip_replica(path: Path) -> list[list[str]]:
    rows = list(csv.reader(open(path, newline="")))
    assert rows[0][-1] == "replica"
    return [r[:-1] for r in rows]


def _summary(folder: Path) -> dict:
    s = json.loads((folder / "summary.json").read_text())
    for k in ("wall_s", "sim_requests_per_s"):
        s.pop(k)
    return s


@pytest.mark.parametrize("path, over", [
    (TINY, {}),
    (MULTI, {"workload.num_sessions": 40}),
    (MOONCAKE, {"workload.path": str(MOONCAKE_HEAD), "workload.num_requests": 300}),
])
def test_one_replica_is_the_run_alone(tmp_path, path, over):
    alone_sc = load_scenario(path, over)
    fleet_sc = load_scenario(path, {**over, "cluster.replicas": 1,
                                    "cluster.router.policy": "power_of_two"})
    a = write_run(tmp_path / "alone", alone_sc, *simulate(alone_sc), report=False)
    b = write_run(tmp_path / "fleet", fleet_sc, *simulate(fleet_sc), report=False)
    assert list(csv.reader(open(a / "requests.csv", newline=""))) == \
        _strip_replica(b / "requests.csv")
    assert list(csv.reader(open(a / "memory.csv", newline=""))) == \
        _strip_replica(b / "memory.csv")
    sa, sb = _summary(a), _summary(b)
    assert {k: sb[k] for k in sa} == sa
    assert sb["replicas"] == 1 and sb["per_replica"][0]["requests"] == sa["requests"]


def _decompose(sc) -> int:
    """Run the fleet, then each replica alone on its requests; returns how many requests
    were compared (asserting every one equal)."""
    dep, rows, _ = simulate(sc)
    table = dep.records
    ids = table.column("request_id")
    arrivals = table.column("arrival_s")
    which = table.column("replica")
    got = {c: table.column(c) for c in ("hit_tokens", "ttft_s", "e2e_s", "rejected")}
    records = {r.request_id: r for r in build_workload(sc.workload, sc.seed, sc.path.parent)}
    scenarios = replica_scenarios(sc)
    compared = 0
    for j in range(sc.cluster.replicas):
        mine = [k for k in range(len(ids)) if which[k] == j]
        if not mine:
            continue
        cut = []
        for k in mine:
            rec = records[ids[k]]
            assert ns(arrivals[k]) == ns(float(arrivals[k]))   # (an exact instant)
            cut.append(dataclasses.replace(rec, arrival_s=arrivals[k], after=None, think_s=0.0))
        alone = dataclasses.replace(scenarios[j], cluster=None)
        adep, _, _ = simulate(alone, traces=cut)
        at = adep.records
        assert list(at.column("request_id")) == [ids[k] for k in mine]
        for c, col in got.items():
            assert list(at.column(c)) == [col[k] for k in mine], (j, c)
        # its steps, as its sampler saw them (memory rows, inter-token gaps): a decode jump
        # that runs past arrivals routed elsewhere is cut by its own as the jump alone is
        mine_s, alone_s = dep.sampler.samplers[j], adep.sampler
        assert mine_s.row_bytes() == alone_s.row_bytes(), (j, "memory rows")
        assert mine_s.itl_dense_bytes() == alone_s.itl_dense_bytes(), (j, "gaps")
        assert (mine_s.itl_sparse, mine_s.itl_count, mine_s.itl_sum_ns) == \
            (alone_s.itl_sparse, alone_s.itl_count, alone_s.itl_sum_ns), (j, "gaps")
        compared += len(mine)
    assert compared == len(ids)
    return compared


@pytest.mark.parametrize("policy", sorted(ROUTERS))
def test_an_athena_fleet_decomposes(policy):
    sc = load_scenario(ATHENA, {"workload.num_requests": 240, "workload.rate_per_s": 6.0,
                                "cluster.replicas": 3, "cluster.router.policy": policy,
                                "cluster.router.seed": 5})
    assert _decompose(sc) == 240


@pytest.mark.parametrize("policy", sorted(ROUTERS))
def test_a_mooncake_fleet_decomposes(policy):
    sc = load_scenario(MOONCAKE, {"workload.path": str(MOONCAKE_HEAD),
                                  "workload.num_requests": 200, "workload.time_scale": 0.25,
                                  "cluster.replicas": 4, "cluster.router.policy": policy})
    assert _decompose(sc) == 200


@pytest.mark.parametrize("policy", ["least_outstanding", "hybrid_aware"])
def test_a_fleet_under_lpm_decomposes(policy):
    """lpm's starvation bound counts the steps since a request arrived: one routed to a
    replica inside a decode jump that runs past other replicas' arrivals saw the step index
    of the steps that had ended by then, as alone."""
    sc = load_scenario(ATHENA, {"workload.num_requests": 240, "workload.rate_per_s": 6.0,
                                "cluster.replicas": 2, "cluster.router.policy": policy,
                                "scheduler.policy": "lpm", "scheduler.lpm_max_wait_steps": 4})
    assert _decompose(sc) == 240


def test_two_engines_on_one_environment_run_as_alone():
    from backends.base import build_backend
    from sim.cache.prompt import StreamRegistry
    from sim.engine.engine import Engine
    from sim.engine.record import Recorder, RequestMaker, StepSampler
    from sim.engine.scheduler import Scheduler
    from sim.rundir.request_table import RequestColumns
    from sim.engine.replica import build_deployment

    scs = [load_scenario(TINY), load_scenario(ATHENA, {"workload.num_requests": 150})]
    env = simpy.Environment()
    kept = []
    for sc in scs:
        dep = build_deployment(sc)
        sched = Scheduler(sc.scheduler, dep.kv, accepted_per_step=sc.speculative.mean_accepted_tokens
                          if sc.speculative.method else 0.0, reject_unservable=True)
        maker = RequestMaker(dep.kv, StreamRegistry())
        sampler = StepSampler(sched)
        cols = RequestColumns()
        rec = Recorder(maker, sampler, cols.add, cols.add_batch)
        eng = Engine(sched, build_backend(sc, dep), maker.make, rec.finish, env=env)
        eng.maker, eng.recorder, eng.sampler = maker, rec, sampler
        eng.arrivals.start(iter(build_workload(sc.workload, sc.seed, sc.path.parent)))
        eng.process()
        kept.append((sc, rec, cols))
    env.run()
    for sc, rec, cols in kept:
        rec.flush()
        side = cols.table()
        # (miss attribution off in both: it only adds columns)
        adep, _, _ = simulate(dataclasses.replace(sc, attribution=False))
        for c in ("request_id", "hit_tokens", "ttft_s", "e2e_s"):
            assert list(side.column(c)) == list(adep.records.column(c)), (sc.name, c)


def test_a_fleet_run_is_byte_identical_twice(tmp_path):
    sc = load_scenario(TINY, {"cluster.replicas": 3, "cluster.router.policy": "random",
                              "cluster.router.seed": 9})
    a = write_run(tmp_path / "a", sc, *simulate(sc), report=False)
    b = write_run(tmp_path / "b", sc, *simulate(sc), report=False)
    for f in ("requests.csv", "memory.csv", "replicas.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    assert _summary(a) == _summary(b)


def test_a_routed_prompts_keys_are_handed_over_once():
    """A fleet's router builds each arrival's prompt keys; the chosen replica's request
    takes them (no second hashing of the prompt) and the next request builds its own."""
    from sim.cache.config import CacheConfig
    from sim.cache.kv_manager import KVCacheManager
    from sim.cache.prompt import StreamRegistry
    from sim.engine.record import RequestMaker, prompt_of
    from workloads.base import TraceRequest

    kv = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16,
                                    hash_block_size=16, num_blocks=64))
    streams = StreamRegistry()
    maker = RequestMaker(kv, streams)
    a = TraceRequest("a", 0.0, [("p", 0, 40)], 4)
    b = TraceRequest("b", 0.0, [("p", 0, 40)], 4)
    built = streams.keys_of(prompt_of(a.segments), kv.hasher)
    maker.next_keys = built
    ra = maker.make(a, 0)
    assert ra.cache.block_hashes is built and maker.next_keys is None
    rb = maker.make(b, 1)
    assert rb.cache.block_hashes is not built
    assert rb.cache.block_hashes.keys() == built.keys() and len(built.keys()) == 2
