"""Build and run a fleet: N replicas on one SimPy environment behind a router.

Each replica is built exactly as ``sim run`` builds its one replica (``sim.run``:
deployment, scheduler, request maker, recorder, step sampler, backend, engine); the
replicas share one heap of arrivals through a ``Gate`` (``sim/engine/gate.py``), which the
router's choice at each arrival feeds (its ``Door``: ``sim/engine/door.py``).  All replicas' finished requests go to one request
table (rows keyed by the fleet's arrival order), with the replica each went to beside it.
"""
from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

import simpy

from sim.cluster.routers import ROUTERS
from sim.cluster.routers.base import RouteRequest, Stateless
from sim.cluster.view import ReplicaView
from sim.errors import CapacityError, ConfigError
from sim.engine.arrivals import Arrivals
from sim.engine.door import Door, FinishWatch
from sim.engine.gate import Gate

# workload kinds whose records may follow up a previous turn (``after``): their arrivals
# depend on finishes, so replicas also wait for each other's steps (``Gate.closed_loop``)
CLOSED_LOOP_KINDS = ("multi_turn", "jsonl")


@dataclass
class Replica:
    """One replica's parts (what ``sim.commands.run.simulate`` builds for a run alone)."""

    index: int
    scenario: Any
    dep: Any                    # sim.engine.replica.Deployment
    sched: Any
    maker: Any
    sampler: Any
    recorder: Any
    backend: Any
    engine: Any
    view: ReplicaView


@dataclass
class FleetDeployment:
    """What a fleet resolves to, as ``sim.engine.replica.Deployment`` for one replica: the writers and
    the report read the same names (``layout``, ``num_blocks``, ``block_bytes``,
    ``records``, ``sampler``, ``kv_events``, ``memory``), for the fleet as a whole."""

    replicas: list[Replica]
    router: str
    layout: Any
    groups: tuple[str, ...]
    num_blocks: int             # the fleet's pool blocks, every replica's summed
    block_bytes: int            # replica 0's block (the same for identical replicas)
    pool_bytes: int             # every replica's pool, summed
    sampler: Any = None         # a merged view of the replicas' step samplers
    records: Any = field(default_factory=list)
    kv_events: Any = None
    memory: list | None = None
    replica_of: array = field(default_factory=lambda: array("q"))   # by arrival index
    wall_s: float = 0.0
    verify: list | None = None

    @property
    def kv(self):
        return self.replicas[0].dep.kv


class FleetContext:
    """What a router is built with (``RouterPolicy.build``): the replicas, their load views
    (``loads``), the fleet's one registry of token streams, and cache views made on demand
    and shared (``view``: ``sim/cluster/views.py``)."""

    def __init__(self, sc, replicas: list[Replica], streams):
        self.sc = sc
        self.replicas = replicas
        self.loads = [r.view for r in replicas]
        self.streams = streams
        self._views: dict = {}

    def view(self, name: str, lag_ms: float = 0.0):
        from sim.cluster.views import EventsView, OracleView, attach_events

        key = (name, lag_ms)
        got = self._views.get(key)
        if got is None:
            if name == "oracle":
                got = OracleView(self.replicas)
            elif name == "events":
                for r in self.replicas:
                    if r.scenario.cache.policy != "vllm":
                        raise ConfigError("cluster.router.view", f"events: replica {r.index} "
                                          f"runs cache.policy {r.scenario.cache.policy}; the "
                                          f"events index mirrors vLLM's pool (cache.policy "
                                          f"vllm)")
                got = EventsView(self.replicas, int(round(lag_ms * 1e6)))
                attach_events(got, self.replicas, self.sc)
            else:
                raise ConfigError("cluster.router.view", f"unknown view {name!r}")
            self._views[key] = got
        return got


