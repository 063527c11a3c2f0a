"""Bounded inputs (issue #38, P1): what is read before parsing (file size, YAML alias
expansion, sweep points), what a message echoes (a short prefix of a bad value, never a
screenful), and counts, sizes and times the simulator could not represent or finish --
each refused in one line naming the field (or file and line) and the limit, through the
CLI and the notebook API alike, before anything runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, assert_input_error, snapshot

TINY = ROOT / "scenarios" / "athena-tiny.yaml"
MULTI = ROOT / "scenarios" / "multi-turn.yaml"
MC_LINE = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}

BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def _refused(sim_inproc, tmp_path: Path, *args: str, must: tuple = (), longest: int = 400
             ) -> str:
    before = snapshot(tmp_path)
    res = sim_inproc(*args, cwd=tmp_path)
    line = assert_input_error(res, *must)
    assert len(line) <= longest, f"{len(line)} characters: {line[:200]}..."
    assert snapshot(tmp_path) == before, "files were written or deleted"
    return line


def _tiny(tmp_path: Path, edit=None, name: str = "s.yaml") -> Path:
    data = yaml.safe_load(TINY.read_text())
    if edit is not None:
        edit(data)
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def _trace_scenario(tmp_path: Path, kind: str, lines: list[str], **extra) -> Path:
    (tmp_path / "t.trace").write_text("".join(ln + "\n" for ln in lines))
    return _tiny(tmp_path, lambda d: d.__setitem__(
        "workload", {"kind": kind, "path": "t.trace", **extra}))


# ---- what is read before parsing ---------------------------------------------------

def test_a_scenario_over_8_mib_is_refused_unread(sim_inproc, tmp_path):
    with open(tmp_path / "s.yaml", "wb") as f:      # (sparse: no disk, no time)
        f.truncate(9 * 2**20)
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
             must=("s.yaml", "9.0 MiB", "larger than the 8.0 MiB"))


@pytest.mark.parametrize("command", ["case", "steps"])
def test_a_case_file_over_8_mib_is_refused_unread(sim_inproc, tmp_path, command):
    with open(tmp_path / "c.json", "wb") as f:
        f.truncate(64 * 2**20)
    _refused(sim_inproc, tmp_path, command, "c.json", must=("c.json", "64.0 MiB", "8.0 MiB"))


def test_a_billion_laughs_in_the_description_is_refused(sim_inproc, tmp_path):
    text = TINY.read_text().replace("name: athena-tiny\n", "name: athena-tiny\n" + BOMB, 1)
    text = text.replace("kv_cache:", "description: [*i,*i,*i,*i,*i,*i,*i,*i,*i]\nkv_cache:", 1)
    (tmp_path / "s.yaml").write_text(text)
    line = _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
                    must=("s.yaml:", "aliases", "100,000", "billion laughs"))
    n = text.splitlines().index("description: [*i,*i,*i,*i,*i,*i,*i,*i,*i]") + 1
    assert line.startswith(f"error: s.yaml:{n}: ")       # the field that grows, by its line


def test_a_billion_laughs_in_a_case_file(sim_inproc, tmp_path):
    (tmp_path / "c.yaml").write_text(BOMB + "config: {block_size: 16, num_blocks: 64}\n"
                                     "requests: [{id: a, prompt: 'S:40'}]\nsource: *i\n")
    _refused(sim_inproc, tmp_path, "case", "c.yaml", must=("c.yaml:", "billion laughs"))


def test_a_billion_laughs_in_a_sweep_file(sim_inproc, tmp_path):
    (tmp_path / "sw.yaml").write_text(BOMB + f"base: {TINY}\ndescription: *i\n"
                                      "grid: {seed: [1]}\n")
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml:", "billion laughs"))


def test_a_billion_laughs_in_a_set_value(sim_inproc, tmp_path):
    bomb = "{" + ", ".join(BOMB.splitlines()).replace(": &", ": &") + "}"
    _refused(sim_inproc, tmp_path, "run", str(TINY), "--out", "o",
             "--set", f"description={bomb}", must=("--set description", "billion laughs"))


def test_a_recursive_alias_is_refused(sim_inproc, tmp_path):
    (tmp_path / "s.yaml").write_text(TINY.read_text() + "x: &x [1, *x]\n")
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
             must=("s.yaml:", "recursive structure"))


def test_merge_keys_and_a_few_aliases_still_load(sim_inproc, tmp_path):
    (tmp_path / "c.yaml").write_text(
        "config: {block_size: 16, num_blocks: 64}\n"
        "requests:\n  - &r {id: a, prompt: 'S:40'}\n  - {<<: *r, id: b}\n  - {<<: *r, id: c}\n")
    res = sim_inproc("case", "c.yaml", "--compact", cwd=tmp_path)
    assert res.rc == 0, res.err
    assert [r["id"] for r in json.loads(res.out)] == ["a", "b", "c"]


def test_a_sweep_of_a_billion_points_is_refused_before_expanding(sim_inproc, tmp_path):
    axes = "".join(f"  x{i}: [{', '.join(str(v) for v in range(10))}]\n" for i in range(9))
    (tmp_path / "sw.yaml").write_text(f"base: {TINY}\ngrid:\n{axes}")
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "1,000,000,000 points", "4,096"))


def test_a_sweep_of_too_many_named_points_is_refused(sim_inproc, tmp_path):
    (tmp_path / "sw.yaml").write_text(f"base: {TINY}\npoints: [{', '.join(['{}'] * 4097)}]\n")
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "4,097 named", "4,096"))


# ---- what a message echoes ----------------------------------------------------------

def test_a_huge_bad_value_is_echoed_as_a_short_prefix(sim_inproc, tmp_path):
    (tmp_path / "s.yaml").write_text(TINY.read_text().replace(
        "name: athena-tiny", "name: {k: " + "x" * 300_000 + "}", 1))
    line = _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
                    must=("s.yaml:", "name", "..."), longest=200)
    assert "x" * 100 not in line


def test_a_huge_bad_value_in_a_list_is_echoed_as_a_short_prefix(sim_inproc, tmp_path):
    items = ", ".join(["y" * 1000] * 200)
    (tmp_path / "s.yaml").write_text(TINY.read_text().replace(
        "kind: analytical", "kind: [" + items + "]", 1))
    line = _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
                    must=("s.yaml:", "backend.kind"), longest=300)
    assert "y" * 100 not in line


def test_a_deep_bad_value_is_echoed_as_a_short_prefix(sim_inproc, tmp_path):
    deep: list = []
    cur = deep
    for _ in range(60):
        cur.append([])
        cur = cur[0]
    _tiny(tmp_path, lambda d: d.__setitem__("seed", deep))
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o", must=("seed",), longest=200)


def test_a_long_unknown_key_is_cut(sim_inproc, tmp_path):
    _tiny(tmp_path, lambda d: d["scheduler"].__setitem__("k" * 50_000, 1))
    line = _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
                    must=("s.yaml:", "unknown key", "max_num_seqs"), longest=600)
    assert "k" * 200 not in line


def test_an_input_error_is_at_most_1000_characters():
    from sim.errors import InputError

    e = InputError("x: " + "y" * 10**6)
    assert len(str(e)) == 1000 and str(e).endswith("...")


# ---- counts, sizes and times --------------------------------------------------------

HUGE_SETS = {
    "num-requests-2**70": ("workload.num_requests=1180591620717411303424",
                           ("workload.num_requests", "10,000,000", "~2**70")),
    "num-requests-1e8": ("workload.num_requests=100000000",
                         ("workload.num_requests", "at most 10,000,000", "100,000,000")),
    "system-prompts-1e8": ("workload.num_system_prompts=100000000",
                           ("workload.num_system_prompts", "10,000,000")),
    "suffix-2**62": ("workload.suffix_tokens=4611686018427387904",
                     ("workload.suffix_tokens", "below 2**62")),
    "rate-1e-300": ("workload.rate_per_s=1.0e-300",
                    ("workload.rate_per_s", "1,000,000,000 s", "clock")),
    "duration-1e300": ("workload.duration_s=1.0e+300",
                       ("workload.duration_s", "at most 1e+09")),
    "lognormal-sigma-1e6": ("workload.suffix_tokens={dist: lognormal, mean: 50, sigma: 1.0e+6}",
                            ("workload.suffix_tokens.sigma", "at most 10")),
    "gpu-count-1e12": ("gpu.count=1000000000000",
                       ("gpu.count", "1,000,000,000,000 pipeline stages", "8 layers")),
    "gpu-count-9": ("gpu.count=9", ("gpu.count", "9 pipeline stages", "8 layers")),
}


@pytest.mark.parametrize("name", sorted(HUGE_SETS))
def test_a_huge_value_is_refused(sim_inproc, tmp_path, name):
    item, must = HUGE_SETS[name]
    _refused(sim_inproc, tmp_path, "run", str(TINY), "--out", "o", "-q", "--set", item,
             must=("athena-tiny.yaml", "--set") + must)


def test_a_duration_that_would_issue_too_many_requests(sim_inproc, tmp_path):
    _refused(sim_inproc, tmp_path, "run", str(TINY), "--out", "o", "-q",
             "--set", "workload.num_requests=null", "--set", "workload.duration_s=1.0e+8",
             must=("workload.duration_s", "~400,000,000 requests", "give num_requests"))


MULTI_SETS = {
    "turns-1e9": ("workload.turns=1000000000", ("workload.turns", "at most 1,000")),
    "think-1e300": ("workload.think_time_s=1.0e+300", ("workload.think_time_s", "1e+09")),
    "session-rate-1e-300": ("workload.session_rate_per_s=1.0e-300",
                            ("workload.session_rate_per_s", "200 sessions", "clock")),
    "sessions-times-turns": ("workload.num_sessions=10000000",
                             ("workload.num_sessions", "~50,000,000 requests")),
}


@pytest.mark.parametrize("name", sorted(MULTI_SETS))
def test_a_huge_multi_turn_value_is_refused(sim_inproc, tmp_path, name):
    item, must = MULTI_SETS[name]
    _refused(sim_inproc, tmp_path, "run", str(MULTI), "--out", "o", "-q", "--set", item,
             must=("multi-turn.yaml", "--set") + must)


def test_num_requests_2_to_the_70_through_the_api(tmp_path):
    import sim
    from sim.errors import InputError

    with pytest.raises(InputError, match=r"workload.num_requests: must be at most 10,000,000"):
        sim.run(TINY, set={"workload.num_requests": 2**70})
    with pytest.raises(InputError, match=r"workload.num_requests: must be at most 10,000,000"):
        sim.run(TINY, requests=2**70)


def test_a_mooncake_timestamp_of_1e308_is_refused(sim_inproc, tmp_path):
    lines = [json.dumps(MC_LINE), json.dumps(dict(MC_LINE, timestamp=1e308))]
    s = _trace_scenario(tmp_path, "mooncake", lines)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:2", "timestamp", "1,000,000,000 s", "clock"))


def test_a_mooncake_timestamp_in_the_published_layout_past_the_clock(sim_inproc, tmp_path):
    # (an integer timestamp: the fast layout reader's path)
    lines = [json.dumps(MC_LINE), json.dumps(dict(MC_LINE, timestamp=10**14))]
    s = _trace_scenario(tmp_path, "mooncake", lines)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:2", "timestamp", "clock"))


def test_a_mooncake_time_scale_of_1e300(sim_inproc, tmp_path):
    lines = [json.dumps(MC_LINE), json.dumps(dict(MC_LINE, timestamp=5))]
    s = _trace_scenario(tmp_path, "mooncake", lines, time_scale=1e300)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:2", "time_scale", "clock"))


def test_a_jsonl_arrival_of_1e308(sim_inproc, tmp_path):
    rec = {"id": "a", "arrival_s": 1e308, "prompt": "S:40", "output_tokens": 3}
    s = _trace_scenario(tmp_path, "jsonl", [json.dumps(rec)])
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:1", "arrival_s", "clock"))


def test_a_jsonl_think_time_of_1e300(sim_inproc, tmp_path):
    a = {"id": "a", "arrival_s": 0, "prompt": "S:40", "output_tokens": 3}
    b = {"id": "b", "after": "a", "think_s": 1e300, "prompt": "S:50", "output_tokens": 3}
    s = _trace_scenario(tmp_path, "jsonl", [json.dumps(a), json.dumps(b)])
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:2", "think_s", "clock"))


def test_an_azure_trace_spread_past_the_clock(sim_inproc, tmp_path):
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,100,5",
             "2023-11-16 18:15:47.0000000,100,5"]
    s = _trace_scenario(tmp_path, "azure", lines, time_scale=1e300)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("t.trace:3", "TIMESTAMP", "clock"))


@pytest.mark.parametrize("kind", ["jsonl", "azure"])
def test_a_trace_longer_than_the_request_limit(sim_inproc, tmp_path, monkeypatch, kind):
    import workloads.jsonl
    import workloads.traces

    monkeypatch.setattr(workloads.jsonl, "MAX_REQUESTS", 3)
    monkeypatch.setattr(workloads.traces, "MAX_REQUESTS", 3)
    if kind == "jsonl":
        lines = [json.dumps({"id": f"r{i}", "arrival_s": i, "prompt": "S:40",
                             "output_tokens": 2}) for i in range(5)]
    else:
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + \
            [f"2023-11-16 18:15:4{i}.0,100,5" for i in range(5)]
    s = _trace_scenario(tmp_path, kind, lines)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q", "--no-report",
             must=("t.trace:", "more than 3 requests", "workload.num_requests"))


def test_a_trace_num_requests_above_the_limit(sim_inproc, tmp_path):
    s = _trace_scenario(tmp_path, "mooncake", [json.dumps(MC_LINE)],
                        num_requests=10**8)
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("workload.num_requests", "10,000,000"))


def test_a_lognormal_tail_never_passes_the_token_limit():
    import numpy as np

    from workloads.base import MAX_COUNT, Dist

    d = Dist.parse({"dist": "lognormal", "mean": 1e18, "sigma": 10}, "w", integer=True,
                   minimum=1)
    rng = np.random.default_rng(0)
    assert max(d.sample(rng) for _ in range(200)) <= MAX_COUNT


def test_shipped_values_stay_within_the_limits():
    """Control: every shipped scenario loads (the limits refuse none of them)."""
    from sim.config.scenario import load_scenario

    for p in sorted((ROOT / "scenarios").glob("*.yaml")):
        load_scenario(p)
    assert os.path.getsize(TINY) < 2**20
