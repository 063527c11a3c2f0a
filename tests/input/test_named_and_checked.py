"""Silently wrong or unclear (issue #38, P1/P2): goldens that give a request twice,
``sim marconi --alpha inf``, control characters in names and ids, backend profiles with
unknown keys, CLI errors that name the option as typed, run.json recording its inputs
(and refusing a re-run once one changed), the notebook API refusing bad arguments with
the CLI's one-line errors, and ``sim events check`` on an empty stream.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, assert_input_error, snapshot

TINY = ROOT / "scenarios" / "athena-tiny.yaml"
CASE = "config:\n  block_size: 16\n  num_blocks: 64\nrequests:\n  - {id: a, prompt: 'S:40'}\n"
JL = {"id": "a", "arrival_s": 0, "prompt": "S:40", "output_tokens": 3}


def _refused(sim_inproc, tmp_path: Path, *args: str, must: tuple = ()) -> str:
    before = snapshot(tmp_path)
    res = sim_inproc(*args, cwd=tmp_path)
    line = assert_input_error(res, *must)
    assert snapshot(tmp_path) == before, "files were written or deleted"
    return line


def _tiny(tmp_path: Path, edit=None) -> Path:
    data = yaml.safe_load(TINY.read_text())
    if edit is not None:
        edit(data)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# ---- goldens ---------------------------------------------------------------------------

def _golden(tmp_path: Path, body: str) -> None:
    (tmp_path / "c.yaml").write_text(CASE)
    (tmp_path / "gold").mkdir(exist_ok=True)
    (tmp_path / "gold" / "c.yaml.golden").write_text("# golden\n" + body)


GOOD = "a: hit=0 per_group=0,0 junction=0\n"


def test_a_golden_request_given_twice_is_an_error(sim_inproc, tmp_path):
    # the first line is wrong and the second right: it used to pass
    _golden(tmp_path, "a: hit=99 per_group=0,0 junction=0\n" + GOOD)
    _refused(sim_inproc, tmp_path, "check", "c.yaml", "--golden", "gold",
             must=("gold/c.yaml.golden:3", "request 'a'", "line 2", "once"))


def test_a_golden_key_given_twice_is_an_error(sim_inproc, tmp_path):
    _golden(tmp_path, "a: hit=0 hit=99 per_group=0,0 junction=0\n")
    _refused(sim_inproc, tmp_path, "check", "c.yaml", "--golden", "gold",
             must=("c.yaml.golden:2", "key 'hit' given twice"))


def test_a_golden_with_an_unknown_request_fails(sim_inproc, tmp_path):
    _golden(tmp_path, GOOD + "zz: hit=0 per_group=0,0 junction=0\n")
    res = sim_inproc("check", "c.yaml", "--golden", "gold", cwd=tmp_path)
    assert res.rc == 1 and "zz" in res.out and "request gone" in res.out


def test_a_golden_given_twice_is_an_error_under_update_too(sim_inproc, tmp_path):
    _golden(tmp_path, GOOD + GOOD)
    _refused(sim_inproc, tmp_path, "check", "c.yaml", "--golden", "gold", "--update",
             must=("c.yaml.golden:3", "once"))


def test_a_golden_that_is_not_utf8(sim_inproc, tmp_path):
    _golden(tmp_path, "")
    (tmp_path / "gold" / "c.yaml.golden").write_bytes(b"a: hit=\xff0\n")
    _refused(sim_inproc, tmp_path, "check", "c.yaml", "--golden", "gold",
             must=("c.yaml.golden:1", "UTF-8"))


def test_a_sound_golden_still_passes(sim_inproc, tmp_path):
    _golden(tmp_path, GOOD)
    res = sim_inproc("check", "c.yaml", "--golden", "gold", cwd=tmp_path)
    assert res.rc == 0, res.out + res.err


# ---- sim marconi --alpha ----------------------------------------------------------------

@pytest.mark.parametrize("alpha", ["inf", "-inf", "nan", "-1"])
def test_marconi_alpha_must_be_finite_and_not_negative(sim_inproc, tmp_path, alpha):
    _refused(sim_inproc, tmp_path, "marconi", str(TINY), "--alpha", alpha, "--out", "o", "-q",
             must=("--alpha", "must be a number >= 0"))


# ---- control characters ---------------------------------------------------------------

CONTROL = {
    "escape": "a\x1b[31mb",
    "newline": "a\nb",
    "nul": "a\x00b",
    "del": "a\x7fb",
    "c1-next-line": "a\x85b",
    "line-separator": "a\u2028b",
    "bidi-override": "a\u202eb",
}


@pytest.mark.parametrize("kind", sorted(CONTROL))
def test_a_control_character_in_the_name_set_on_the_command_line(sim_inproc, tmp_path, kind):
    value = json.dumps(CONTROL[kind])         # (a YAML double-quoted string)
    _refused(sim_inproc, tmp_path, "run", str(TINY), "-q", "--set", f"name={value}",
             must=("--set name", "control character"))


def test_a_control_character_in_the_name_in_the_file(sim_inproc, tmp_path):
    (tmp_path / "s.yaml").write_text(TINY.read_text().replace(
        "name: athena-tiny", 'name: "athena\\ttiny"', 1))
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "-q",
             must=("s.yaml:6", "name", "control character", "'\\t'"))


def test_a_description_may_span_lines_but_not_hold_escapes(sim_inproc, tmp_path):
    _tiny(tmp_path, lambda d: d.__setitem__("description", "two\nlines\tand a tab"))
    res = sim_inproc("run", "s.yaml", "--out", "o", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0, res.err
    _tiny(tmp_path, lambda d: d.__setitem__("description", "bell\x07"))
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o2", "-q",
             must=("s.yaml", "description", "control character"))


def test_a_control_character_in_a_sweep_name_and_a_point_name(sim_inproc, tmp_path):
    (tmp_path / "sw.yaml").write_text(f'name: "s\\x1bw"\nbase: {TINY}\ngrid: {{seed: [1]}}\n')
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "name", "control character"))
    (tmp_path / "sw.yaml").write_text(f'base: {TINY}\npoints: [{{name: "p\\r1", set: {{}}}}]\n')
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "points[0].name", "control character"))


@pytest.mark.parametrize("field", ["id", "session", "after", "prompt"])
def test_a_control_character_in_a_trace_id(sim_inproc, tmp_path, field):
    first = dict(JL)
    second = {"id": "b", "arrival_s": 1, "prompt": "T:40", "output_tokens": 3}
    if field == "after":
        first["id"] = "a\x1b"
        second.update(after="a\x1b")
        bad_line = 1
    elif field == "prompt":
        second["prompt"] = "T\x1b:40"
        bad_line = 2
    else:
        second[field] = "b\x1bx"
        bad_line = 2
    (tmp_path / "t.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    _tiny(tmp_path, lambda d: d.__setitem__("workload", {"kind": "jsonl", "path": "t.jsonl"}))
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o", "-q",
             must=(f"t.jsonl:{bad_line}", "control character"))


@pytest.mark.parametrize("command", ["case", "steps", "check", "explain"])
def test_a_control_character_in_a_case_request_id(sim_inproc, tmp_path, command):
    (tmp_path / "c.yaml").write_text(CASE + "  - {id: \"b\\e[2J\", prompt: 'S:48'}\n")
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "c.yaml.golden").write_text(GOOD)
    extra = ("--golden", "gold") if command == "check" else ()
    _refused(sim_inproc, tmp_path, command, "c.yaml", *extra,
             must=("c.yaml:6", "requests[1].id", "control character"))


def test_printable_unicode_names_are_fine(sim_inproc, tmp_path):
    res = sim_inproc("run", str(TINY), "-q", "--no-report", "--set", "name=naïve-日本-ü",
                     cwd=tmp_path)
    assert res.rc == 0, res.err
    assert (tmp_path / "runs" / "naïve-日本-ü" / "requests.csv").is_file()


# ---- backend profiles -------------------------------------------------------------------

@pytest.mark.parametrize("text,must", [
    ("mfuu: 0.5\n", ("'mfuu': unknown key", "did you mean 'mfu'")),
    ("mfu: 0.5\noverhead: 0.001\n", ("'overhead': unknown key", "overhead_s")),
    ("kind: fitted\ncoefficients: {per_item_s: 0.1, per_token_s: 0.1, per_pair_s: 0.1, "
     "per_tokn_s: 1}\n", ("coefficients.'per_tokn_s': unknown key",)),
    ("kind: fited\nmfu: 0.5\n", ("kind: must be fitted",)),
], ids=["typo", "unknown", "coefficient-typo", "kind-typo"])
def test_a_profile_with_an_unknown_key_names_the_file(sim_inproc, tmp_path, text, must):
    (tmp_path / "p.yaml").write_text(text)
    _tiny(tmp_path, lambda d: d.__setitem__("backend", {"kind": "analytical",
                                                        "profile": "p.yaml"}))
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o", "-q",
             must=("s.yaml:", "backend.profile", "p.yaml") + must)


def test_the_shipped_profile_still_loads(sim_inproc, tmp_path):
    _tiny(tmp_path, lambda d: d.__setitem__("backend", {
        "kind": "analytical", "profile": str(ROOT / "profiles" / "cpu-tiny-hybrid.yaml")}))
    res = sim_inproc("run", "s.yaml", "--out", "o", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0, res.err


# ---- CLI errors name the option as typed ----------------------------------------------

@pytest.mark.parametrize("args,name", [
    (("--tp", "0"), "--tp"),
    (("--tensor-parallel-size", "3"), "--tensor-parallel-size"),
    (("--tp=5",), "--tp"),
    (("--block-size", "7"), "--block-size"),
    (("--kernel-block-size", "0"), "--kernel-block-size"),
    (("--num-speculative-tokens", "-1"), "--num-speculative-tokens"),
    (("--kv-cache-dtype", "fp4"), "--kv-cache-dtype"),
    (("--mamba-ssm-cache-dtype", "x"), "--mamba-ssm-cache-dtype"),
    (("--speculative-method", "magic"), "--speculative-method"),
], ids=lambda v: v if isinstance(v, str) else "_".join(v))
def test_sim_model_names_the_option_as_typed(sim_inproc, tmp_path, args, name):
    line = _refused(sim_inproc, tmp_path, "model", "nemotron-h-8b", *args,
                    must=(f"error: {name}: ",))
    bare = name.lstrip("-").replace("-", "_")
    assert f" {bare}:" not in line and " tp:" not in line


def test_sim_calibrate_names_its_counts_as_typed(sim_inproc, tmp_path):
    # (checked before PyTorch is needed, or imported)
    _refused(sim_inproc, tmp_path, "calibrate", "--model", "nemotron-h-8b", "--layers", "0",
             must=("error: --layers: must be >= 1",))
    _refused(sim_inproc, tmp_path, "calibrate", "--model", "nemotron-h-8b", "--width-div", "0",
             must=("error: --width-div: must be >= 1",))


def test_a_scaled_models_message_names_the_option(monkeypatch):
    from sim.entrypoints import common
    from sim.entrypoints.cli_tools import CALIBRATE_OPTIONS, MODEL_OPTIONS
    from sim.entrypoints.common import option_message

    monkeypatch.setattr(common, "COMMAND_LINE", ["sim", "model", "nemotron-h-8b"])

    assert option_message("num_layers must be >= 2 to hold a Mamba and an attention layer",
                          CALIBRATE_OPTIONS) == \
        "--layers: must be >= 2 to hold a Mamba and an attention layer"
    assert option_message("tp: 3 does not divide", MODEL_OPTIONS) == \
        "--tensor-parallel-size: 3 does not divide"          # (not typed: its first name)
    assert option_message("workload.x: bad", MODEL_OPTIONS) == "workload.x: bad"


@pytest.mark.parametrize("tol", ["-1", "0", "nan", "inf"])
def test_sim_verify_tol_must_be_a_finite_positive_number(sim_inproc, tmp_path, tol):
    _refused(sim_inproc, tmp_path, "verify", str(TINY), "--tol", tol,
             must=("--tol", "finite number > 0"))


# ---- run.json records its inputs ---------------------------------------------------------

def _trace_run(sim_inproc, tmp_path: Path) -> Path:
    lines = [json.dumps(dict(JL, id=f"r{i}", arrival_s=i * 0.5)) for i in range(6)]
    (tmp_path / "t.jsonl").write_text("".join(ln + "\n" for ln in lines))
    _tiny(tmp_path, lambda d: d.__setitem__("workload", {"kind": "jsonl", "path": "t.jsonl"}))
    assert sim_inproc("run", "s.yaml", "--out", "a", "-q", "--no-report", cwd=tmp_path).rc == 0
    return tmp_path / "a" / "run.json"


def test_run_json_records_each_input_file(sim_inproc, tmp_path):
    import hashlib

    rec = json.loads(_trace_run(sim_inproc, tmp_path).read_text())
    inputs = rec["inputs"]
    assert set(inputs) == {"scenario_file", "workload.path"}
    trace = (tmp_path / "t.jsonl").read_bytes()
    assert inputs["workload.path"]["bytes"] == len(trace)
    assert inputs["workload.path"]["sha256"] == hashlib.sha256(trace).hexdigest()
    assert inputs["workload.path"]["path"].endswith("t.jsonl")


def test_rerunning_after_the_trace_changed_is_refused(sim_inproc, tmp_path):
    run_json = _trace_run(sim_inproc, tmp_path)
    assert sim_inproc("run", str(run_json), "--out", "b", "-q", "--no-report",
                      cwd=tmp_path).rc == 0                    # unchanged: re-runs
    with open(tmp_path / "t.jsonl", "a") as f:
        f.write(json.dumps(dict(JL, id="late", arrival_s=9)) + "\n")
    _refused(sim_inproc, tmp_path, "run", str(run_json), "--out", "c", "-q",
             must=("run.json", "workload.path", "changed since the run read it", "SHA-256"))


def test_rerunning_after_the_trace_is_gone_is_refused(sim_inproc, tmp_path):
    run_json = _trace_run(sim_inproc, tmp_path)
    (tmp_path / "t.jsonl").unlink()
    _refused(sim_inproc, tmp_path, "run", str(run_json), "--out", "c", "-q",
             must=("run.json", "workload.path", "gone"))


def test_rerunning_onto_another_trace_on_purpose_runs(sim_inproc, tmp_path):
    run_json = _trace_run(sim_inproc, tmp_path)
    (tmp_path / "u.jsonl").write_text(json.dumps(JL) + "\n")
    (tmp_path / "t.jsonl").write_text("")                      # (the recorded one changed)
    res = sim_inproc("run", str(run_json), "--set", f"workload.path={tmp_path / 'u.jsonl'}",
                     "--out", "c", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0, res.err


def test_rerunning_after_the_profile_changed_is_refused(sim_inproc, tmp_path):
    (tmp_path / "p.yaml").write_text("mfu: 0.5\n")
    _tiny(tmp_path, lambda d: d.__setitem__("backend", {"kind": "analytical",
                                                        "profile": "p.yaml"}))
    assert sim_inproc("run", "s.yaml", "--out", "a", "-q", "--no-report", cwd=tmp_path).rc == 0
    (tmp_path / "p.yaml").write_text("mfu: 0.25\n")
    _refused(sim_inproc, tmp_path, "run", "a/run.json", "--out", "b", "-q",
             must=("backend.profile", "changed since the run read it"))


def test_a_run_json_from_before_inputs_were_recorded_still_reruns(sim_inproc, tmp_path):
    run_json = _trace_run(sim_inproc, tmp_path)
    rec = json.loads(run_json.read_text())
    del rec["inputs"]
    (tmp_path / "old.json").write_text(json.dumps(rec))
    res = sim_inproc("run", "old.json", "--out", "b", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0, res.err


# ---- the notebook API: the CLI's checks, the CLI's lines ---------------------------------

def _api_error(fn, *args, **kw) -> str:
    from sim.errors import InputError

    with pytest.raises(InputError) as got:
        fn(*args, **kw)
    text = str(got.value)
    assert "\n" not in text and type(got.value).__mro__[0] is not ValueError
    return text


def test_api_set_as_a_string_is_the_clis_set(tmp_path):
    import sim

    assert _api_error(sim.run, TINY, set="x") == "--set 'x': expected FIELD.PATH=VALUE"
    # the same line the CLI prints for --set x
    from sim.entrypoints.cli import main

    with pytest.raises(SystemExit):
        main(["run", str(TINY), "--set", "x", "--out", str(tmp_path / "o")])
    r = sim.run(TINY, set="workload.num_requests=3")
    assert r.summary["requests"] == 3
    r = sim.run(TINY, set=["workload.num_requests=3", "seed=2"])
    assert r.info["seed"] == 2


@pytest.mark.parametrize("kw,message", [
    ({"set": 5}, "set: expected a mapping"),
    ({"set": {3: 1}}, "set: 3: field paths are strings"),
    ({"set": {"workload.num_requests": "lots"}}, "workload.num_requests"),
    ({"requests": 0}, "requests: must be an integer >= 1, got 0"),
    ({"requests": "5"}, "requests: must be an integer >= 1"),
    ({"requests": True}, "requests: must be an integer >= 1"),
    ({"out": 5}, "out: expected a path"),
    ({"report": "yes"}, "report: must be true or false"),
])
def test_api_run_refuses_bad_arguments_in_one_line(kw, message):
    import sim

    assert message in _api_error(sim.run, TINY, **kw)


def test_api_run_refuses_a_bad_scenario_argument():
    import sim

    assert _api_error(sim.run, None).startswith("scenario: expected a path")
    assert _api_error(sim.load, 3.5).startswith("run_dir: expected a path")


def test_api_run_errors_found_while_running_are_the_clis_lines(sim_inproc, tmp_path):
    import sim

    (tmp_path / "p.yaml").write_text("mfuu: 1\n")
    s = _tiny(tmp_path, lambda d: d.__setitem__("backend", {"kind": "analytical",
                                                            "profile": "p.yaml"}))
    api = _api_error(sim.run, s)
    cli = sim_inproc("run", str(s), "--out", "o", "-q", cwd=tmp_path)
    assert cli.err.strip() == f"error: {api}"


@pytest.mark.parametrize("kw,message", [
    ({"workers": 0}, "workers: must be >= 1, got 0"),
    ({"workers": -2}, "workers: must be >= 1, got -2"),
    ({"workers": 1.5}, "workers: must be an integer >= 1"),
    ({"search": "max"}, "search: must be 'rate'"),
    ({"set": "seed"}, "--set 'seed': expected FIELD.PATH=VALUE"),
])
def test_api_sweep_refuses_bad_arguments_like_the_cli(kw, message):
    import sim

    pytest.importorskip("pandas")
    assert message in _api_error(sim.sweep, ROOT / "scenarios" / "sweeps" / "flag-onoff.yaml",
                                 **kw)


# ---- sim events check on an empty stream ------------------------------------------------

@pytest.mark.parametrize("name,data", [("e.jsonl", b""), ("b.jsonl", b"\n\n  \n"),
                                       ("e.msgpack", b"")], ids=["empty", "blank", "msgpack"])
def test_events_check_on_an_empty_stream_is_an_error(sim_inproc, tmp_path, name, data):
    if name.endswith(".msgpack"):
        pytest.importorskip("msgpack")
    (tmp_path / name).write_bytes(data)
    _refused(sim_inproc, tmp_path, "events", "check", name, must=(name, "empty"))


def test_events_check_on_a_header_only_stream_still_reports(sim_inproc, tmp_path):
    (tmp_path / "h.jsonl").write_text('{"kv_events_header": {"groups": []}}\n')
    res = sim_inproc("events", "check", "h.jsonl", cwd=tmp_path)
    assert res.rc == 0 and "0 batches" in res.out, res.out + res.err