def make_door(router, replicas: list[Replica], replica_of: array, fleet: FleetContext,
              hindsight: bool) -> Door:
    """The router's side of the shared arrivals (``sim/engine/door.py``) over these
    replicas; ``hindsight``: every replica's hit is asked at each arrival too."""
    return Door(router, [r.engine.inlet for r in replicas], [r.view for r in replicas],
                # each replica's key configuration (a prompt's keys under it are handed over)
                [(r.dep.kv.hasher.unit, r.dep.kv.hasher.lookahead) for r in replicas],
                replica_of, fleet.streams,
                keeps_counters=(getattr(type(router), "finished", Stateless.finished)
                                is not Stateless.finished),
                needs_prompt=getattr(router, "needs_prompt", False) or hindsight,
                predicts=hasattr(router, "needs_prompt"),
                oracle=fleet.view("oracle") if hindsight else None,
                arrays=lambda: array("q"))


class _Splitter:
    """The trace read once and dealt to the replicas by a router that reads no replica
    state (``oblivious``): each replica's feed takes its records in trace order, reading
    further (and routing, in arrival order) while it has none queued."""

    def __init__(self, trace, router, replicas: list[Replica], replica_of: array):
        from collections import deque

        self.trace = trace
        self.router = router
        self.views = [r.view for r in replicas]
        self.queues: list = [deque() for _ in replicas]
        self.replica_of = replica_of

    def feed(self, i: int):
        q = self.queues[i]
        while True:
            if q:
                yield q.popleft()
                continue
            rec = next(self.trace, None)
            if rec is None:
                return
            k = len(self.replica_of)
            req = RouteRequest(rec.request_id, rec.session, rec.segments, -1,
                               rec.output_tokens, -1, k)
            j = self.router.choose(req)
            rec.index = k
            self.replica_of.append(j)
            self.views[j].routed += 1
            self.queues[j].append(rec)


def replica_scenarios(sc) -> list:
    """Each replica's scenario: the fleet's, with its group's ``set`` applied."""
    from sim.config.scenario import ScenarioError, apply_overrides, scenario_from_mapping

    made: dict[tuple, Any] = {}
    out = []
    for i, sets in enumerate(sc.cluster.replica_sets()):
        key = tuple(sorted((k, repr(v)) for k, v in sets.items()))
        if key not in made:
            if not sets:
                made[key] = sc
            else:
                raw = {k: v for k, v in sc.raw.items() if k != "cluster"}
                try:
                    made[key] = scenario_from_mapping(apply_overrides(raw, sets), sc.path)
                except ConfigError as e:
                    raise ScenarioError(f"{sc.path}: cluster.replicas (replica {i}): {e}") \
                        from None
                object.__setattr__(made[key], "cluster", sc.cluster)
        out.append(made[key])
    return out


def build_replica(i: int, sc, env: simpy.Environment, kept, jump: bool, fast_decode: bool,
                  plant: str | None, streams) -> Replica:
    """One replica, as ``sim.commands.run.simulate`` builds its one (on the fleet's environment).
    ``streams``: the fleet's one registry of token streams, so that a prompt has the same
    block keys on every replica (as vLLM's block hashes do), which a router matching
    replicas' KV events needs; a replica's hits depend only on which keys are equal."""
    from sim.engine.replica import build_deployment, build_engine

    dep = build_deployment(sc)
    sched, maker, sampler, rec, backend, eng = build_engine(
        sc, dep, streams, kept.add, kept.add_batch, plant, jump, fast_decode, env=env)
    return Replica(i, sc, dep, sched, maker, sampler, rec, backend, eng, ReplicaView(i, sched))


