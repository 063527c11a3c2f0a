"""The events view's delivery (sim/cluster/views.py) and the records it reads
(``EventRecords``, sim/cache/events.py).

A replica publishing to a router alone queues its events as machine-integer records; one
that also writes its own stream (``kv_events``) publishes event objects, which become
records for the router.  Both must be the same events in the same batches, and a batch must reach the router ``event_lag_ms``
after its step whatever another replica published meanwhile.
"""
from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import sim.commands.steps as steps
from sim.cache.config import CacheConfig
from sim.cache.events import GROUP_BITS, Cleared, EventRecords, KVEventLog, Removed, Stored
from sim.cache.kv_manager import KVCacheManager
from sim.cluster.views import EventsView
from sim.commands.run import simulate, write_run
from sim.config.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "events"
ATHENA_FLEET = ROOT / "scenarios" / "cluster" / "athena-fleet.yaml"


def _flat(events: list) -> list[tuple[int, int]]:
    """A batch of event objects as (pool key, end) records (end -1: removed)."""
    out: list[tuple[int, int]] = []
    for ev in events:
        if isinstance(ev, Stored):
            out += [((k << GROUP_BITS) | ev.group, e) for k, e in zip(ev.keys, ev.ends)]
        elif isinstance(ev, Removed):
            out.append((ev.pool_key, -1))
        else:
            assert isinstance(ev, Cleared)
            out.append((-1, -1))
    return out


def _batches(log: EventRecords) -> list[list[tuple[int, int]]]:
    out, start = [], 0
    for end in log.bat_end:
        out.append([(log.keys[j], log.ends[j]) for j in range(start, end)])
        start = end
    return out


CASES = sorted(GOLDEN.glob("*.yaml"))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_records_are_the_event_objects_batch_for_batch(monkeypatch, path):
    """Both logs on one pool through a step case (the oracle's event goldens: preemption,
    partial and checkpoint keys, report mode full, vLLM's IndexError): the records are the
    objects' keys, batch for batch, and after the IndexError neither keeps anything."""
    seen = {}

    class Both(steps._StepEvents):
        def __init__(self, sched, ev_cfg):
            super().__init__(sched, ev_cfg)
            self.batches: list[list] = []
            self.records = EventRecords()
            self.rlog = KVEventLog(lambda step, events: None,
                                   report_mode=ev_cfg.get("report_mode"),
                                   fix_emit=ev_cfg.get("kv_events_fix_emit", False),
                                   records=self.records)
            sched.kv._observe(self.rlog)
            seen["both"] = self

        def _publish(self, step, events):
            self.batches.append(_flat(events))
            super()._publish(step, events)

    monkeypatch.setattr(steps, "_StepEvents", Both)
    data = yaml.safe_load(path.read_text())
    got = steps.run_steps_data(data, str(path), kv_events=True)
    both = seen["both"]
    want = [b for b in both.batches if b]
    assert want and _batches(both.records) == want
    assert (both.rlog.error is None) == (got["kv_events_error"] is None)
    if both.log.error is not None:       # (the same failure; a records log keeps no clock)
        assert {**both.rlog.error, "step": None} == {**both.log.error, "step": None}
    assert both.records.published == sum(len(b) for b in want)


def _records(n: int) -> tuple[EventsView, list[KVEventLog]]:
    """A view of ``n`` replicas, lag 10 ns, and a log queueing into each replica's
    records."""
    cfg = CacheConfig(groups=("full", "mamba"), block_size=16, hash_block_size=16,
                      num_blocks=64)
    reps = [SimpleNamespace(dep=SimpleNamespace(kv=KVCacheManager(cfg))) for _ in range(n)]
    view = EventsView(reps, 10)
    logs = [KVEventLog(lambda step, events: None, records=r) for r in view.records]
    return view, logs


