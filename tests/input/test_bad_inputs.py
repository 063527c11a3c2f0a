"""The bad-input corpus: scenarios, ``--set``, every trace format, case and step case
files, sweeps, ``sim report`` / ``check`` / ``calibrate`` / ``compare``.

Each case writes its inputs into a fresh tmp folder, runs ``sim`` in-process from there
(so a default ``runs/`` would land there too) and asserts: exit 2, one stderr line
``error: ...`` naming the file and the field or line, no traceback, the tmp folder
byte-for-byte as before (nothing written, nothing deleted) and no ``--out`` folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.input.conftest import assert_input_error, snapshot

BASE = """\
name: tiny
seed: 1
model: nemotron-3-super-120b
kv_cache:
  tensor_parallel_size: 2
gpu:
  type: H200
  count: 2
scheduler:
  max_num_batched_tokens: 8192
  max_num_seqs: 64
speculative:
  method: mtp
  num_speculative_tokens: 2
  mean_accepted_tokens: 1.0
workload:
  kind: system_prompt
  num_system_prompts: 2
  system_prompt_tokens: [3000, 1000]
  suffix_tokens: 100
  output_tokens: 10
  rate_per_s: 5
  num_requests: 5
backend:
  kind: analytical
"""


def _edit(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new, 1)


def _with_workload(block: str) -> str:
    head = BASE.split("workload:")[0]
    return head + block + "backend:\n  kind: analytical\n"


MOONCAKE = "workload:\n  kind: mooncake\n  path: t.jsonl\n"
AZURE = "workload:\n  kind: azure\n  path: t.csv\n"
JSONL = "workload:\n  kind: jsonl\n  path: t.jsonl\n"
MC_OK = b'{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}\n'
AZ_HEAD = b"TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZ_OK = b"2023-11-16 18:15:46.6805900,100,5\n"
JL_OK = b'{"id": "a", "arrival_s": 0, "prompt": "S:40", "output_tokens": 3}\n'
CASE = "config:\n  block_size: 16\n  num_blocks: 64\nrequests:\n  - {id: a, prompt: 'S:40'}\n"
STEPS = "config:\n  block_size: 16\n  num_blocks: 64\nrequests:\n  - {id: a, prompt: 'S:40'}\n"


def _run_bad(sim_inproc, tmp_path: Path, files: dict, args: list[str], must: tuple) -> str:
    for name, data in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    before = snapshot(tmp_path)
    res = sim_inproc(*args, cwd=tmp_path)
    line = assert_input_error(res, *must)
    assert snapshot(tmp_path) == before, "files were written or deleted"
    assert not (tmp_path / "out").exists()
    return line


# --------------------------------------------------------------------------- scenario files

SCENARIO_FILES = {
    "dup-top-key": (BASE + "seed: 2\n", ("s.yaml:26", "duplicate key 'seed'")),
    "dup-nested-key": (_edit("  max_num_seqs: 64\n", "  max_num_seqs: 64\n  max_num_seqs: 8\n"),
                       ("s.yaml:12", "duplicate key 'max_num_seqs'")),
    "non-utf8": (BASE.encode().replace(b"name: tiny", b"name: t\xffny"), ("s.yaml:1", "UTF-8")),
    "yaml-syntax": (_edit("  max_num_seqs: 64\n", "  max_num_seqs: [64\n"), ("s.yaml:", "YAML")),
    "control-char": (BASE + "x: \x07\n", ("s.yaml:26", "not allowed")),
    "empty-file": ("", ("s.yaml", "top level")),
    "top-level-list": ("- 1\n- 2\n", ("s.yaml", "top level")),
    "unknown-top-key": (BASE + "schedular: {}\n", ("s.yaml:26", "schedular", "unknown key")),
    "int-is-text": (_edit("max_num_seqs: 64", "max_num_seqs: lots"),
                    ("s.yaml:11", "scheduler.max_num_seqs", "'lots'")),
    "1e6-is-text": (_edit("max_num_batched_tokens: 8192", "max_num_batched_tokens: 1e6"),
                    ("s.yaml:10", "scheduler.max_num_batched_tokens", "string", "1000000")),
    "scheduler-not-mapping": (_edit("scheduler:\n  max_num_batched_tokens: 8192\n  max_num_seqs: 64\n",
                                    "scheduler: fast\n"), ("s.yaml:9", "scheduler", "mapping")),
    "cache-list": (BASE + "cache: [vllm]\n", ("s.yaml:26", "cache", "mapping")),
    "kv-int-key": (_edit("  tensor_parallel_size: 2\n", "  tensor_parallel_size: 2\n  16: 32\n"),
                   ("s.yaml:6", "kv_cache.16")),
    "unknown-gpu": (_edit("type: H200", "type: H300"), ("s.yaml:7", "gpu.type", "H300", "H100")),
    "mfu-nan": (_edit("kind: analytical", "kind: analytical\n  mfu: .nan"),
                ("s.yaml:", "backend.mfu", "finite")),
    "overhead-inf": (_edit("kind: analytical", "kind: analytical\n  overhead_s: .inf"),
                     ("s.yaml:", "backend.overhead_s", "finite")),
    "accepted-nan": (_edit("mean_accepted_tokens: 1.0", "mean_accepted_tokens: .nan"),
                     ("s.yaml:15", "speculative.mean_accepted_tokens", "finite")),
    "block-size-100": (_edit("  tensor_parallel_size: 2\n", "  tensor_parallel_size: 2\n  block_size: 100\n"),
                       ("s.yaml:", "kv_cache.block_size", "multiple of", "96 or 112")),
    "num-requests-0": (_edit("num_requests: 5", "num_requests: 0"),
                       ("s.yaml:23", "workload.num_requests", "empty")),
    "model-int": (_edit("model: nemotron-3-super-120b", "model: 5"), ("s.yaml:3", "model")),
    "name-list": (_edit("name: tiny", "name: [1]"), ("s.yaml:1", "name")),
    "seed-nan": (_edit("seed: 1", "seed: .nan"), ("s.yaml:2", "seed")),
    "max-model-len-inf": (_edit("max_num_seqs: 64", "max_num_seqs: 64\n  max_model_len: .inf"),
                          ("s.yaml:", "scheduler.max_model_len", "inf")),
    "unknown-model": (_edit("model: nemotron-3-super-120b", "model: gpt-9"), ("s.yaml:3", "model", "gpt-9")),
    # checked only once the layout is built, and still named by its line
    "unit-divides-no-block": (_edit("max_num_seqs: 64\n", "max_num_seqs: 64\ncache:\n"
                                    "  hash_block_size: 100\n"),
                              ("s.yaml:13: cache.hash_block_size", "e.g. 16 or 263")),
    "profile-nan": (_edit("kind: analytical", "kind: analytical\n  profile: p.yaml"),
                    ("p.yaml", "backend.profile", "mfu")),
}


@pytest.mark.parametrize("name", sorted(SCENARIO_FILES))
def test_bad_scenario_file(sim_inproc, tmp_path, name):
    text, must = SCENARIO_FILES[name]
    files = {"s.yaml": text}
    if name == "profile-nan":
        files["p.yaml"] = "mfu: .nan\n"
    _run_bad(sim_inproc, tmp_path, files, ["run", "s.yaml", "--out", "out", "-q"], must)


# --------------------------------------------------------------------------- --set

SETS = {
    "int-is-text": ("scheduler.max_num_seqs=lots", ("--set scheduler.max_num_seqs", "'lots'")),
    "1e6": ("scheduler.max_num_seqs=1e6", ("scheduler.max_num_seqs", "string", "1000000")),
    "scheduler-fast": ("scheduler=fast", ("--set scheduler", "mapping")),
    "cache-list": ("cache=[vllm]", ("--set cache", "mapping")),
    "kv-int-key": ("kv_cache={16: 32}", ("kv_cache.16",)),
    "unknown-gpu": ("gpu.type=H300", ("gpu.type", "H300", "H100, H200, B200")),
    "not-yaml": ("name=[a", ("--set name", "not valid YAML")),
    "empty-path": ("=5", ("--set", "empty")),
    "empty-part": ("a..b=1", ("'a..b'", "empty part")),
    "no-equals": ("scheduler.max_num_seqs", ("--set", "FIELD.PATH=VALUE")),
    "mfu-nan": ("backend.mfu=.nan", ("backend.mfu", "finite")),
    "overhead-inf": ("backend.overhead_s=.inf", ("backend.overhead_s", "finite")),
    "accepted-nan": ("speculative.mean_accepted_tokens=.nan",
                     ("speculative.mean_accepted_tokens", "finite")),
    "block-size-100": ("kv_cache.block_size=100",
                       ("kv_cache.block_size", "kernel_block_size 16", "96 or 112")),
    "dup-key-in-value": ("cache={a: 1, a: 2}", ("--set cache", "duplicate key 'a'")),
    "num-requests-0": ("workload.num_requests=0", ("workload.num_requests", "empty")),
    "through-a-value": ("scheduler.max_num_seqs.x=1", ("scheduler.max_num_seqs.x", "not a section")),
    "mfu-1e-3": ("backend.mfu=1e-3", ("backend.mfu", "0.001")),
    "gpu-count-float": ("gpu.count=0.5", ("gpu.count", "integer")),
    "unknown-field": ("cache.nope=1", ("cache.nope", "unknown key")),
    "unknown-section": ("nosuch.field=1", ("--set nosuch: unknown key", "workload")),
    "unit-divides-no-block": ("cache.hash_block_size=100",
                              ("--set cache.hash_block_size", "(here 4208 tokens)",
                               "e.g. 16 or 263")),
    # (the compiled scheduler holds these in 64-bit machine integers)
    "budget-2**66": ("scheduler.max_num_batched_tokens=73786976294838206464",
                     ("scheduler.max_num_batched_tokens", "below 2**62")),
}


@pytest.mark.parametrize("name", sorted(SETS))
def test_bad_set(sim_inproc, tmp_path, name):
    item, must = SETS[name]
    _run_bad(sim_inproc, tmp_path, {"s.yaml": BASE},
             ["run", "s.yaml", "--out", "out", "-q", "--set", item], must)


# --------------------------------------------------------------------------- traces

TRACES = {
    # Mooncake JSONL
    "mc-empty": (MOONCAKE, "t.jsonl", b"", ("t.jsonl", "no requests")),
    "mc-blank-lines": (MOONCAKE, "t.jsonl", b"\n\n", ("t.jsonl", "no requests")),
    "mc-truncated": (MOONCAKE, "t.jsonl", MC_OK + b'{"timestamp": 1, "input_len', ("t.jsonl:2", "JSON")),
    "mc-wrong-type": (MOONCAKE, "t.jsonl", MC_OK + MC_OK.replace(b"600", b'"600"'),
                      ("t.jsonl:2", "input_length")),
    "mc-missing-field": (MOONCAKE, "t.jsonl", b'{"timestamp": 0, "input_length": 6}\n',
                         ("t.jsonl:1", "output_length")),
    "mc-negative": (MOONCAKE, "t.jsonl", MC_OK.replace(b'"output_length": 4', b'"output_length": -4'),
                    ("t.jsonl:1", "output_length")),
    "mc-non-utf8": (MOONCAKE, "t.jsonl", MC_OK + b'{"timestamp": 1, "x\xff": 1}\n', ("t.jsonl:2", "UTF-8")),
    "mc-nan-timestamp": (MOONCAKE, "t.jsonl", MC_OK.replace(b'"timestamp": 0', b'"timestamp": NaN'),
                         ("t.jsonl:1",)),
    "mc-output-2**64": (MOONCAKE, "t.jsonl", MC_OK.replace(b'"output_length": 4',
                                                           b'"output_length": 18000000000000000000'),
                        ("t.jsonl:1", "output_length", "below 2**62")),
    # Azure CSV
    "az-empty": (AZURE, "t.csv", b"", ("t.csv:1", "empty")),
    "az-header-only": (AZURE, "t.csv", AZ_HEAD, ("t.csv", "no requests")),
    "az-truncated": (AZURE, "t.csv", AZ_HEAD + AZ_OK + b"2023-11-16 18:15:47,10", ("t.csv:3", "columns")),
    "az-wrong-type": (AZURE, "t.csv", AZ_HEAD + AZ_OK.replace(b",100,", b",abc,"),
                      ("t.csv:2", "ContextTokens")),
    "az-negative": (AZURE, "t.csv", AZ_HEAD + AZ_OK.replace(b",5\n", b",-5\n"), ("t.csv:2", "GeneratedTokens")),
    "az-huge": (AZURE, "t.csv", AZ_HEAD + AZ_OK.replace(b",5\n", b",9223372036854775808\n"),
                ("t.csv:2", "GeneratedTokens", "below 2**62")),
    "az-non-utf8": (AZURE, "t.csv", AZ_HEAD + AZ_OK + b"2023-11-16 18:15:47,1\xfe0,5\n", ("t.csv:3", "UTF-8")),
    "az-missing-column": (AZURE, "t.csv", b"TIMESTAMP,ContextTokens\n", ("t.csv:1", "GeneratedTokens")),
    # our JSONL (ShareGPT-style prompts as segments)
    "jl-empty": (JSONL, "t.jsonl", b"", ("t.jsonl", "no requests")),
    "jl-truncated": (JSONL, "t.jsonl", JL_OK + b'{"id": "b", "arr', ("t.jsonl:2", "JSON")),
    "jl-wrong-type": (JSONL, "t.jsonl", JL_OK.replace(b'"output_tokens": 3', b'"output_tokens": "3"'),
                      ("t.jsonl:1", "output_tokens")),
    "jl-missing-field": (JSONL, "t.jsonl", b'{"id": "a", "prompt": "S:4", "output_tokens": 3}\n',
                         ("t.jsonl:1", "arrival_s")),
    "jl-negative": (JSONL, "t.jsonl", JL_OK.replace(b'"arrival_s": 0', b'"arrival_s": -1'),
                    ("t.jsonl:1", "arrival_s")),
    "jl-output-2**63": (JSONL, "t.jsonl", JL_OK.replace(b'"output_tokens": 3',
                                                         b'"output_tokens": 9223372036854775808'),
                        ("t.jsonl:1", "output_tokens", "below 2**62")),
    "jl-non-utf8": (JSONL, "t.jsonl", JL_OK + b'{"id": "\xfe"}\n', ("t.jsonl:2", "UTF-8")),
    "jl-duplicate-key": (JSONL, "t.jsonl", JL_OK.replace(b'"id": "a"', b'"id": "a", "id": "b"'),
                         ("t.jsonl:1", "duplicate key 'id'")),
    # synthetic
    "syn-sessions-0": ("workload:\n  kind: multi_turn\n  num_sessions: 0\n  session_rate_per_s: 1\n"
                       "  turns: 1\n  user_tokens: 5\n  output_tokens: 1\n", None, None,
                       ("s.yaml", "workload.num_sessions", "empty")),
    "syn-no-arrival": ("workload:\n  kind: system_prompt\n  num_system_prompts: 1\n"
                       "  system_prompt_tokens: [10]\n  suffix_tokens: 5\n  output_tokens: 2\n"
                       "  rate_per_s: 0.0001\n  duration_s: 0.001\n", None, None,
                       ("s.yaml", "workload.duration_s", "empty")),
    "syn-negative": ("workload:\n  kind: system_prompt\n  num_system_prompts: 1\n"
                     "  system_prompt_tokens: [10]\n  suffix_tokens: -3\n  output_tokens: 2\n"
                     "  rate_per_s: 1\n  num_requests: 3\n", None, None,
                     ("s.yaml", "workload.suffix_tokens")),
    "syn-rate-nan": ("workload:\n  kind: system_prompt\n  num_system_prompts: 1\n"
                     "  system_prompt_tokens: [10]\n  suffix_tokens: 3\n  output_tokens: 2\n"
                     "  rate_per_s: .nan\n  num_requests: 3\n", None, None,
                     ("s.yaml", "workload.rate_per_s", "finite")),
    "trace-missing-file": (MOONCAKE, None, None, ("s.yaml", "t.jsonl", "no such file")),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_bad_trace(sim_inproc, tmp_path, name):
    workload, trace, data, must = TRACES[name]
    files = {"s.yaml": _with_workload(workload)}
    if trace is not None:
        files[trace] = data
    _run_bad(sim_inproc, tmp_path, files, ["run", "s.yaml", "--out", "out", "-q"], must)


# --------------------------------------------------------------------------- case / step files

CASES = {
    "dup-key": ("c.yaml", CASE.replace("  block_size: 16\n", "  block_size: 16\n  block_size: 32\n"),
                ("c.yaml:3", "duplicate key 'block_size'")),
    "non-utf8": ("c.yaml", CASE.encode().replace(b"S:40", b"S:4\xff0"), ("c.yaml:5", "UTF-8")),
    "yaml-syntax": ("c.yaml", "config: {block_size: 16\n", ("c.yaml:", "YAML")),
    "json-syntax": ("c.json", '{"config": {"block_size": 16},\n "requests": [}', ("c.json:2", "JSON")),
    "json-dup-key": ("c.json", '{"config": {"block_size": 16, "block_size": 8}, "requests": []}',
                     ("c.json", "duplicate key 'block_size'")),
    "json-nan": ("c.json", '{"config": {"block_size": NaN}, "requests": []}', ("c.json", "NaN")),
    "int-is-text": ("c.yaml", CASE.replace("block_size: 16", "block_size: lots"),
                    ("c.yaml", "config.block_size")),
    "int-key": ("c.yaml", CASE.replace("  block_size: 16\n", "  block_size: 16\n  1: 2\n"),
                ("c.yaml", "config.1")),
    "report-mode-list": ("c.yaml", CASE.replace("prompt: 'S:40'}", "prompt: 'S:40', report_mode: [1]}"),
                         ("c.yaml", "requests[0].report_mode")),
    "huge-token-id": ("c.yaml", CASE.replace("'S:40'", "[100000000000000000000]"),
                      ("c.yaml", "requests[0].prompt", "2**62")),
    "prompt-int": ("c.yaml", CASE.replace("'S:40'", "5"), ("c.yaml", "requests[0].prompt")),
    "not-a-file": ("sub/x.yaml", CASE, ("sub", "folder")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_case_file(sim_inproc, tmp_path, name):
    fname, text, must = CASES[name]
    target = fname
    if name == "not-a-file":
        (tmp_path / "sub").mkdir()
        target, fname = "sub", "other.yaml"
    _run_bad(sim_inproc, tmp_path, {fname: text}, ["case", target], must)


STEP_CASES = {
    "config-not-mapping": (STEPS.replace("config:\n  block_size: 16\n  num_blocks: 64\n", "config: 5\n"),
                           ("s.yaml", "config", "mapping")),
    "int-is-text": (STEPS.replace("  block_size: 16\n", "  block_size: 16\n  max_num_seqs: lots\n"),
                    ("s.yaml", "config.max_num_seqs", "'lots'")),
    "non-utf8": (STEPS.encode().replace(b"S:40", b"S:4\xff0"), ("s.yaml:5", "UTF-8")),
    "dup-key": (STEPS + "config: {}\n", ("s.yaml:6", "duplicate key 'config'")),
    "eagle-not-bool": (STEPS.replace("  block_size: 16\n", "  block_size: 16\n  eagle: 1\n"),
                       ("s.yaml", "config.eagle")),
    "duplicate-id": (STEPS + "  - {id: a, prompt: 'S:8'}\n", ("s.yaml", "requests[1].id", "duplicate")),
    "max-tokens-huge": (STEPS.replace("'S:40'}", "'S:40', max_tokens: 100000000000000000000}"),
                        ("s.yaml", "requests[0].max_tokens")),
    "arrival-nan": (STEPS.replace("'S:40'}", "'S:40', arrival_step: .nan}"),
                    ("s.yaml", "requests[0].arrival_step")),
}


@pytest.mark.parametrize("name", sorted(STEP_CASES))
def test_bad_step_file(sim_inproc, tmp_path, name):
    text, must = STEP_CASES[name]
    _run_bad(sim_inproc, tmp_path, {"s.yaml": text}, ["steps", "s.yaml"], must)


# --------------------------------------------------------------------------- sweeps

SWEEPS = {
    "int-grid-key": ("base: b.yaml\ngrid: {1: [a]}\n", ("w.yaml", "grid", "dotted field path")),
    "empty-part": ("base: b.yaml\ngrid: {'a..b': [1]}\n", ("w.yaml", "'a..b'")),
    "bad-point-value": ("base: b.yaml\ngrid: {scheduler.max_num_seqs: [lots]}\n",
                        ("w.yaml", "p000", "scheduler.max_num_seqs", "'lots'")),
    "unknown-gpu": ("base: b.yaml\ngrid: {gpu.type: [H300]}\n", ("w.yaml", "gpu.type", "H100")),
    "dup-key": ("base: b.yaml\nbase: b.yaml\ngrid: {seed: [1]}\n", ("w.yaml:2", "duplicate key 'base'")),
    "non-utf8": (b"base: b.yaml\ngrid: {seed: [1]}\n# \xff\n", ("w.yaml:3", "UTF-8")),
    "base-list": ("base: [1]\ngrid: {seed: [1]}\n", ("w.yaml", "base")),
    "no-base-file": ("base: nope.yaml\ngrid: {seed: [1]}\n", ("w.yaml", "base", "nope.yaml")),
}


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_bad_sweep_file(sim_inproc, tmp_path, name):
    text, must = SWEEPS[name]
    _run_bad(sim_inproc, tmp_path, {"w.yaml": text, "b.yaml": BASE},
             ["sweep", "w.yaml", "--out", "out", "-q", "--workers", "1"], must)


# --------------------------------------------------------------------------- report / check / calibrate / compare

@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    """One good run folder (summary.json, run.json, requests.csv) to corrupt copies of."""
    from sim.entrypoints.cli import main

    d = tmp_path_factory.mktemp("good")
    (d / "s.yaml").write_text(BASE)
    with pytest.raises(SystemExit) as e:
        main(["run", str(d / "s.yaml"), "--out", str(d / "run"), "-q", "--no-report"])
    assert e.value.code == 0
    return d / "run"


def _summary_edit(text: str) -> str:
    d = json.loads(text)
    d["ttft_p50_s"] = "fast"
    return json.dumps(d)


REPORTS = {
    "summary-truncated": ("summary.json", lambda t: t[:40], ("summary.json:", "JSON")),
    "summary-list": ("summary.json", lambda t: "[1]", ("summary.json", "object")),
    "summary-nan": ("summary.json", lambda t: '{"requests": NaN}', ("summary.json", "NaN")),
    "summary-wrong-type": ("summary.json", _summary_edit, ("summary.json", "ttft_p50_s")),
    "run-json-non-utf8": ("run.json", lambda t: b"\xff\xfe", ("run.json:1", "UTF-8")),
    "run-json-missing-key": ("run.json", lambda t: "{}", ("run.json", "missing")),
    "requests-bad-row": ("requests.csv", lambda t: t.splitlines()[0] + "\nr0,x,y\n",
                         ("requests.csv",)),
}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_bad_run_folder_report(sim_inproc, tmp_path, run_folder, name):
    fname, edit, must = REPORTS[name]
    files = {f"run/{p.name}": p.read_bytes() for p in run_folder.iterdir()}
    files[f"run/{fname}"] = edit(files[f"run/{fname}"].decode())
    _run_bad(sim_inproc, tmp_path, files, ["report", "run"], must)


def test_summary_json_is_valid_json_without_nan(run_folder):
    text = (run_folder / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))


def test_check_with_no_goldens_found_fails(sim_inproc, tmp_path):
    # outside the project root: the default cases/ and scenarios/ are not there
    _run_bad(sim_inproc, tmp_path, {}, ["check"], ("nothing to check",))


def test_check_with_an_empty_golden_folder_fails(sim_inproc, tmp_path):
    (tmp_path / "gold").mkdir()
    _run_bad(sim_inproc, tmp_path, {"c.yaml": CASE},
             ["check", "c.yaml", "--golden", "gold"], ("gold", "no golden files"))


def test_check_bad_golden_line_names_file_and_line(sim_inproc, tmp_path):
    files = {"c.yaml": CASE, "gold/c.yaml.golden": "# header\na: hit=0\nnot a golden line\n"}
    _run_bad(sim_inproc, tmp_path, files, ["check", "c.yaml", "--golden", "gold"],
             ("c.yaml.golden:3", "bad golden line"))


def test_calibrate_refuses_to_overwrite_an_existing_profile(sim_inproc, tmp_path):
    pytest.importorskip("torch")
    line = _run_bad(sim_inproc, tmp_path, {"p.yaml": "kind: fitted\n"},
                    ["calibrate", "--model", "nemotron-h-8b", "--out", "p.yaml"], ("p.yaml", "--force"))
    assert "exists" in line


def test_calibrate_refuses_the_tracked_default_profile(sim_inproc, tmp_path):
    pytest.importorskip("torch")
    scenario = _edit("model: nemotron-3-super-120b", "model: {base: nemotron-h-8b, name: tiny-hybrid}")
    scenario = scenario.replace("speculative:\n  method: mtp\n  num_speculative_tokens: 2\n"
                                "  mean_accepted_tokens: 1.0\n", "")
    files = {"profiles/cpu-tiny-hybrid.yaml": "kind: fitted\n", "s.yaml": scenario}
    _run_bad(sim_inproc, tmp_path, files, ["calibrate", "--scenario", "s.yaml"],
             ("profiles/cpu-tiny-hybrid.yaml", "--force"))


@pytest.mark.parametrize("flag,must", [
    ("scheduler.max_num_seqs", ("--flag scheduler.max_num_seqs", "not a boolean")),
    ("max_num_seqs", ("--flag max_num_seqs", "not a boolean")),
    ("gpu.type", ("gpu.type", "not a boolean")),
    ("nope", ("--flag nope", "no such field")),
    ("cache.nope", ("--flag cache.nope", "no field")),
])
def test_compare_flag_must_be_a_boolean_field(sim_inproc, tmp_path, flag, must):
    _run_bad(sim_inproc, tmp_path, {"s.yaml": BASE},
             ["compare", "s.yaml", "--flag", flag, "--out", "out", "-q"], must)


def test_compare_names_the_file_of_an_error_found_when_the_layout_is_built(sim_inproc,
                                                                         tmp_path):
    # (the two runs build the layout: the hash unit is checked there, not at load)
    _run_bad(sim_inproc, tmp_path, {"s.yaml": BASE},
             ["compare", "s.yaml", "--flag", "enable_mamba_shared_prefix_checkpoint", "--set",
              "cache.hash_block_size=100", "--out", "out", "-q"],
             ("s.yaml: --set cache.hash_block_size", "e.g. 16 or 263"))


def test_the_base_scenario_itself_runs(sim_inproc, tmp_path):
    """Control: the corpus's base inputs are good, so each failure above is its edit's."""
    (tmp_path / "s.yaml").write_text(BASE)
    (tmp_path / "c.yaml").write_text(CASE)
    assert sim_inproc("run", "s.yaml", "--out", "out", "-q", "--no-report", cwd=tmp_path).rc == 0
    assert (tmp_path / "out" / "summary.json").is_file()
    assert sim_inproc("case", "c.yaml", cwd=tmp_path).rc == 0
    assert sim_inproc("steps", "c.yaml", cwd=tmp_path).rc == 0
    for wl, name, data in ((MOONCAKE, "t.jsonl", MC_OK), (AZURE, "t.csv", AZ_HEAD + AZ_OK),
                           (JSONL, "t.jsonl", JL_OK)):
        (tmp_path / "s.yaml").write_text(_with_workload(wl))
        (tmp_path / name).write_bytes(data)
        res = sim_inproc("run", "s.yaml", "--out", "out2", "-q", "--no-report", cwd=tmp_path)
        assert res.rc == 0, res.err
