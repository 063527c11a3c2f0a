"""What produced a run: the project's version and git commit, the command line, and the
fully resolved scenario, so that ``run.json`` can re-run a run exactly.

``run.json`` is a JSON object; readers ignore keys they do not know.  The keys this
module writes (beside the report header of ``sim/commands/run.py`` ``run_header``):

* ``scenario`` -- the scenario mapping as it ran: the file's fields after ``--set`` and a
  sweep point's overrides, with ``seed`` and ``name`` filled in, old field names written
  as the one name (``sim/cache/config.py`` ``ALIASES``), and every file path in it
  (``workload.path``, ``backend.profile``) rewritten so that it no longer depends on the
  scenario's folder: relative to the project root when the file lies inside it (``data/...``),
  else absolute.
* ``paths_relative_to`` -- ``"project root"``: how to read those relative paths.
* ``scenario_file`` -- the scenario file the run started from (informational).
* ``seed``, ``version``, ``commit`` (``null`` outside a git checkout), ``commit_dirty``
  (tracked files differ from the commit), ``command`` (the command line, a list).
* ``inputs`` -- each file the run read, by what named it (``scenario_file``,
  ``workload.path``, ``backend.profile``): ``{"path", "bytes", "sha256"}``.

``sim run RUN_FOLDER/run.json`` loads ``scenario`` back (``load_run_record``) and
replays it; requests.csv and summary.json come out byte-identical apart from the two
wall-clock fields of summary.json.  A trace or profile the re-run would read that is no
longer the file the run read (another size or SHA-256, or gone) is refused in one line:
the re-run would silently give other results.  (The scenario file is recorded only: a
re-run reads the scenario from run.json.)
"""
from __future__ import annotations

import copy
import functools
import json
import subprocess
from pathlib import Path
from typing import Any

PROJECT = "hybrid-cache-sim"
ROOT = Path(__file__).resolve().parents[2]       # the project root (a source checkout)
RELATIVE_TO = "project root"

#: scenario fields that name a file, resolved against the scenario's folder at run time
PATH_FIELDS = (("workload", "path"), ("backend", "profile"))


