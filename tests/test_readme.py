"""Every command shown in README.md, docs/*.md and the folders' READMEs runs, and prints its sample.

Conventions for these pages (what this test reads; ``READMES`` lists them):

* A fenced ```` ```text ```` block holds commands and what they print: a line ``$ CMD`` is a
  command; the lines after it, up to the next ``$`` line, are its sample output (stdout and
  stderr together, as a terminal shows them).  A trailing ``# exit N`` on the command line
  states its exit status (default 0).
* A fenced ```` ```bash ```` block holds commands whose output is not shown: each command line
  (``\\`` continues it, ``&&`` chains commands, ``# ...`` is a comment) must exit 0, or the
  ``# exit N`` it states.  Set-up commands (``python3 -m venv``, ``. .venv/bin/activate``,
  ``pip install``) and ``python -m pytest`` (this suite) are not run: ``SETUP``.
* A sample line that is just ``...`` matches any number of lines; ``...`` inside a line
  matches any text.  Two kinds of field are masked, whatever the sample shows there:
  ``WALL_CLOCK`` (how fast this machine simulated) and ``MACHINE_FLOAT`` (float32 rounding of
  this machine's torch kernels: which request ``sim verify`` finds worst, and its error).
* A file a block writes under ``tests/fixtures/`` must equal the committed file.
* ``<!-- not run by tests: REASON -->`` on the line just before a block keeps the block from
  running.  Such blocks must be listed in ``NOT_RUN`` (so they stay rare and visible).
* ``sim verify``, ``sim calibrate`` and ``bench/gpu_check.py`` need torch, ``--executor ray``
  needs ray: a block with such a command is skipped, with the reason, where that package is
  not installed.

Commands run from a temporary folder holding copies of ``scenarios/``, ``cases/``,
``checks/``, ``profiles/`` and ``bench/``, a link to ``data/`` (read only) and an empty
``tests/fixtures/``, so that ``runs/`` and every other output land there and nothing is
written into the checkout.  Each block gets a fresh folder; its commands run in order there.
"""
from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "workloads/README.md", "sim/cache/README.md", "sim/engine/README.md",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
COPIED = ("scenarios", "cases", "checks", "profiles", "bench")
LINKED = ("data",)

SETUP = ("python3 -m venv", ". .venv/bin/activate", "source .venv/bin/activate", "pip install",
         "python -m pytest")
WALL_CLOCK = (r"\([\d,]+ req/s simulated\)",)
MACHINE_FLOAT = (r"worst: r\d+(?: prefill| decode)? \(prompt \d+, resumed at \d+\): "
                 r"max abs error \d\.\d+e[+-]\d+",)
# (readme, first command of the block): why it is not run.  Keep it short.
NOT_RUN: dict[tuple[str, str], str] = {}
NOT_RUN_MARK = re.compile(r"<!--\s*not run by tests:\s*(.+?)\s*-->")
EXIT_MARK = re.compile(r"#\s*exit\s+(\d+)\s*$")
NEEDS = (("torch", re.compile(r"^sim (verify|calibrate)\b|bench/gpu_check\.py")),
         ("ray", re.compile(r"--executor[ =]ray\b")))
TIMEOUT_S = 300


@dataclass
class Command:
    line: str                 # as written (comment included)
    exit: int = 0
    sample: list[str] | None = None   # None: output not checked


@dataclass
class Block:
    readme: str
    lineno: int
    lang: str
    commands: list[Command] = field(default_factory=list)
    not_run: str | None = None

    @property
    def id(self) -> str:
        first = self.commands[0].line if self.commands else "(empty)"
        return f"{self.readme}:{self.lineno} {first[:60]}"


def _exit_of(cmd: str) -> int:
    m = EXIT_MARK.search(cmd)
    return int(m.group(1)) if m else 0


def _strip_comment(cmd: str) -> str:
    """Drop a trailing shell comment (README commands quote no ``#``)."""
    return re.sub(r"(^|\s)#.*$", "", cmd).rstrip()


def parse(readme: str) -> list[Block]:
    lines = (ROOT / readme).read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = lines[i + 1:j]
        prev = next((ln for ln in reversed(lines[:start]) if ln.strip()), "")
        mark = NOT_RUN_MARK.search(prev)
        block = Block(readme, start + 1, lang, not_run=mark.group(1) if mark else None)
        if lang == "text" and any(ln.startswith("$ ") for ln in body):
            for ln in body:
                if ln.startswith("$ "):
                    block.commands.append(Command(ln[2:], _exit_of(ln), []))
                elif block.commands:
                    block.commands[-1].sample.append(ln)
            blocks.append(block)
        elif lang == "bash":
            joined, cur = [], ""
            for ln in body:
                cur += ln[:-1] + " " if ln.endswith("\\") else ln
                if not ln.endswith("\\"):
                    joined.append(cur)
                    cur = ""
            for ln in joined:
                if not ln.strip() or ln.lstrip().startswith("#"):
                    continue
                code, want = _exit_of(ln), None
                for part in _strip_comment(ln).split("&&"):
                    part = " ".join(part.split())
                    if part.startswith(SETUP):
                        continue
                    block.commands.append(Command(part, code, want))
            if block.commands:
                blocks.append(block)
        i = j + 1
    return blocks


BLOCKS = [b for r in READMES for b in parse(r)]


