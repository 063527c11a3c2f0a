"""Hangs (issue #13, P1; issue #20 §3): a request that can never fit the KV-cache pool,
a max_model_len the pool cannot hold, and pools too large to simulate.  None may hang:
every command runs in a child process with a timeout, so a regression fails the test
instead of stalling the suite.

* a max_model_len whose request the pool cannot hold: refused at start-up, as vLLM does
  (one line with both block counts and bytes, exit 2, nothing written);
* without max_model_len, a request the pool can never hold is rejected on arrival: its
  requests.csv row says ``too_long_for_pool``, summary.json counts it in
  ``rejected_requests`` and the run goes on (a prompt of max_model_len tokens or more is
  likewise a row marked ``exceeds_max_model_len``); when every request is rejected there
  is nothing to report: one line, exit 2;
* a step case keeps such a request waiting, as vLLM's scheduler would: the engine's
  progress guard stops with one line naming the request;
* pools too large for this machine's memory are refused up front, naming the field.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import yaml

from conftest import ROOT, assert_input_error, sim_subprocess, snapshot

ATHENA = str(ROOT / "scenarios" / "athena.yaml")
TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
MOONCAKE_HEAD = ROOT / "tests" / "fixtures" / "mooncake_conversation_head.jsonl"
TIMEOUT = 60
HUGE = 10 ** 15


def _sim(tmp_path: Path, *args: str):
    return sim_subprocess(*args, cwd=tmp_path, timeout=TIMEOUT)


def _refused(tmp_path: Path, *args: str, names: tuple[str, ...]) -> str:
    """Exit 2, one line naming each of ``names``, and nothing written or deleted."""
    before = snapshot(tmp_path)
    res = _sim(tmp_path, *args)
    line = assert_input_error(res, *names)
    assert snapshot(tmp_path) == before, "files were written or deleted"
    return line


def _rows(folder: Path) -> list[dict]:
    with open(folder / "requests.csv", newline="") as f:
        return list(csv.DictReader(f))


def _mooncake_scenario(tmp_path: Path, records: list[dict], **scheduler) -> Path:
    """The Mooncake scenario's deployment over a trace of ``records``."""
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = yaml.safe_load((ROOT / "scenarios" / "mooncake-conversation.yaml").read_text())
    data["name"] = "hangs"
    data["workload"] = {"kind": "mooncake", "path": "trace.jsonl", "time_scale": 2.0}
    data["scheduler"].update(scheduler)
    p = tmp_path / "mooncake.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _head(n: int) -> list[dict]:
    return [json.loads(line) for line in MOONCAKE_HEAD.read_text().splitlines()[:n]]


def _served_stats_only(folder: Path, n_rejected: int) -> None:
    """summary.json counts the rejected requests apart and its statistics come from the
    served rows alone."""
    rows = _rows(folder)
    s = json.loads((folder / "summary.json").read_text())
    served = [r for r in rows if not r["rejected"]]
    assert s["rejected_requests"] == n_rejected
    assert s["requests"] == len(served) == len(rows) - n_rejected
    ttfts = [float(r["ttft_s"]) for r in served]
    assert abs(s["ttft_mean_s"] - sum(ttfts) / len(ttfts)) < 1e-5
    assert s["prompt_tokens"] == sum(int(r["prompt_tokens"]) for r in served)
    assert s["hit_tokens"] == sum(int(r["hit_tokens"]) for r in served)


# ---- a request the pool can never hold -------------------------------------------------

def test_a_mooncake_line_of_1e9_tokens_is_a_rejected_row_and_the_run_goes_on(tmp_path):
    records = _head(8)
    records.insert(4, dict(records[3], input_length=10 ** 9, output_length=5))
    sc = _mooncake_scenario(tmp_path, records)
    res = _sim(tmp_path, "run", str(sc), "--out", "out", "-q", "--no-report")
    assert res.rc == 0, res.err
    rows = _rows(tmp_path / "out")
    assert len(rows) == 9
    big = rows[4]
    assert big["prompt_tokens"] == "1000000000" and big["rejected"] == "too_long_for_pool"
    # no measurements on a rejected row
    for k in ("hit_tokens", "ttft_s", "e2e_s", "output_tokens", "preemptions"):
        assert big[k] == ""
    assert all(r["rejected"] == "" and r["ttft_s"] for i, r in enumerate(rows) if i != 4)
    _served_stats_only(tmp_path / "out", 1)