def run_fleet(sc, progress: Callable[[int], None] | None = None, jump: bool = True,
              fast_decode: bool = True, plant: str | None = None,
              replayed: Callable[[Any], None] | None = None, traces=None):
    """Replay the scenario's workload through its fleet; returns (fleet deployment,
    served rows, summary), as ``sim.commands.run.simulate`` does for one replica."""
    from sim.rundir.request_table import RequestColumns
    from sim.engine.replica import quiet_gc, why_rejected
    from workloads import build_workload

    t_wall = time.perf_counter()
    cl = sc.cluster
    env = simpy.Environment()
    kept = RequestColumns()
    scenarios = replica_scenarios(sc)
    from sim.cache.prompt import StreamRegistry

    streams = StreamRegistry()
    replicas = [build_replica(i, s, env, kept, jump, fast_decode, plant, streams)
                for i, s in enumerate(scenarios)]
    tier = replicas[0].dep.offload is not None     # (the CPU tier's per-request columns)
    fleet = FleetContext(sc, replicas, streams)
    router = ROUTERS[cl.router.policy].build(cl.router.options, cl.router.seed, fleet)
    replica_of = array("q")
    closed = sc.workload.get("kind") in CLOSED_LOOP_KINDS
    finished = [0]

    def count(_n: int) -> None:
        finished[0] += 1
        progress(finished[0])

    if traces is None:
        traces = build_workload(sc.workload, sc.seed, sc.path.parent)
    hindsight = cl.hindsight
    door = None
    if getattr(router, "oblivious", False) and not closed and not hindsight:
        # A router that reads no replica decides the same at any time: each record is
        # routed as the trace is read, and each replica runs alone on its share (its own
        # heap of arrivals, on the fleet's clock), as fast as one replica alone.
        split = _Splitter(iter(traces), router, replicas, replica_of)
        for rep in replicas:
            eng = rep.engine
            if progress is not None:
                eng.progress = count
            eng.arrivals.indexed = True
            eng.arrivals.start(split.feed(rep.index))
            eng.process()
    else:
        door = make_door(router, replicas, replica_of, fleet, hindsight)
        arrivals = Arrivals(replicas[0].engine.inlet)
        gate = Gate(env, arrivals, closed_loop=closed)
        arrivals.router = door
        for rep in replicas:
            eng = rep.engine
            eng.arrivals = arrivals
            eng.gate = gate
            # without follow-up turns a decode jump runs past arrivals routed elsewhere
            # (what a router reads of a replica does not change inside a jump); the CPU
            # tier's replicas step to each arrival as before
            eng.cuttable = eng.jump and not closed and eng.sched.connector is None
            gate.add(eng.inlet)
            eng.finish_observers.append(FinishWatch(door, rep.index))
            if progress is not None:
                eng.progress = count
        arrivals.start(iter(traces), engines=len(replicas))
        gate.start()
        for rep in replicas:
            rep.engine.process()
    with quiet_gc():
        env.run()
    for rep in replicas:
        if rep.dep.kv_events is not None:
            # (the fleet writes no replica's stream: the spooled files go now)
            rep.dep.kv_events.discard()
    rejected = [r for rep in replicas for r in rep.engine.rejected]
    if not any(rep.recorder.pending for rep in replicas) and not kept.n and rejected:
        first = min(rejected, key=lambda r: r.index)
        rep = replicas[replica_of[first.index]]
        raise CapacityError(f"every request was rejected ({len(rejected):,}); the first: "
                            f"{why_rejected(rep.sched, first)}")
    fdep = _fleet_deployment(sc, replicas, replica_of)
    if replayed is not None:
        replayed(fdep)
    for rep in replicas:
        for r in rep.engine.rejected:
            rep.recorder.reject(r)
        rep.recorder.flush()
    from sim.cluster.outputs import fleet_summary, with_replica_column

    fdep.records = with_replica_column(kept.table(sc.slo), replica_of)
    if door is not None:
        from sim.cluster.outputs import with_routing_columns

        fdep.records = with_routing_columns(fdep.records, door)
    if tier:
        from sim.engine.replica import with_tier_columns

        fdep.records = with_tier_columns(fdep.records, [rep.recorder.tier for rep in replicas])
    rows = fdep.records.served()
    fdep.wall_s = time.perf_counter() - t_wall
    summary = fleet_summary(sc, fdep, rows)
    if tier:
        from sim.rundir.summary import offload_summary

        summary = offload_summary(sc, fdep, rows, summary)
    return fdep, rows, summary


def _fleet_deployment(sc, replicas: list[Replica], replica_of: array) -> FleetDeployment:
    from sim.cluster.outputs import MergedSampler

    d0 = replicas[0].dep
    return FleetDeployment(
        replicas=replicas, router=sc.cluster.router.policy, layout=d0.layout,
        groups=d0.groups, num_blocks=sum(r.dep.num_blocks for r in replicas),
        block_bytes=d0.block_bytes,
        pool_bytes=sum(r.dep.num_blocks * r.dep.block_bytes for r in replicas),
        sampler=MergedSampler([r.sampler for r in replicas]),
        kv_events=None, replica_of=replica_of)