def test_a_replicas_batch_is_not_held_behind_another_replicas():
    """Replica 0 publishes at 100 ns, then replica 1 (run later by the fleet) at 50 ns;
    with a lag of 10 ns replica 1's batch is the router's at 60 ns, replica 0's at 110."""
    view, (a, b) = _records(2)
    a.evicted((7 << GROUP_BITS) | 0)        # (a removal of a key not held: nothing)
    a.add(Cleared())
    a.flush(100)
    b.dropped([(3 << GROUP_BITS) | 1])
    b.flush(50)
    view.pools[1].store((9 << GROUP_BITS) | 0, 16)
    assert a.records.bat_at[0] == 110 and b.records.bat_at[0] == 60
    view.advance(59)
    assert view.pools[1].key_map.has((9 << GROUP_BITS) | 0) and b.records.n == 1
    view.pools[1].store((3 << GROUP_BITS) | 1, 32)
    view.advance(60)                         # replica 1's removal applied, read records dropped
    assert not view.pools[1].key_map.has((3 << GROUP_BITS) | 1) and b.records.n == 0
    assert a.records.n == 2 and a.records.bhead == 0
    view.advance(110)
    assert a.records.n == 0


def test_the_views_compiled_index_answers_as_the_view():
    """The routers ask a view's ``index`` (compiled) on every arrival: the overlap of every
    replica and one replica's resumable hit are the view's own answers.  Replica 0 holds the
    prompt's first three attention blocks and a Mamba state at their end, replica 1 the
    first block and no state."""
    from sim.cache.prompt import StreamRegistry
    from sim.cluster.views import Prompt

    view, _ = _records(2)
    prompt = Prompt(SimpleNamespace(segments=[("s", 0, 80)]), StreamRegistry(), 80)
    keys = prompt.keys_for(view.kvs[0])
    blocks = keys.block_keys(0, 5, 1)            # (16-token blocks, 16-token hash unit)
    for j in range(3):
        view.pools[0].store((blocks[j] << GROUP_BITS) | 0, 16 * (j + 1))
    view.pools[0].store((blocks[2] << GROUP_BITS) | 1, 48)
    view.pools[1].store((blocks[0] << GROUP_BITS) | 0, 16)
    assert view.index is not None
    assert list(view.index.overlaps(0, blocks)) == list(view.overlaps(0, prompt, blocks)) == [3, 1]
    assert [view.index.hybrid_hit(i, keys, 80) for i in range(2)] == [
        view.hybrid_hit(i, prompt, keys) for i in range(2)] == [48, 0]


def test_event_objects_become_the_same_records():
    """A run writing its own stream hands the view event objects: each becomes its
    records (a Stored one per key, in order)."""
    cfg = CacheConfig(groups=("full", "mamba"), block_size=16, hash_block_size=16,
                      num_blocks=64)
    req = KVCacheManager(cfg).make_request("r", [(1, 0, 64)])
    rec = EventRecords()
    rec.event(Stored(2, req, [7, 8], [16, 32], 16, 0, 32, -1, None, "full"))
    rec.event(Removed((7 << GROUP_BITS) | 2))
    rec.event(Cleared())
    assert rec.held() == [((7 << GROUP_BITS) | 2, 16), ((8 << GROUP_BITS) | 2, 32),
                          ((7 << GROUP_BITS) | 2, -1), (-1, -1)]


def test_unread_records_survive_a_read_and_a_failed_step_drops_its_own():
    _, (log,) = _records(1)
    log.evicted(1 << GROUP_BITS)
    log.flush(5)                            # sealed, visible at 15
    log.evicted(2 << GROUP_BITS)            # queued in the next step
    assert log.queued()
    log.fail("IndexError", "list index out of range", "r", 1)
    assert log.records.held() == [(1 << GROUP_BITS, -1)] and not log.queued()
    log.evicted(3 << GROUP_BITS)            # nothing after vLLM's engine died
    log.flush(6)
    assert list(log.records.bat_end) == [1] and log.records.published == 1