def test_every_request_rejected_is_one_line(tmp_path):
    # athena's requests need 1 attention block + 5 Mamba groups x (2 + 5 speculative + 1
    # internal prefill checkpoint) blocks = 41 at least (vLLM's max_memory_usage_bytes in
    # align mode): a 3-block pool (2 usable) can serve none of them
    line = _refused(tmp_path, "run", ATHENA, "--set", "kv_cache.num_gpu_blocks_override=3",
                    "--out", "out", "-q", names=("athena.yaml", "every request was rejected",
                                                 "2,000", "r0000000", "41 pool blocks",
                                                 "2 usable", "too_long_for_pool"))
    assert "Traceback" not in line


def test_a_thousand_speculative_tokens_need_more_mamba_blocks_than_the_pool_has(tmp_path):
    # each Mamba group holds 2 + K state blocks per request, + 1 for the internal prefill
    # checkpoint (MambaMixer2): K = 1000 cannot fit 400 blocks (athena-tiny with its EAGLE
    # layer: 3 attention + 4 Mamba layers in groups of 4, one Mamba group)
    _refused(tmp_path, "run", TINY, "--set", "speculative.num_speculative_tokens=1000",
             "--out", "out", "-q",
             names=("athena-tiny.yaml", "every request was rejected", "1,006 pool blocks",
                    "399 usable", "too_long_for_pool"))


def test_a_request_too_long_for_the_pool_is_rejected_beside_ones_that_fit(tmp_path):
    # 400 blocks of 1,088 tokens (nemotron-h-8b + its EAGLE layer, k=3): 399 usable; 5 Mamba
    # groups x (2 + 3 + 1 checkpoint) = 30 of them for Mamba leave 369 attention blocks =
    # 401,472 slots.  A request's
    # longest step asks for prompt + 3 outputs - 1 + 3 drafts + 3 lookahead slots: the
    # boundary, exactly
    records = _head(4)
    records[1] = dict(records[1], input_length=401_472 - 7, output_length=3)  # 1 slot over
    records[2] = dict(records[2], input_length=401_472 - 8, output_length=3)  # fits exactly
    sc = _mooncake_scenario(tmp_path, records)
    data = yaml.safe_load(sc.read_text())
    data["kv_cache"]["num_gpu_blocks_override"] = 400
    sc.write_text(yaml.safe_dump(data))
    res = _sim(tmp_path, "run", str(sc), "--out", "out", "-q", "--no-report")
    assert res.rc == 0, res.err
    rows = _rows(tmp_path / "out")
    assert [r["rejected"] for r in rows] == ["", "too_long_for_pool", "", ""]
    _served_stats_only(tmp_path / "out", 1)


# ---- max_model_len ------------------------------------------------------------------------

def test_a_max_model_len_the_pool_cannot_hold_names_both_numbers(tmp_path):
    # athena: 1 attention group (block 4,416) + 5 Mamba groups x (2 + 5 + 1 checkpoint);
    # 65,536 tokens need 15 + 40 = 55 blocks; a pool of 45 has 44 usable beside the null block
    line = _refused(tmp_path, "run", ATHENA, "--set", "scheduler.max_model_len=65536",
                    "--set", "kv_cache.num_gpu_blocks_override=45", "--out", "out", "-q",
                    names=("athena.yaml", "scheduler.max_model_len", "65,536",
                           "55 pool blocks", "44 usable", "MiB",
                           "kv_cache.num_gpu_blocks_override"))
    # vLLM's estimate of the largest length that fits: 4 attention blocks of 4,416
    assert "the largest max_model_len it holds is 17,664" in line


def test_a_max_model_len_the_pool_holds_runs(tmp_path):
    res = _sim(tmp_path, "run", TINY, "--set", "scheduler.max_model_len=2048",
               "--out", "out", "-q", "--no-report")
    assert res.rc == 0, res.err
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["rejected_requests"] == 0 and s["requests"] == 40
    assert {r["rejected"] for r in _rows(tmp_path / "out")} == {""}


