"""The CLI: fixed choices are parsed (listed in --help, anything else rejected), and
``--requests N`` / ``workload.num_requests`` is the one name for how many requests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from workloads import build_workload, describe

from tests.entrypoints.sim_cli import run_sim

ROOT = Path(__file__).resolve().parents[2]


def sim(*args: str, cwd: Path = ROOT) -> int:
    return run_sim(*args, cwd=cwd)


@pytest.mark.parametrize("args, option, choices", [
    (["sweep", "scenarios/sweeps/flag-onoff.yaml", "--executor", "slurm"], "--executor",
     ["local", "ray"]),
    (["calibrate", "--model", "nemotron-h-8b", "--grid", "huge"], "--grid", ["quick", "full"]),
    (["calibrate", "--model", "nemotron-h-8b", "--device", "tpu"], "--device", ["cpu", "cuda"]),
    (["calibrate", "--model", "nemotron-h-8b", "--dtype", "fp16"], "--dtype",
     ["float32", "bfloat16"]),
    (["verify", "scenarios/athena-tiny.yaml", "--plant", "nonsense"], "--plant",
     ["state_off_by_one"]),
])
def test_a_value_outside_the_choices_is_rejected_by_the_parser(capsys, args, option, choices):
    assert sim(*args) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:"), err
    assert option in err[0] and args[-1] in err[0]
    assert all(c in err[0] for c in choices), err[0]


@pytest.mark.parametrize("command, choices", [
    ("sweep", ["local", "ray"]), ("calibrate", ["quick", "full", "cpu", "cuda", "bfloat16"]),
    ("verify", ["state_off_by_one"])])
def test_help_lists_the_choices(capsys, command, choices):
    assert sim(command, "--help") == 0
    out = capsys.readouterr().out
    for c in choices:
        assert c in out, (command, c)


def test_run_requests_n_issues_n_requests(tmp_path):
    out = tmp_path / "out"
    assert sim("run", "scenarios/mooncake-conversation.yaml", "--requests", "25", "--out", str(out),
               "-q", "--no-report") == 0
    rows = (out / "requests.csv").read_text().splitlines()[1:]
    assert len(rows) == 25 and rows[-1].startswith("r0000024,")
    assert json.loads((out / "summary.json").read_text())["requests"] == 25


def test_run_requests_overrides_an_old_name_in_the_file(tmp_path):
    data = yaml.safe_load((ROOT / "scenarios" / "mooncake-conversation.yaml").read_text())
    data["workload"]["path"] = str(ROOT / "data" / "traces" / "mooncake_fast25" /
                                   "conversation_trace.jsonl")
    data["workload"]["limit"] = 40                       # the deprecated name
    scen = tmp_path / "old.yaml"
    scen.write_text(yaml.safe_dump(data))
    assert sim("run", str(scen), "--out", str(tmp_path / "a"), "-q", "--no-report") == 0
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["requests"] == 40
    assert sim("run", str(scen), "--requests", "12", "--out", str(tmp_path / "b"), "-q",
               "--no-report") == 0
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["requests"] == 12


def test_run_requests_rejects_a_negative_count(capsys):
    assert sim("run", "scenarios/athena.yaml", "--requests", "-3") == 2
    err = capsys.readouterr().err
    assert "--requests" in err


def test_sweep_requests_applies_to_every_point(tmp_path):
    out = tmp_path / "sw"
    assert sim("sweep", "scenarios/sweeps/flag-onoff.yaml", "--requests", "15", "--workers", "1",
               "--out", str(out), "-q", "--no-report") == 0
    points = sorted((out / "points").iterdir())
    assert len(points) >= 2
    for p in points:
        assert json.loads((p / "summary.json").read_text())["requests"] == 15


# --------------------------------------------------------------- one name in every kind --
MOONCAKE = str(ROOT / "tests" / "fixtures" / "mooncake_conversation_head.jsonl")
AZURE = str(ROOT / "tests" / "fixtures" / "azure_conv_head.csv")
MT = {"kind": "multi_turn", "session_rate_per_s": 1.0, "turns": 3, "user_tokens": 10,
      "output_tokens": 4}
SP = {"kind": "system_prompt", "num_system_prompts": 2, "system_prompt_tokens": 100,
      "suffix_tokens": 10, "output_tokens": 4, "rate_per_s": 2.0}


@pytest.mark.parametrize("cfg", [
    {"kind": "mooncake", "path": MOONCAKE}, {"kind": "azure", "path": AZURE}, SP,
    MT, {**MT, "num_sessions": 100}])
def test_num_requests_counts_requests_in_every_kind(cfg):
    reqs = list(build_workload({**cfg, "num_requests": 7}, 0, ROOT))
    assert len(reqs) == 7


def test_multi_turn_num_requests_cuts_the_last_session_and_keeps_the_draws():
    whole = list(build_workload({**MT, "num_sessions": 3}, 0, ROOT))        # 3 x 3 turns
    assert len(whole) == 9
    cut = list(build_workload({**MT, "num_requests": 5}, 0, ROOT))
    assert [r.request_id for r in cut] == [r.request_id for r in whole[:5]]
    assert [r.segments for r in cut] == [r.segments for r in whole[:5]]
    both = list(build_workload({**MT, "num_sessions": 1, "num_requests": 5}, 0, ROOT))
    assert len(both) == 3                                               # whichever first
    assert "5 requests" in describe({**MT, "num_requests": 5})


def test_multi_turn_needs_a_count():
    from workloads import WorkloadError

    with pytest.raises(WorkloadError, match=r"workload\.num_requests: missing"):
        list(build_workload(MT, 0, ROOT))


def test_old_name_limit_is_an_alias_and_both_names_are_an_error():
    from workloads import RENAMED, WorkloadError

    assert RENAMED == {"limit": "num_requests"}
    old = list(build_workload({"kind": "mooncake", "path": MOONCAKE, "limit": 4}, 0, ROOT))
    new = list(build_workload({"kind": "mooncake", "path": MOONCAKE, "num_requests": 4}, 0, ROOT))
    assert [r.request_id for r in old] == [r.request_id for r in new] and len(new) == 4
    with pytest.raises(WorkloadError, match=r"workload\.limit: the old name of "
                                            r"workload\.num_requests"):
        build_workload({"kind": "mooncake", "path": MOONCAKE, "limit": 4, "num_requests": 5}, 0)
    # an old name set to null counts as absent
    assert len(list(build_workload({"kind": "mooncake", "path": MOONCAKE, "limit": None,
                                    "num_requests": 3}, 0, ROOT))) == 3


@pytest.mark.parametrize("command", [["run"], ["sweep"], ["explain"], ["steps"], ["verify"],
                                     ["events", "check"], ["marconi"]])
def test_help_prints_each_docstring_paragraph_as_one_paragraph(capsys, monkeypatch, command):
    # on a terminal wide enough for any paragraph, each one is a single line: the help does
    # not break sentences where the docstring's source lines end
    import inspect

    from sim.entrypoints.cli import app

    monkeypatch.setenv("COLUMNS", "1000")
    assert sim(*command, "--help") == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    infos = {i.callback.__name__: i for g in [app] + [x.typer_instance for x in app.registered_groups]
             for i in g.registered_commands}
    doc = inspect.getdoc(infos["events_check" if command == ["events", "check"] else command[0]]
                         .callback)
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    assert len(paragraphs) >= 1
    for p in paragraphs:
        assert p in lines, (command, p)


def test_every_option_and_argument_of_every_command_has_help():
    import typer

    from sim.entrypoints.cli import app

    missing = []

    def walk(cmd, path):
        for p in getattr(cmd, "params", []):
            if p.name != "help" and not getattr(p, "help", None):
                missing.append(f"{' '.join(path)} {p.opts[0] if p.opts else p.name}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + [name])

    walk(typer.main.get_command(app), ["sim"])
    assert missing == []
