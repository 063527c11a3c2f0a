"""A clone is the whole project: nothing refers outside its root, the shipped traces are the
recorded bytes, torch is optional (and imported only by the torch backend), and the package
says what it is (``--version``, LICENSE)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

SKIP_DIRS = {".git", ".venv", "build", "dist", "runs", "__pycache__", ".pytest_cache"}
# spelled in pieces so that this file does not match itself
OUTSIDE = re.compile("|".join([re.escape(".." + "/shared"), re.escape("/work" + "/"),
                               re.escape("shared" + "/traces"), re.escape("shared" + "/docs"),
                               r"""["']shared["']\s*/"""]))
# the one place allowed to look outside the root: the optional vLLM oracle's locator
ALLOWED = {("sim/oracle/worker.py", "vllm-oracle")}


def _project_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (a walk where git is unavailable)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        files = [ROOT / f for f in out.splitlines()]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in ROOT.rglob("*")
                 if not SKIP_DIRS & set(p.relative_to(ROOT).parts)
                 and not any(part.endswith(".egg-info") for part in p.parts)]
    return [f for f in files if f.is_file() and "data/traces" not in f.relative_to(ROOT).as_posix()]


def test_no_file_refers_outside_the_project():
    bad = []
    for f in _project_files():
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue        # binary
        rel = f.relative_to(ROOT).as_posix()
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) and not any(rel == a and key in line for a, key in ALLOWED):
                bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "references outside the project root:\n" + "\n".join(bad)


def _recorded_checksums() -> dict[str, tuple[int, str]]:
    rows = re.findall(r"^\| `(traces/[^`]+)` \| (\d+) \| `([0-9a-f]{64})` \|$",
                      (ROOT / "data" / "README.md").read_text(), re.MULTILINE)
    return {path: (int(size), sha) for path, size, sha in rows}


def test_shipped_traces_match_their_recorded_sha256():
    recorded = _recorded_checksums()
    assert len(recorded) >= 2
    shipped = {p.relative_to(ROOT / "data").as_posix()
               for p in (ROOT / "data" / "traces").rglob("*") if p.is_file()}
    assert shipped == set(recorded), "every shipped trace (and only those) has a README row"
    for path, (size, sha) in recorded.items():
        data = (ROOT / "data" / path).read_bytes()
        assert len(data) == size, path
        assert hashlib.sha256(data).hexdigest() == sha, path
    total = sum(size for size, _ in recorded.values())
    assert total <= 10_000_000


def test_every_trace_a_scenario_names_is_shipped():
    scenarios = sorted((ROOT / "scenarios").glob("*.yaml"))
    traced = 0
    for s in scenarios:
        wl = (yaml.safe_load(s.read_text()) or {}).get("workload") or {}
        if "path" in wl:
            p = (s.parent / wl["path"]).resolve()
            assert p.is_file(), f"{s.name}: {p}"
            assert p.is_relative_to(ROOT / "data"), f"{s.name}: {wl['path']} is not under data/"
            traced += 1
    assert traced >= 1


def test_license_is_apache_2_with_the_authors():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "Copyright" in text and "The hybrid-cache-sim authors" in text
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'license = "Apache-2.0"' in pyproject


def test_torch_is_an_extra_not_a_dependency():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in meta["dependencies"] if d.lower().startswith("torch")]
    assert [d for d in meta["optional-dependencies"]["torch"] if d.startswith("torch")]


def _python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_nothing_but_the_torch_backend_imports_torch():
    r = _python("import sys\n"
                "import sim.entrypoints.cli, sim.commands.run, sim.commands.sweep\n"
                "import sim.config.scenario, sim.rundir.provenance, sim.commands.calibrate\n"
                "import workloads, reports.run_report, backends.analytical\n"
                "print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("args", [["verify", "scenarios/athena-tiny.yaml"],
                                  ["calibrate", "--model", "nemotron-h-8b"]])
def test_without_torch_verify_and_calibrate_say_how_to_install_it(args):
    r = _python("import sys\n"
                "sys.modules['torch'] = None      # as if torch were not installed\n"
                "from sim.entrypoints.cli import main\n"
                f"main({args!r})")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: sim {args[0]} needs PyTorch")
    assert 'pip install -e ".[torch]"' in lines[0]
    assert "download.pytorch.org/whl/cpu" in lines[0]


def test_version_prints_name_version_and_build(capsys):
    from importlib.metadata import version

    from sim.entrypoints.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"hybrid-cache-sim {version('hybrid-cache-sim')}")
    if (ROOT / ".git").exists():
        assert re.search(r"\(git [0-9a-f]{12}", out[0]), out[0]
    assert out[1].startswith("build: compiled") or out[1].startswith("build: source")