def test_a_prompt_of_max_model_len_or_more_is_a_rejected_row(tmp_path):
    records = _head(5)
    records[2] = dict(records[2], input_length=9000)       # >= max_model_len
    sc = _mooncake_scenario(tmp_path, records, max_model_len=8192)
    res = _sim(tmp_path, "run", str(sc), "--out", "out", "-q")
    assert res.rc == 0, res.err
    rows = _rows(tmp_path / "out")
    assert [r["rejected"] for r in rows] == ["", "", "exceeds_max_model_len", "", ""]
    assert rows[2]["prompt_tokens"] == "9000" and rows[2]["ttft_s"] == ""
    _served_stats_only(tmp_path / "out", 1)
    # the report (read back from requests.csv) leaves the rejected row out
    assert "| requests | 4 served, 1 rejected" in (tmp_path / "out" / "report.md").read_text()


# ---- step cases: a request that can never fit waits, as vLLM keeps it ---------------

def test_a_step_case_prompt_larger_than_the_pool_stays_waiting(tmp_path):
    # vLLM's scheduler keeps it waiting for good (its
    # test_can_fit_full_sequence_full_attention_still_gates_oversized); a step case ends
    # where nothing else can happen and reports it waiting, never scheduled
    case = tmp_path / "hang.yaml"
    case.write_text(yaml.safe_dump({
        "config": {"block_size": 16, "hash_block_size": 16, "num_blocks": 4},
        "requests": [{"id": "big", "prompt": "P:100", "arrival_step": 0, "max_tokens": 4}]}))
    res = _sim(tmp_path, "steps", str(case))
    assert res.rc == 0, res.err
    (big,) = json.loads(res.out)
    assert big["waiting"] is True and big["first_scheduled_step"] is None
    assert big["finish_step"] is None and big["output_tokens"] == 0


def test_a_step_case_serves_what_fits_while_what_does_not_waits(tmp_path):
    # 'ok' fits and finishes; 'big' arrives later and can never be admitted
    case = tmp_path / "hang2.yaml"
    case.write_text(yaml.safe_dump({
        "config": {"block_size": 16, "hash_block_size": 16, "num_blocks": 8},
        "requests": [{"id": "ok", "prompt": "A:40", "max_tokens": 4},
                     {"id": "big", "prompt": "B:200", "arrival_step": 2, "max_tokens": 4}]}))
    res = _sim(tmp_path, "steps", str(case))
    assert res.rc == 0, res.err
    ok, big = json.loads(res.out)
    assert ok["finish_step"] is not None and "waiting" not in ok
    assert big["waiting"] is True and big["first_scheduled_step"] is None


# ---- pools too large to simulate ---------------------------------------------------------

def test_a_huge_num_gpu_blocks_override_is_refused_naming_the_memory(tmp_path):
    _refused(tmp_path, "run", ATHENA, "--set", f"kv_cache.num_gpu_blocks_override={HUGE}",
             "--out", "out", "-q",
             names=("kv_cache.num_gpu_blocks_override", "1,000,000,000,000,000",
                    "227.4 PiB", "available"))


def test_a_huge_case_pool_is_refused(tmp_path):
    case = tmp_path / "huge.yaml"
    case.write_text(yaml.safe_dump({"config": {"block_size": 16, "num_blocks": HUGE},
                                    "requests": [{"id": "a", "prompt": "P:100"}]}))
    _refused(tmp_path, "case", str(case),
             names=("huge.yaml", "config.num_blocks", "1,000,000,000,000,000", "PiB"))


def test_a_huge_step_case_pool_is_refused(tmp_path):
    case = tmp_path / "huge_steps.yaml"
    case.write_text(yaml.safe_dump({"config": {"block_size": 16, "num_blocks": HUGE},
                                    "requests": [{"id": "a", "prompt": "P:100",
                                                  "max_tokens": 4}]}))
    _refused(tmp_path, "steps", str(case),
             names=("huge_steps.yaml", "config.num_blocks", "1,000,000,000,000,000", "PiB"))
