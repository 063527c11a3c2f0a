"""The engine never hangs: its progress guard, and the per-request pool bound that
``sim run`` rejects on (issue #13 P1, issue #20 §3).

* ``Engine``: when nothing is scheduled, nothing runs, nothing arrives or finishes and
  retries keep scheduling nothing, it raises ``CapacityError`` naming the request;
  it does not fire while a request merely waits for blocks others hold.
* ``Scheduler.blocks_needed``: an upper bound of the blocks a lone request ever holds,
  tight enough that a pool of exactly that many usable blocks serves it (so rejecting
  above it refuses only what could never run).
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest

from backends.base import FixedStep
from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry, parse_prompt
from sim.errors import CapacityError
from sim.config.scheduler import SchedulerConfig
from sim.engine.engine import Engine
from sim.engine.scheduler import TOO_LONG_FOR_POOL, Scheduler, SimRequest

UNIT_S = 1e-9


@dataclass
class _Trace:
    request_id: str
    arrival_s: float
    prompt: str
    output_tokens: int
    after: str | None = None
    think_s: float = 0.0


def _replay(cfg: CacheConfig, traces: list[_Trace], timeout_s: float = 60.0, **sched_kw):
    """Replay ``traces`` one time unit per step in a worker thread (a hang fails the
    test after ``timeout_s`` instead of stalling it); returns (requests, error)."""
    kv = KVCacheManager(cfg)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=sched_kw.pop("budget", 64),
                                      max_num_seqs=8), kv, **sched_kw)
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

    eng = Engine(sched, FixedStep(UNIT_S), make, lambda r: None)
    result: dict = {}

    def work():
        try:
            eng.run(traces)
        except Exception as e:  # noqa: BLE001 - handed to the test
            result["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "the replay hangs"
    return made, result.get("error"), eng


def _cfg(num_blocks: int, **kw) -> CacheConfig:
    return CacheConfig(groups=("full", "mamba"), block_size=16, hash_block_size=16,
                       num_blocks=num_blocks, **kw)


def test_a_request_larger_than_the_pool_stops_the_replay_naming_it():
    made, err, eng = _replay(_cfg(4), [_Trace("big", 0.0, "P:100", 4)])
    assert isinstance(err, CapacityError)
    msg = str(err)
    assert "no progress: request 'big'" in msg
    # 7 attention blocks (100 tokens / 16) + 1 Mamba state to be admitted; 3 usable
    assert "admitting it takes 8 pool blocks" in msg
    assert "3 free or evictable of 3 usable" in msg
    assert "\n" not in msg


def test_the_guard_names_the_head_of_the_queue_after_others_finish():
    # 'a' fits and finishes first; then 'b' (too large) is stuck with 'c' behind it
    made, err, eng = _replay(_cfg(8), [_Trace("a", 0.0, "A:40", 3),
                                       _Trace("b", 2e-9, "B:300", 3),
                                       _Trace("c", 3e-9, "C:10", 3)])
    assert isinstance(err, CapacityError)
    assert "request 'b'" in str(err) and "1 more behind it" in str(err)
    assert made["a"].num_output == 3 and made["c"].num_output == 0


def test_waiting_for_blocks_others_hold_is_not_a_hang():
    # each request needs most of the pool: they run one after another, the later ones
    # waiting (and being preempted) while blocks are held; no follow-up arrivals
    traces = [_Trace(f"r{i}", i * 1e-9, f"S{i}:150", 20) for i in range(4)]
    made, err, eng = _replay(_cfg(14), traces)
    assert err is None
    assert all(made[f"r{i}"].num_output == 20 for i in range(4))


def test_a_request_waiting_for_a_later_arrival_of_blocks_is_not_a_hang():
    # a follow-up turn arrives after think time while nothing runs: not stuck
    traces = [_Trace("a", 0.0, "A:100", 5), _Trace("b", 0.0, "A:100 U:20", 5, after="a",
                                                   think_s=50e-9)]
    made, err, eng = _replay(_cfg(12), traces)
    assert err is None and made["b"].num_output == 5


def test_rejection_turns_the_same_request_into_a_refused_arrival():
    made, err, eng = _replay(_cfg(4), [_Trace("big", 0.0, "P:100", 4),
                                       _Trace("ok", 1e-9, "Q:10", 2)],
                             reject_unservable=True)
    assert err is None
    assert [r.rid for r in eng.rejected] == ["big"]
    assert made["big"].rejected == TOO_LONG_FOR_POOL
    assert made["ok"].num_output == 2 and made["ok"].rejected == ""


def _lone_peak(cfg: CacheConfig, prompt: int, out: int, K: int, eagle: bool, budget: int,
               acc: float) -> tuple[int, int, bool]:
    """(peak blocks held, blocks_needed, finished) for one request alone."""
    kv = KVCacheManager(cfg)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4,
                                  num_speculative_tokens=K), kv, accepted_per_step=acc,
                  eagle_family=eagle)
    st = StreamRegistry()
    r = SimRequest(kv.make_request("a", parse_prompt(f"A:{prompt}", st)), out, 0)
    r.out_stream = st.id("out/a")
    need = s.blocks_needed(r)
    assert s.add(r)
    free0 = low = kv.pool.num_free()
    for t in range(10_000):
        if not s.has_work():
            break
        items = s.schedule(t)
        low = min(low, kv.pool.num_free())
        if not items:
            return free0 - low, need, False
        s.update_from_output(items, t)
    return free0 - low, need, not s.has_work()


@pytest.mark.parametrize("seed", [1, 2])
def test_blocks_needed_bounds_a_lone_request_and_a_pool_of_that_size_serves_it(seed):
    rng = random.Random(seed)
    for _ in range(60):
        bs = rng.choice([16, 32, 64])
        groups = rng.choice([("full", "mamba"), ("full", "mamba", "mamba"),
                             ("full", "full", "mamba")])
        K = rng.choice([0, 1, 3, 5])
        eagle = K > 0 and rng.random() < 0.8
        kw = dict(groups=groups, block_size=bs,
                  hash_block_size=rng.choice([h for h in (8, 16, 32, 64) if bs % h == 0]),
                  eagle=eagle, num_hash_lookahead_tokens=rng.choice([0, 1]) if eagle else 0,
                  mamba_num_speculative_blocks=K if eagle else 0,
                  prefix_cache_retention_interval=rng.choice([None, 0]))
        if eagle:
            kw["num_prefill_lookahead"] = 1
        prompt, out = rng.randint(1, 300), rng.randint(1, 40)
        budget = rng.choice([16, 64, 8192])
        acc = rng.choice([0.0, 0.0, min(K, 1.5)])
        big = CacheConfig(num_blocks=100_000, **kw)
        peak, need, done = _lone_peak(big, prompt, out, K, eagle, budget, acc)
        assert done and peak <= need, (kw, prompt, out, budget, acc, peak, need)
        # the same request in a pool of exactly `need` usable blocks is served
        _, need2, done = _lone_peak(CacheConfig(num_blocks=need + 1, **kw), prompt, out, K,
                                    eagle, budget, acc)
        assert need2 == need and done, (kw, prompt, out, budget, acc, need)


def test_blocks_per_request_counts_as_vllm_does():
    # full attention: a block per block_size slots; Mamba (align): 2 + K whatever the length
    kv = KVCacheManager(CacheConfig(groups=("full", "mamba", "mamba"), block_size=16,
                                    hash_block_size=16, num_blocks=64, eagle=True,
                                    mamba_num_speculative_blocks=3))
    assert kv.blocks_per_request(1) == 1 + 2 * 5
    assert kv.blocks_per_request(16) == 1 + 2 * 5
    assert kv.blocks_per_request(17) == 2 + 2 * 5
    assert kv.blocks_per_request(10_000) == 625 + 2 * 5