@pytest.mark.parametrize("policy, lag", [("kv_router", 20.0), ("hybrid_aware", 5.0)])
def test_a_fleet_routes_alike_from_records_and_from_objects(tmp_path, policy, lag):
    """A fleet whose replicas spool their own event streams (objects to the router)
    routes exactly as one that does not (records), with a lag that makes replicas publish
    out of time order; the spooled streams are gone once the fleet has run (the fleet writes
    none, and a ``sim run`` ends without running finalizers)."""
    import os

    rows = {}
    for name, events in (("records", False), ("objects", True)):
        sc = load_scenario(ATHENA_FLEET, {"workload.num_requests": 300, "cluster.replicas": 4,
                                          "cluster.router.policy": policy,
                                          "cluster.router.event_lag_ms": lag,
                                          "kv_events": events})
        got = simulate(sc)
        spools = [r.dep.kv_events for r in got[0].replicas if r.dep.kv_events is not None]
        assert len(spools) == (4 if events else 0)
        assert not any(os.path.exists(s._dir) for s in spools)
        out = write_run(tmp_path / name, sc, *got, report=False)
        rows[name] = list(csv.reader(open(out / "requests.csv", newline="")))
        assert not (out / "kv_events.jsonl").exists()
    assert rows["records"] == rows["objects"] and len(rows["records"]) == 301


def test_mirror_pool_holds_a_key_as_often_as_it_was_stored():
    """A key stored twice (vLLM caching a recomputed prefix beside its old copy) survives
    one BlockRemoved; the per-position counts the lookups read follow every store and
    removal; ids are reused; AllBlocksCleared empties the mirror."""
    from sim.cache.mirror_pool import MirrorPool

    pool = MirrorPool(8, 16)
    a, b = (5 << GROUP_BITS) | 1, (6 << GROUP_BITS) | 0

    def count(key: int, end: int) -> int:
        slot = ((end // 16) << GROUP_BITS) | (key & ((1 << GROUP_BITS) - 1))
        return pool.at_unit[slot] if slot < len(pool.at_unit) else 0

    pool.store(a, 32)
    pool.store(a, 32)
    pool.store(b, 16)
    assert len(pool.key_map) == 2 and count(a, 32) == 2 and count(b, 16) == 1
    pool.remove(a)
    assert pool.key_map.has(a) and count(a, 32) == 1
    pool.remove(a)
    pool.remove(a)                              # (not held: nothing)
    assert not pool.key_map.has(a) and count(a, 32) == 0
    ids = pool.n_ids
    pool.store(a, 48)                           # a freed id is reused
    assert pool.n_ids == ids and count(a, 48) == 1
    pool.clear()
    assert len(pool.key_map) == 0 and count(a, 48) == 0 and count(b, 16) == 0
    for k in range(10):                         # more keys than ids made so far
        pool.store((k << GROUP_BITS) | 2, 16 * (k + 1))
    assert len(pool.key_map) == 10 and all(count((k << GROUP_BITS) | 2, 16 * (k + 1)) == 1
                                           for k in range(10))
    assert pool.n_ids == 11 and len(pool.blocks) >= 11   # (ids 1..10; room doubled)
    pool.clear()                                # (past the first room: every id freed)
    assert len(pool.key_map) == 0 and pool.nfree == 10


def test_records_past_their_buffers_reach_the_mirror_in_order():
    """More records than the buffers first hold, read batch by batch while the next step
    queues more: every record reaches the mirror once, in order, and the read ones go."""
    from sim.cache.mirror_pool import MirrorPool, catch_up

    rec = EventRecords(10)
    pool = MirrorPool(8, 16)
    keys = [((k + 1) << GROUP_BITS) | (k % 3) for k in range(300)]
    for k in keys[:100]:
        rec.put(k, 16)
    rec.seal(0)                                  # visible at 10
    for k in keys[100:250]:
        rec.put(k, 32)
    rec.seal(5)                                  # visible at 15
    for k in keys[:50]:
        rec.put(k, -1)                           # queued, not sealed
    catch_up(pool, rec, 12)                      # the first batch only
    assert len(pool.key_map) == 100 and rec.bhead == 1 and rec.n == 300
    catch_up(pool, rec, 15)                      # the second: every batch read
    assert len(pool.key_map) == 250 and rec.n == 50 and rec.held()[0] == (keys[0], -1)
    rec.seal(20)
    catch_up(pool, rec, 30)
    assert len(pool.key_map) == 200 and rec.n == 0 and rec.published == 300
    assert not pool.key_map.has(keys[0]) and pool.key_map.has(keys[50])