def _line_regex(sample: str) -> str:
    masks = WALL_CLOCK + MACHINE_FLOAT
    pieces = re.split("(" + "|".join(f"(?:{m})" for m in masks) + r"|\.\.\.)", sample)
    out = []
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            out.append(re.escape(piece))
        elif piece == "...":
            out.append(r"[^\n]*?")
        else:
            out.append(next(m for m in masks if re.fullmatch(m, piece)))
    return "".join(out)


def sample_regex(sample: list[str]) -> re.Pattern:
    lines = [ln.rstrip() for ln in sample]
    while lines and not lines[-1]:
        lines.pop()
    rx = ""
    for k, ln in enumerate(lines):
        last = k == len(lines) - 1
        if ln.strip() == "...":
            rx += r"[\s\S]*" if last else r"(?:[^\n]*\n)*?"
        else:
            rx += _line_regex(ln) + ("" if last else "\n")
    return re.compile(rx)


def normalise(text: str) -> str:
    return "\n".join(ln.rstrip() for ln in text.rstrip().splitlines())


def workspace(tmp_path: Path) -> Path:
    for d in COPIED:
        shutil.copytree(ROOT / d, tmp_path / d)
    for d in LINKED:
        (tmp_path / d).symlink_to(ROOT / d)
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    return tmp_path


def run(cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"        # stdout and stderr interleaved as on a terminal
    env.pop("HCS_TEST_PAUSE_WRITE", None)
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block(block: Block, tmp_path):
    key = (block.readme, block.commands[0].line)
    if block.not_run is not None:
        assert key in NOT_RUN, (f"{block.id}: marked 'not run by tests' but not listed in "
                                f"NOT_RUN")
        pytest.skip(f"not run by tests: {block.not_run}")
    for pkg, rx in NEEDS:
        if any(rx.search(c.line) for c in block.commands) \
                and importlib.util.find_spec(pkg) is None:
            pytest.skip(f"{pkg} is not installed")
    ws = workspace(tmp_path)
    for c in block.commands:
        p = run(c.line, ws)
        out = normalise(p.stdout)
        assert p.returncode == c.exit, (f"{block.readme}:{block.lineno}: `{c.line}` exited "
                                        f"{p.returncode}, README says {c.exit}:\n{out}")
        if c.sample is None:
            continue
        want = sample_regex(c.sample)
        if not want.fullmatch(out):
            diff = "\n".join(difflib.unified_diff(
                [ln.rstrip() for ln in c.sample], out.splitlines(), "README sample",
                "printed today", lineterm=""))
            pytest.fail(f"{block.readme}:{block.lineno}: `{c.line}` printed something else "
                        f"than its sample (masked: {WALL_CLOCK + MACHINE_FLOAT}):\n{diff}")
    # files a block writes under tests/fixtures/ are the committed fixtures ("cut with it")
    for f in sorted((ws / "tests" / "fixtures").rglob("*")):
        if f.is_file():
            rel = f.relative_to(ws)
            assert f.read_bytes() == (ROOT / rel).read_bytes(), \
                f"{block.readme}:{block.lineno}: {rel} differs from the committed file"


def test_every_not_run_entry_is_in_a_readme():
    marked = {(b.readme, b.commands[0].line) for b in BLOCKS if b.not_run is not None}
    assert set(NOT_RUN) == marked


def test_readme_commands_found():
    """The parser still sees the README's commands (a guard against a silent zero)."""
    lines = [c.line for b in BLOCKS for c in b.commands]
    assert any(ln.startswith("sim run scenarios/athena.yaml") for ln in lines)
    assert any(ln.startswith("sim verify") for ln in lines)
    assert any(ln.startswith("sim sweep") for ln in lines)


def test_setup_is_two_commands():
    """The README opens with exactly two set-up commands: install and replay, and the tests."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M).group(1).strip().splitlines()
    assert len(first) == 2, first
    assert first[0].startswith("python3 -m venv .venv") and 'pip install -e ".[test]"' in first[0]
    assert first[0].endswith("sim run scenarios/athena.yaml")
    assert first[1] == "python -m pytest"



def test_output_files_documented(tmp_path):
    """docs/run-folder.md names every file, column and field a run writes."""
    out = tmp_path / "run"
    p = run(f"sim run scenarios/athena-tiny.yaml --quiet --out {out}", ROOT)
    assert p.returncode == 0, p.stdout
    section = (ROOT / "docs" / "run-folder.md").read_text()
    names = [f.name for f in out.iterdir()]
    names += (out / "requests.csv").read_text().splitlines()[0].split(",")
    for f in ("summary.json", "run.json"):
        names += list(json.loads((out / f).read_text()))
    missing = [n for n in names if f"`{n}`" not in section]
    assert not missing, f"docs/run-folder.md does not name: {missing}"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    fence = False
    for ln in path.read_text().splitlines():
        if ln.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.+)$", ln)
        if m:
            a = _anchor(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
    return {a if n == 0 else f"{a}-{n}" for a, count in seen.items() for n in range(count)}


def test_relative_links_resolve():
    """Every relative link of README.md and docs/ names a file that exists, and an anchor it has."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *(ROOT / r for r in READMES if "/" in r and not r.startswith("docs/"))]
    bad = []
    for page in pages:
        if not page.exists():
            continue
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):          # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
