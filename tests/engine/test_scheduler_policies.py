"""``scheduler.policy`` end to end: validated when the scenario loads (one line, exit 2,
nothing written), ``priority`` read from JSONL traces and honoured by ``sim run``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.entrypoints.cli import app
from sim.errors import InputError
from sim.config.scenario import load_scenario
from sim.commands.run import simulate
from workloads import WorkloadError, build_workload, write_jsonl

runner = CliRunner()
BASE = {
    "name": "prio",
    "model": "nemotron-h-8b",
    "kv_cache": {"tensor_parallel_size": 1, "num_gpu_blocks_override": 400},
    "gpu": {"type": "H200"},
    "cache": {"hash_block_size": 16},
    "scheduler": {"max_num_batched_tokens": 4096, "max_num_seqs": 1},
    "workload": {"kind": "jsonl", "path": "trace.jsonl"},
}
# three requests at once behind max_num_seqs 1: who goes first is the policy's choice
TRACE = [{"id": "a", "arrival_s": 0.0, "prompt": "A:300", "output_tokens": 4, "priority": 2},
         {"id": "b", "arrival_s": 0.0, "prompt": "B:300", "output_tokens": 4},
         {"id": "c", "arrival_s": 0.0, "prompt": "C:300", "output_tokens": 4, "priority": 1}]


def _scenario(tmp_path: Path, trace=TRACE, **scheduler) -> Path:
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))
    data = json.loads(json.dumps(BASE))
    data["scheduler"].update(scheduler)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _order(tmp_path: Path, **scheduler) -> list[str]:
    _, rows, _ = simulate(load_scenario(_scenario(tmp_path, **scheduler)))
    return [r.request_id for r in sorted(rows, key=lambda r: r.queue_s)]


def test_priority_serves_lower_values_first_and_fcfs_ignores_them(tmp_path):
    assert _order(tmp_path) == ["a", "b", "c"]
    assert _order(tmp_path, policy="fcfs") == ["a", "b", "c"]
    assert _order(tmp_path, policy="priority") == ["b", "c", "a"]   # 0, 1, 2


def test_unknown_policy_is_one_line_exit_2_naming_the_choices(tmp_path):
    p = _scenario(tmp_path, policy="shortest_first")
    out = tmp_path / "out"
    res = runner.invoke(app, ["run", str(p), "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    for needle in (str(p), "scheduler.policy", "'shortest_first'", "fcfs, lpm, priority"):
        assert needle in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("scheduler, field", [
    ({"policy": "lpm", "lpm_max_wait_steps": 0}, "scheduler.lpm_max_wait_steps"),
    ({"policy": "lpm", "lpm_max_queue": "many"}, "scheduler.lpm_max_queue"),
    ({"policy": "priority", "lpm_max_queue": 64}, "scheduler.lpm_max_queue"),
    ({"policy": 3}, "scheduler.policy"),
])
def test_bad_policy_settings_name_the_field(tmp_path, scheduler, field):
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        load_scenario(_scenario(tmp_path, **scheduler))


def test_lpm_settings_load(tmp_path):
    sc = load_scenario(_scenario(tmp_path, policy="lpm", lpm_max_wait_steps=None,
                                 lpm_max_queue=32))
    s = sc.scheduler
    assert (s.policy, s.lpm_max_wait_steps, s.lpm_max_queue) == ("lpm", None, 32)


def test_jsonl_priority_is_read_written_and_checked(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    reqs = list(build_workload({"kind": "jsonl", "path": str(p)}, 0, None))
    assert [r.priority for r in reqs] == [2, 0, 1]
    back = tmp_path / "back.jsonl"
    write_jsonl(reqs, back)
    lines = [json.loads(x) for x in back.read_text().splitlines()]
    assert [x.get("priority") for x in lines] == [2, None, 1]    # 0 (the default) left out
    assert list(build_workload({"kind": "jsonl", "path": str(back)}, 0, None)) == reqs
    p.write_text(json.dumps({**TRACE[0], "priority": 1.5}) + "\n")
    with pytest.raises(WorkloadError, match=r"t\.jsonl:1: priority must be an integer"):
        list(build_workload({"kind": "jsonl", "path": str(p)}, 0, None))
