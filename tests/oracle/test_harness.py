"""The differential harness (``sim/oracle/harness.py``) on a toy case shape, and the case
translations ``sim validate`` and both testers share; none of it needs the oracle."""
from __future__ import annotations

import time

import pytest

from sim.cache.case import CaseError
from sim.oracle import kv_case, step_case
from sim.oracle.harness import (
    BOTH_REJECT,
    COMPARED,
    Mismatch,
    OurTimeout,
    Tester,
    Verdict,
    call_with_timeout,
    rerun,
    run_both,
    shrink,
)
from sim.oracle.segments import normalise, parse_notation, prompt_notation, truncate


# A toy case shape: the "oracle" sums a list; our side gets it wrong whenever the list holds
# a 7, and both refuse an empty list.
class SumOracle:
    def __init__(self):
        self.batches = []

    def run(self, cases):
        self.batches.append(len(cases))
        return [{"sum": sum(c["items"])} if c["items"] else {"error": "empty"} for c in cases]


def _ours(spec):
    items = spec["items"]
    return None if not items else sum(items) + (1 if 7 in items else 0)


def _compare(spec, ours, ans):
    if "error" in ans:
        return Verdict(BOTH_REJECT) if ours is None else Verdict(COMPARED, [
            Mismatch("construction", "-", ours, ans["error"])])
    mm = [] if ours == ans["sum"] else [Mismatch("sum", "-", ours, ans["sum"])]
    return Verdict(COMPARED, mm, len(spec["items"]))


def _smaller(spec):
    items = spec["items"]
    return [{"items": items[:i] + items[i + 1:]} for i in range(len(items))] + \
        [{"items": [x - 1 if j == i else x for j, x in enumerate(items)]}
         for i in range(len(items)) if items[i] > 0]


TOY = Tester("toy", lambda s: dict(s), _ours, _compare, _smaller,
             coverage=lambda s, a: ["big"] if a.get("sum", 0) > 20 else [])


def test_run_both_counts_compares_and_declines():
    specs = [{"items": [1, 2]}, {"items": [7, 9, 5]}, {"items": []}, {"items": [3, 7]}]
    oracle = SumOracle()
    summ = run_both(TOY, specs, oracle, collect=True)
    assert oracle.batches == [4]                   # one oracle batch for the whole run
    assert (summ.cases, summ.compared, summ.declined[BOTH_REJECT]) == (4, 3, 1)
    assert summ.checked == 2 + 3 + 2
    assert [o.index for o in summ.mismatches] == [1, 3]
    assert summ.cases_by_field == {"sum": 2} and summ.coverage == {"big": 1}
    assert len(summ.outcomes) == 3


def test_shrink_finds_the_smallest_case_that_still_mismatches():
    oracle = SumOracle()
    small = shrink(TOY, {"items": [4, 9, 7, 2]}, "sum", oracle)
    assert small == {"items": [7]}
    assert rerun(TOY, small, oracle).verdict.fields == ["sum"]
    # a size bound: only strictly smaller candidates are tried
    sized = Tester("toy", dict, _ours, _compare, _smaller, size=lambda s: len(s["items"]))
    assert shrink(sized, {"items": [4, 9, 7, 2]}, "sum", SumOracle()) == {"items": [7]}
    # nothing to shrink towards when no candidate keeps the field
    assert shrink(TOY, {"items": [7]}, "other", SumOracle()) == {"items": [7]}


def test_our_side_is_bounded_in_time():
    with pytest.raises(OurTimeout):
        call_with_timeout(lambda: time.sleep(5), 0.2)
    assert call_with_timeout(lambda: 3, 1.0) == 3


def test_segments_round_trip_through_our_notation():
    segs = [("S", 0, 6), ("S", 6, 2), ("P", 4, 3), ("Q", 0, 0)]
    assert normalise(segs) == [("S", 0, 8), ("P", 4, 3)]
    assert prompt_notation(normalise(segs)) == "S:8 P@4:3"
    assert parse_notation("S:8 P@4:3") == [("S", 0, 8), ("P", 4, 3)]
    assert truncate([("S", 0, 8), ("P", 4, 3)], 9) == [("S", 0, 8), ("P", 4, 1)]


def test_validate_translates_a_case_file_for_the_kv_oracle():
    data = {"config": {"groups": ["full", "mamba"], "block_size": 16, "prefix_match_unit": 4,
                       "eagle": True, "schedule": "seed", "num_prefill_checkpoint_blocks": 1},
            "requests": [{"id": "p", "prompt": "S:24 P:16"}, {"id": "c", "prompt": "S:24 C:16"}]}
    spec, ids = kv_case.case_to_spec(data)
    assert ids == ["p", "c"]
    case = kv_case.to_oracle(spec)
    assert (case["hash"], case["schedule"], case["num_prefill_checkpoint_blocks"]) == (4, "seed", 1)
    assert case["producer"]["ids"][:24] == case["consumer"]["ids"][:24]
    assert case["producer"]["ids"][24] != case["consumer"]["ids"][24]


def test_validate_refuses_a_key_the_oracle_lacks_before_starting_it():
    from sim.commands.validate import validate_case

    data = {"config": {"groups": ["full", "mamba"], "block_size": 16,
                       "prompt_checkpoint": "seed"},
            "requests": [{"prompt": "S:24"}, {"prompt": "S:24"}]}
    with pytest.raises(CaseError, match=r"config\.prompt_checkpoint"):
        validate_case(data)


def test_step_override_spec_blocks_means_the_draft_count():
    spec = {"name": "t", "config": {"groups": ["full", "mamba"], "block_size": 16,
                                    "num_speculative_tokens": 3},
            "requests": []}
    cfg = step_case.our_config(spec, {"mamba_num_speculative_blocks": "K", "max_num_seqs": 2})
    assert cfg["mamba_num_speculative_blocks"] == 3 and cfg["max_num_seqs"] == 2
    assert "mamba_num_speculative_blocks" not in spec["config"]      # our side only


def test_a_closed_worker_leaves_no_pipe_open(tmp_path):
    """``OracleWorker.close`` closes both ends of the worker's pipes (its output pipe was
    left open: a ResourceWarning under ``sim validate`` with warnings as errors), whether
    the worker ended on EOF or had died already.  A stand-in oracle module answers."""
    import gc
    import sys
    import warnings

    from sim.oracle.worker import OracleWorker

    (tmp_path / "fake_oracle.py").write_text(
        "VLLM_VERSION = 'test'\n\ndef run_case(c):\n    return {'echo': c}\n")
    for kill_first in (False, True):
        w = OracleWorker(sys.executable, tmp_path, module="fake_oracle")
        assert w.run([1, 2]) == [{"echo": 1}, {"echo": 2}]
        if kill_first:
            w.proc.kill()
            w.proc.wait()
        w.close()
        assert w.proc.stdin.closed and w.proc.stdout.closed and w.log.closed
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            del w
            gc.collect()
