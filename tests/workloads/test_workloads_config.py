"""Config validation (errors name workload.<field>), describe(), the README's
examples, and the slice helper."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workloads import (KINDS, MooncakeConfig, SystemPromptConfig, WorkloadError, build_workload,
                       describe, load_config)
from workloads.slice import main as slice_main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "workloads" / "README.md"

SP = {"kind": "system_prompt", "num_system_prompts": 2, "system_prompt_tokens": [100, 200],
      "suffix_tokens": 10, "output_tokens": 5, "rate_per_s": 1.0, "num_requests": 10}
MT = {"kind": "multi_turn", "num_sessions": 3, "session_rate_per_s": 1.0, "turns": 2,
      "user_tokens": 5, "output_tokens": 5}


@pytest.mark.parametrize("cfg, pattern", [
    ({**SP, "num_request": 3}, r"^workload\.num_request: unknown key .*did you mean 'num_requests'"),
    ({**SP, "suffix_tokens": {"dist": "uniform", "low": 1, "hgh": 2}},
     r"^workload\.suffix_tokens\.hgh: unknown key"),
    ({**SP, "num_requests": "10"}, r"^workload\.num_requests: expected an integer, got '10'"),
    ({**SP, "num_requests": True}, r"^workload\.num_requests: expected an integer"),
    ({**SP, "num_requests": -1}, r"^workload\.num_requests: must be >= 0"),
    ({**SP, "suffix_tokens": -3}, r"^workload\.suffix_tokens: must be >= 0, got -3"),
    ({**SP, "output_tokens": {"dist": "fixed", "value": 0}}, r"^workload\.output_tokens\.value: must be >= 1"),
    ({**SP, "output_tokens": {"dist": "uniform", "low": 9, "high": 3}}, r"^workload\.output_tokens\.high: must be >= 9"),
    ({**SP, "output_tokens": {"dist": "normal"}}, r"^workload\.output_tokens\.dist: must be one of"),
    ({**SP, "output_tokens": {"dist": "lognormal", "mean": 0, "sigma": 1}}, r"^workload\.output_tokens\.mean: must be > 0"),
    ({**SP, "output_tokens": {"value": 3}}, r"^workload\.output_tokens\.dist: missing"),
    ({**SP, "output_tokens": "many"}, r"^workload\.output_tokens: expected an integer or a mapping"),
    ({**SP, "system_prompt_tokens": [100, 0]}, r"^workload\.system_prompt_tokens\[1\]: must be >= 1"),
    ({**SP, "rate_per_s": 0}, r"^workload\.rate_per_s: must be > 0"),
    ({**SP, "popularity": "pareto"}, r"^workload\.popularity: must be one of uniform, zipf"),
    ({**SP, "zipf_s": 2.0}, r"^workload\.zipf_s: only used with popularity: zipf"),
    ({**SP, "cv": 2.0}, r"^workload\.cv: only used with arrival: gamma"),
    ({k: v for k, v in SP.items() if k != "num_requests"}, r"^workload\.num_requests: missing"),
    ({k: v for k, v in SP.items() if k != "rate_per_s"}, r"^workload\.rate_per_s: missing"),
    ({**MT, "think_time_s": {"dist": "uniform", "low": -1.0, "high": 2}}, r"^workload\.think_time_s\.low: must be >= 0"),
    ({**MT, "turns": 0}, r"^workload\.turns: must be >= 1"),
    ({**MT, "session_rate": 1}, r"^workload\.session_rate: unknown key .*session_rate_per_s"),
    ({"kind": "mooncake", "path": "x", "time_scale": -1}, r"^workload\.time_scale: must be >= 0"),
    ({"kind": "mooncake", "path": "x", "block_tokens": 0}, r"^workload\.block_tokens: must be >= 1"),
    ({"kind": "azure", "path": "x", "block_tokens": 16}, r"^workload\.block_tokens: unknown key"),
    ({"kind": "jsonl", "path": 3}, r"^workload\.path: expected a non-empty string"),
    ({"kind": "jsonl"}, r"^workload\.path: missing"),
    ({"kind": "sharegpt"}, r"^workload\.kind: must be one of system_prompt, multi_turn, mooncake, azure, jsonl"),
    ({"num_requests": 3}, r"^workload\.kind: missing"),
    (["kind", "azure"], r"^workload: expected a mapping"),
])
def test_bad_config_names_the_field(cfg, pattern):
    with pytest.raises(WorkloadError, match=pattern) as e:
        build_workload(cfg, 0, Path("."))          # raised up front, before any iteration
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_build_is_lazy_and_validates_up_front():
    it = build_workload({**SP, "num_requests": 10**7}, 0, None)   # would never finish if eager
    assert next(it).request_id == "r0000000"
    with pytest.raises(WorkloadError, match="^seed:"):
        build_workload(SP, "0", None)


def test_typed_frozen_configs():
    cfg = load_config(SP)
    assert isinstance(cfg, SystemPromptConfig) and cfg.system_prompt_tokens == (100, 200)
    with pytest.raises(AttributeError):
        cfg.num_requests = 3                                        # frozen
    assert MooncakeConfig.from_mapping({"path": "t.jsonl"}) == MooncakeConfig("t.jsonl")
    assert set(KINDS) == {"system_prompt", "multi_turn", "mooncake", "azure", "jsonl"}


def test_describe_is_one_line_per_kind():
    lines = [describe(SP), describe(MT), describe({"kind": "mooncake", "path": "m.jsonl", "limit": 5}),
             describe({"kind": "azure", "path": "a.csv", "time_scale": 0.5}),
             describe({"kind": "jsonl", "path": "j.jsonl"})]
    for line, kind in zip(lines, KINDS):
        assert line.startswith(kind + ":") and "\n" not in line
    assert "2 prompts" in lines[0] and "10 requests" in lines[0]
    assert "first 5" in lines[2] and "time x0.5" in lines[3]
    assert describe(load_config(MT)) == lines[1]


def test_readme_yaml_examples_are_valid():
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    kinds = set()
    for block in blocks:
        cfg = yaml.safe_load(block)["workload"]
        kinds.add(load_config(cfg).KIND)
    assert kinds == set(KINDS)


def test_slice_copies_the_first_lines(tmp_path, capsys):
    src = tmp_path / "src.csv"
    src.write_text("H\n" + "".join(f"{i}\n" for i in range(10)))
    assert slice_main([str(src), str(tmp_path / "d" / "a.csv"), "--lines", "3"]) == 0
    assert (tmp_path / "d" / "a.csv").read_text() == "H\n0\n1\n"
    assert slice_main([str(src), str(tmp_path / "b.csv"), "--lines", "3", "--header"]) == 0
    assert (tmp_path / "b.csv").read_text() == "H\n0\n1\n2\n"
    assert slice_main([str(src), str(src), "--lines", "3"]) == 2
    assert src.read_text().count("\n") == 11


def test_slice_runs_as_a_module(tmp_path, fixtures):
    out = tmp_path / "m.jsonl"
    subprocess.run([sys.executable, "-m", "workloads.slice",
                    str(fixtures / "mooncake_conversation_head.jsonl"), str(out), "--lines", "5"],
                   check=True, capture_output=True, cwd=ROOT)
    assert len(list(build_workload({"kind": "mooncake", "path": str(out)}, 0))) == 5


def test_fixtures_are_heads_of_the_shipped_traces(fixtures):
    shipped = ROOT / "data" / "traces"
    pairs = [("mooncake_conversation_head.jsonl", "mooncake_fast25/conversation_trace.jsonl", 200),
             ("azure_conv_head.csv", "azure_llm_2023/AzureLLMInferenceTrace_conv.csv", 51)]
    for fixture, original, n in pairs:
        lines = (fixtures / fixture).read_text().splitlines()
        assert len(lines) == n
        with open(shipped / original) as fh:
            assert lines == [next(fh).rstrip("\n") for _ in range(n)]