def version() -> str:
    """The installed distribution's version (``pyproject.toml``), ``unknown`` when the
    package runs from a checkout that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(PROJECT)
    except PackageNotFoundError:
        return "unknown"


class GitProbe:
    """``git rev-parse HEAD`` and ``git status`` of the checkout, started at once (two
    background processes), read by ``result``.  ``sim run`` starts one before the
    simulation, so that run.json's commit costs no time after it (~10 ms of the
    critical path between the simulation and the report)."""

    def __init__(self, root: Path = ROOT):
        self._result: tuple[str | None, bool] | None = None
        self._procs: tuple[subprocess.Popen, subprocess.Popen] | None = None
        if not (root / ".git").exists():
            self._result = (None, False)
            return
        try:
            # (--no-optional-locks: git status takes no index.lock to refresh the index,
            # so a status running beside the user's own git commands blocks none of them)
            self._procs = tuple(   # type: ignore[assignment]
                subprocess.Popen(["git", "--no-optional-locks", "-C", str(root), *args],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 stdin=subprocess.DEVNULL, text=True)
                for args in (("rev-parse", "HEAD"),
                             ("status", "--porcelain", "--untracked-files=no")))
        except OSError:
            self._result = (None, False)

    def result(self) -> tuple[str | None, bool]:
        """(commit, dirty) as ``git_commit`` answers (waiting for git if it still runs:
        5 s for the commit, 10 s for the status, else no commit)."""
        if self._result is None:
            head, status = self._procs        # type: ignore[misc]
            try:
                out, _ = head.communicate(timeout=5)
                changed, _ = status.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                for p in (head, status):
                    p.kill()
                    p.communicate()
                self._result = (None, False)
            else:
                self._result = ((None, False) if head.returncode else
                                (out.strip() or None, bool(changed.strip())))
        return self._result

    def close(self) -> None:
        """Reap git if its answer was never read (a run that failed): read as ``result``
        reads it (git is never stopped before its time: a git stopped mid-way can leave
        a lock behind in the user's repository)."""
        self.result()


@functools.lru_cache(maxsize=1)
def git_commit(root: Path = ROOT) -> tuple[str | None, bool]:
    """(commit, dirty) of the checkout the code runs from; (None, False) when it is not a
    git checkout or git is unavailable.  ``dirty``: tracked files differ from the commit."""
    return GitProbe(root).result()


def version_line() -> str:
    """What ``sim --version`` prints."""
    commit, dirty = git_commit()
    extra = f" (git {commit[:12]}{', modified' if dirty else ''})" if commit else ""
    return f"{PROJECT} {version()}{extra}"


def _portable(path: str, base: Path) -> str:
    """``path`` as the scenario at ``base`` resolves it, relative to the project root
    when inside it, else absolute."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = base / p
    p = p.resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return str(p)


def resolved_scenario(sc) -> dict:
    """The scenario mapping as it ran (see the module docstring)."""
    data = copy.deepcopy(sc.raw) if isinstance(sc.raw, dict) else {}
    data["name"] = sc.name
    data["seed"] = sc.seed
    base = Path(sc.path).parent
    for section, key in PATH_FIELDS:
        sect = data.get(section)
        if isinstance(sect, dict) and isinstance(sect.get(key), str):
            sect[key] = _portable(sect[key], base)
    cache = data.get("cache")
    if isinstance(cache, dict):             # old names of cache fields: write the one name
        from sim.cache.config import canonical_key

        data["cache"] = {canonical_key(k) if isinstance(k, str) else k: v
                         for k, v in cache.items()}
    wl = data.get("workload")
    if isinstance(wl, dict):
        from workloads import RENAMED

        for old in RENAMED:                 # an old name cleared by --requests: drop it
            if old in wl and wl[old] is None:
                del wl[old]
    return data


def file_digest(path: str | Path) -> dict | None:
    """``{"bytes", "sha256"}`` of a regular file; None if it cannot be read."""
    import hashlib

    from sim.errors import InputError
    from sim.config.loader import open_input

    h = hashlib.sha256()
    n = 0
    try:
        with open_input(path) as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                n += len(chunk)
                h.update(chunk)
    except (OSError, InputError):
        return None
    return {"bytes": n, "sha256": h.hexdigest()}


def _input_paths(sc) -> dict[str, Path]:
    """The files a scenario's run reads, by what names them: the scenario file, and the
    ``PATH_FIELDS`` it sets (resolved as the run resolves them)."""
    out: dict[str, Path] = {"scenario_file": Path(sc.path)}
    raw = sc.raw if isinstance(sc.raw, dict) else {}
    base = Path(sc.path).parent
    for section, key in PATH_FIELDS:
        sect = raw.get(section)
        if isinstance(sect, dict) and isinstance(sect.get(key), str):
            p = Path(sect[key]).expanduser()
            out[f"{section}.{key}"] = p if p.is_absolute() else base / p
    return out


def input_files(sc) -> dict:
    """run.json's ``inputs``: each file the run read, its size and SHA-256."""
    out = {}
    for field, p in _input_paths(sc).items():
        d = file_digest(p)
        if d is not None:
            out[field] = {"path": _portable(str(p), Path.cwd()), **d}
    return out


def run_record(sc, command: list[str] | None, git: GitProbe | None = None) -> dict:
    """The provenance keys of ``run.json``; ``git``: the commit's probe, started earlier
    (else git runs now)."""
    commit, dirty = git.result() if git is not None else git_commit()
    return {
        "scenario": resolved_scenario(sc),
        "paths_relative_to": RELATIVE_TO,
        "scenario_file": _portable(str(sc.path), Path.cwd()),
        "seed": sc.seed,
        "version": version(),
        "commit": commit,
        "commit_dirty": dirty,
        "command": list(command) if command is not None else None,
        "inputs": input_files(sc),
    }


def is_run_record(path: Path) -> bool:
    """Whether ``path`` is (meant as) a run folder's ``run.json`` rather than a scenario:
    a file named run.json, or a JSON object with a ``scenario`` or ``paths_relative_to``."""
    path = Path(path)
    if path.suffix.lower() != ".json":
        return False
    if path.name == "run.json":
        return True
    from sim.errors import InputError
    from sim.config.loader import read_text

    try:
        data = json.loads(read_text(path))
    except (InputError, ValueError):
        return False
    return isinstance(data, dict) and ("scenario" in data or "paths_relative_to" in data)


def load_run_record(path: Path, overrides: dict | None = None):
    """The scenario a ``run.json`` records, ready to run again (``overrides`` as ``--set``)."""
    from sim.errors import ConfigError
    from sim.config.scenario import ScenarioError, apply_overrides, scenario_from_mapping

    from sim.config.loader import read_text

    path = Path(path)
    text = read_text(path, ScenarioError)      # (a regular file, bounded, UTF-8)
    try:
        data: Any = json.loads(text)
    except ValueError as e:
        raise ScenarioError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("scenario"), dict):
        raise ScenarioError(f"{path}: scenario: missing or not a mapping (a run.json from before "
                            f"run folders recorded their scenario cannot re-run; run the "
                            f"scenario file)")
    mapping = copy.deepcopy(data["scenario"])
    # relative paths in a run record are relative to the project root: make them absolute
    for section, key in PATH_FIELDS:
        sect = mapping.get(section)
        if isinstance(sect, dict) and isinstance(sect.get(key), str):
            p = Path(sect[key]).expanduser()
            sect[key] = str(p if p.is_absolute() else ROOT / p)
    try:
        if overrides:
            mapping = apply_overrides(mapping, overrides)
        sc = scenario_from_mapping(mapping, path)
    except ConfigError as e:
        raise ScenarioError(f"{path}: {e}") from None
    _check_inputs(path, data.get("inputs"), sc)
    return sc


