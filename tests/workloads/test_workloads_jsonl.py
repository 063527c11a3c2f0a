"""Our jsonl format: parsing, errors with path:line, and a round trip."""
import json
import re
from pathlib import Path

import pytest

from workloads import WorkloadError, build_workload, parse_prompt, write_jsonl
from workloads.jsonl import LINE_KEYS, format_prompt

README = Path(__file__).resolve().parents[2] / "workloads" / "README.md"


def load(path, **opts):
    return list(build_workload({"kind": "jsonl", "path": str(path), **opts}, 0, None))


def write(tmp_path, *lines) -> Path:
    p = tmp_path / "w.jsonl"
    p.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return p


def test_round_trip_of_a_generated_workload(tmp_path):
    cfg = {"kind": "multi_turn", "num_sessions": 15, "session_rate_per_s": 1.0,
           "turns": {"dist": "uniform", "low": 1, "high": 4}, "system_prompt_tokens": 64,
           "user_tokens": {"dist": "uniform", "low": 1, "high": 50}, "output_tokens": 7,
           "think_time_s": {"dist": "lognormal", "mean": 3.0, "sigma": 1.0}}
    original = list(build_workload(cfg, 42, None))
    p = tmp_path / "mt.jsonl"
    assert write_jsonl(original, p) == len(original)
    back = list(build_workload({"kind": "jsonl", "path": "mt.jsonl"}, 0, tmp_path))
    assert back == original
    sp = {"kind": "system_prompt", "num_system_prompts": 3, "system_prompt_tokens": 30,
          "suffix_tokens": {"dist": "uniform", "low": 0, "high": 3}, "output_tokens": 2,
          "rate_per_s": 3.0, "num_requests": 40}
    original = list(build_workload(sp, 1, None))
    write_jsonl(original, p)
    assert load(p) == original


def test_string_and_list_prompts(tmp_path):
    p = write(tmp_path,
              {"id": "a", "arrival_s": 0, "prompt": "S:24 U:8", "output_tokens": 16},
              {"id": "b", "arrival_s": 0.5, "segments": [["S", 0, 24], ["V", 0, 8]],
               "output_tokens": 4, "session": "x"},
              "",
              {"id": "c", "prompt": "S:24 V:8 out/b:4 S@24:6", "output_tokens": 1,
               "session": "x", "after": "b", "think_s": 2.0})
    a, b, c = load(p)
    assert a.segments == [("S", 0, 24), ("U", 0, 8)] and a.arrival_s == 0.0
    assert b.segments == [("S", 0, 24), ("V", 0, 8)] and b.session == "x"
    assert c.segments == [("S", 0, 24), ("V", 0, 8), ("out/b", 0, 4), ("S", 24, 6)]
    assert (c.after, c.think_s, c.arrival_s) == ("b", 2.0, 0.5)   # arrival defaults to a lower bound
    slow = load(p, time_scale=2.0, limit=2)
    assert [r.arrival_s for r in slow] == [0.0, 1.0]
    assert format_prompt(c.segments) == "S:24 V:8 out/b:4 S@24:6"
    assert parse_prompt(format_prompt(c.segments)) == c.segments


GOOD = {"id": "x", "arrival_s": 1.0, "prompt": "S:4", "output_tokens": 1}


@pytest.mark.parametrize("line, what", [
    ('{"id": "x", "arrival_s": 1.0,', "invalid JSON"),
    ({**GOOD, "colour": 1}, "unknown field 'colour'"),
    ({**GOOD, "segments": [["S", 0, 4]]}, "exactly one of 'prompt' or 'segments'"),
    ({k: v for k, v in GOOD.items() if k != "prompt"}, "exactly one of"),
    ({**GOOD, "prompt": "S:0"}, "has no tokens"),
    ({**GOOD, "prompt": "S-4"}, "bad segment 'S-4'"),
    ({**GOOD, "prompt": None, "segments": [["S", -1, 4]]}, "offset must be"),
    ({**GOOD, "output_tokens": 0}, "output_tokens must be an integer >= 1"),
    ({**GOOD, "id": "a"}, "duplicate id 'a'"),
    ({**GOOD, "after": "zzz"}, "after 'zzz' names no earlier request"),
    ({**GOOD, "arrival_s": 0.1}, "before the previous request's 0.5"),
    ({k: v for k, v in GOOD.items() if k != "arrival_s"}, "missing field 'arrival_s'"),
    ({**GOOD, "think_s": 1.0}, "think_s is only meaningful with after"),
    ({**GOOD, "arrival_s": "soon"}, "arrival_s must be a number"),
    ("[1, 2]", "expected a JSON object"),
])
def test_broken_line_names_path_and_line(tmp_path, line, what):
    if isinstance(line, dict):
        line = {k: v for k, v in line.items() if v is not None}
    p = write(tmp_path, {"id": "a", "arrival_s": 0.5, "prompt": "S:4", "output_tokens": 1}, line)
    with pytest.raises(WorkloadError) as e:
        load(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:2: ") and what in msg and "\n" not in msg


def test_follow_up_may_arrive_before_later_first_turns(tmp_path):
    p = write(tmp_path,
              {"id": "a", "arrival_s": 0.0, "prompt": "A:4", "output_tokens": 3, "session": "s"},
              {"id": "a2", "arrival_s": 9.0, "prompt": "A:4 out/a:3 B:2", "output_tokens": 1,
               "session": "s", "after": "a", "think_s": 9.0},
              {"id": "b", "arrival_s": 1.0, "prompt": "C:4", "output_tokens": 1})
    assert [r.request_id for r in load(p)] == ["a", "a2", "b"]


def test_readme_documents_every_field_and_its_example_parses(tmp_path):
    text = README.read_text()
    for field in LINE_KEYS:
        assert re.search(rf"^\| `{field}` \|", text, re.M), f"{field} not documented"
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    reqs = load(write(tmp_path, *block.strip().splitlines()))
    assert [r.request_id for r in reqs] == ["a", "b", "c"]
