"""The step sampler (sim/engine/record.py) on steps made by hand: which items deliver
tokens, the gaps between deliveries (single steps and decode jumps), and the memory
series, thinned evenly past its bound."""
from __future__ import annotations

from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry, parse_prompt
from sim.config.scheduler import SchedulerConfig
from sim.engine import record
from sim.engine.record import StepSampler
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest

MS = 1_000_000
KV = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16, num_blocks=101))
STREAMS = StreamRegistry()


class Occupancy:
    """The pool's (attention occupied, Mamba occupied, in use), set by hand."""

    def __init__(self):
        self.value = (0, 0, 0)

    def __call__(self) -> tuple[int, int, int]:
        return self.value


def _sampler(occ=None):
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4), KV)
    return StepSampler(sched, occ or Occupancy()), sched


def _req(index, computed=0, prompt=8):
    req = SimRequest(KV.make_request(f"r{index}", parse_prompt(f"A{index}:{prompt}", STREAMS)),
                     16, index)
    req.cache.num_computed_tokens = computed
    return req


REQS: dict[int, SimRequest] = {}


def _item(index, prefill=False, computed=0, tokens=1, prompt=8):
    """An item of request ``index`` (the same request object across steps, as in a run:
    its delivery state lives on it)."""
    req = REQS.get(index)
    if req is None:
        req = REQS[index] = _req(index, computed, prompt)
    req.cache.num_computed_tokens = computed
    return ScheduledItem(req, tokens, computed, prefill)


def _state(*indices):
    """[last delivery (ns), deliveries] of each request."""
    return [[REQS[i].last_delivery_ns, REQS[i].deliveries] for i in indices]


def test_gaps_between_deliveries():
    REQS.clear()
    s, _ = _sampler()
    a_pre = _item(0, prefill=True, computed=0, tokens=8)             # last chunk: delivers
    b_chunk = _item(1, prefill=True, computed=0, tokens=4)           # 4 of 8: delivers nothing
    s.step([a_pre, b_chunk], 0, 10 * MS, 1)                          # A's first token at 10
    assert s.itl_count == 0 and _state(0, 1) == [[10 * MS, 1], [-1, 0]]
    b_last = _item(1, prefill=True, computed=4, tokens=4)
    s.step([_item(0, computed=8), b_last], 10 * MS, 22 * MS, 1)      # A: gap 12; B: first
    assert s.itl_hist == {12_000: 1} and _state(0, 1) == [[22 * MS, 2], [22 * MS, 1]]
    # a jump of 3 decode steps over 30 ms + 2 ns: 10 ms, then 10 ms + 1 ns twice (the
    # total is kept exactly; each step is the quotient, the remainder on the last ones)
    end = 52 * MS + 2
    s.step([_item(0, computed=9), _item(1, computed=8)], 22 * MS, end, 3)
    assert s.itl_hist == {12_000: 1, 10_000: 6}
    assert s.itl_count == 7 and s.itl_sum_ns == 12 * MS + 2 * (30 * MS + 2)
    assert _state(0, 1) == [[end, 5], [end, 4]]
    # a request skipped for a step (or preempted): its gap spans the steps it missed
    s.step([_item(1, computed=11)], end, 60 * MS, 1)
    s.step([_item(0, computed=12), _item(1, computed=12)], 60 * MS, 70 * MS, 1)
    assert s.itl_hist == {12_000: 1, 10_000: 7, 8_000: 1, 18_000: 1}
    assert s.deliveries(REQS[0]) == 6 and s.deliveries(REQS[1]) == 6


def test_gaps_are_kept_to_the_microsecond():
    REQS.clear()
    s, _ = _sampler()
    s.step([_item(0, prefill=True, tokens=8)], 0, 1_000, 1)
    s.step([_item(0)], 1_000, 1_000 + 2_499, 1)
    s.step([_item(0)], 3_499, 3_499 + 2_500, 1)
    assert s.itl_hist == {2: 1, 3: 1} and s.itl_sum_ns == 4_999   # (sum exact in ns)


def test_memory_rows_and_peaks():
    occ = Occupancy()
    s, sched = _sampler(occ)
    occ.value = (30, 50, 40)                   # 40 of 100 usable in use, 40 cached
    sched.running = [_req(1), _req(2)]
    s.step([], 5 * MS, 6 * MS, 1)
    occ.value = (20, 10, 10)
    s.step([], 6 * MS, 7 * MS, 1)
    assert s.rows == [(5 * MS, 30, 50, 40, 2, 0), (6 * MS, 20, 10, 10, 2, 0)]
    assert s.occupied_peak == 80 and s.in_use_peak == 40


def test_memory_rows_are_thinned_evenly():
    s, _ = _sampler()
    n = 2 * record.MEMORY_ROWS + 123
    for i in range(n):
        s.step([], i, i + 1, 1)
    times = [r[0] for r in s.rows]
    assert record.MEMORY_ROWS // 2 <= len(times) < record.MEMORY_ROWS
    assert times[0] == 0
    assert len({b - a for a, b in zip(times, times[1:])}) == 1    # one stride throughout