def _check_inputs(path: Path, recorded, sc) -> None:
    """Refuse re-running a run whose trace or profile is no longer the file it read
    (``inputs`` of run.json; a run.json from before it recorded them is not checked, nor
    a field the re-run's ``--set`` points elsewhere)."""
    from sim.config.scenario import ScenarioError

    if not isinstance(recorded, dict):
        return
    for field, p in _input_paths(sc).items():
        rec = recorded.get(field)
        if field == "scenario_file" or not isinstance(rec, dict):
            continue
        if not isinstance(rec.get("path"), str) or not isinstance(rec.get("sha256"), str):
            continue
        was = Path(rec["path"]).expanduser()
        was = was if was.is_absolute() else ROOT / was
        if was.resolve() != p.resolve():
            continue                        # (--set on the re-run: another file, on purpose)
        now = file_digest(p)
        size = f"{rec['bytes']:,}" if isinstance(rec.get("bytes"), int) else "?"
        if now is None:
            raise ScenarioError(f"{path}: {field}: {rec['path']} is gone or unreadable since the "
                                f"run read it ({size} bytes, SHA-256 "
                                f"{rec['sha256'][:12]}...); the re-run cannot be the same run")
        if now["sha256"] != rec["sha256"] or now["bytes"] != rec.get("bytes"):
            raise ScenarioError(f"{path}: {field}: {rec['path']} changed since the run read it "
                                f"({size} -> {now['bytes']:,} bytes, SHA-256 "
                                f"{rec['sha256'][:12]}... -> {now['sha256'][:12]}...); a re-run "
                                "would give other results: restore the file, or run the scenario "
                                "file to run on the new one")


def load_scenario_or_run(path: Path, overrides: dict | None = None):
    """A scenario file, or a run folder's ``run.json`` (re-run exactly)."""
    from sim.config.scenario import load_scenario

    if is_run_record(path):
        return load_run_record(path, overrides)
    return load_scenario(path, overrides)
