"""``sim check``: regression of hit lengths against golden files.

For every case file and scenario it computes each request's hit lengths —
reconciled ``hit``, each group alone (``per_group`` for cases, ``attention``
alone for scenarios) and ``junction`` — and compares them with a golden file,
one line per request, diff-friendly::

    # sim check golden for cases/seed-d3-eagle.yaml
    producer: hit=0 per_group=0,0 junction=0
    consumer: hit=0 per_group=12,16 junction=12  want: hit=12

A ``want:`` marker states the value we expect once a known defect is fixed (as
strict xfail markers do): the check passes while today's value holds and fails
with "fixed — move the marker" the day the wanted value appears.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.errors import InputError
from sim.config.fields import show

KEYS_CASE = ("hit", "per_group", "junction")
KEYS_SCENARIO = ("hit", "attention", "junction")
_LINE = re.compile(r"^(?P<id>[^:\s][^:]*):\s*(?P<vals>[^#]*?)(?:\s+want:\s*(?P<want>.*))?\s*$")


@dataclass
class Finding:
    path: str
    request: str
    key: str
    golden: str
    got: str
    kind: str            # drift | fixed | new | missing


@dataclass
class CheckResult:
    findings: list[Finding] = field(default_factory=list)
    checked: int = 0
    updated: list[str] = field(default_factory=list)


def _fmt(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return ",".join(_fmt(x) for x in v)
    return str(v)


def compute(path: Path) -> tuple[str, dict[str, dict[str, str]]]:
    """Per-request hit lengths of a case file or a scenario (detected by its keys)."""
    from sim.config.loader import load_file

    data = load_file(path, InputError)
    if isinstance(data, dict) and "requests" in data and "config" in data:
        from sim.cache.case import run_case_data
        from sim.commands.case_files import check_case_ids

        check_case_ids(data, path, InputError)

        out = {}
        for r in run_case_data(data, str(path)):
            vals = {k: _fmt(r[k]) for k in KEYS_CASE}
            if r.get("error"):
                vals["error"] = str(r["error"]).split(":")[0]
            out[r["id"]] = vals
        return "case", out
    from sim.commands.run import simulate
    from sim.config.scenario import load_scenario

    sc = load_scenario(path)
    _, rows, _ = simulate(sc)
    return "scenario", {r.request_id: {"hit": str(r.hit_tokens),
                                       "attention": str(r.attention_hit_tokens),
                                       "junction": str(r.junction)}
                        for r in rows}


def parse_golden(text: str, source: str = "<golden>"
                 ) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    out = {}
    lines: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        pairs = [] if m is None else m.group("vals").split() + (m.group("want") or "").split()
        if not m or any("=" not in kv for kv in pairs):
            raise InputError(f"{source}:{lineno}: bad golden line {show(line)} (want "
                             f"'<request>: key=value ...  want: key=value')")
        vals = dict(kv.split("=", 1) for kv in m.group("vals").split())
        want = dict(kv.split("=", 1) for kv in (m.group("want") or "").split())
        rid = m.group("id").strip()
        if rid in out:
            # (the later line would silently stand for both: a wrong first one passes)
            raise InputError(f"{source}:{lineno}: request {show(rid)} has a golden line "
                             f"already (line {lines[rid]}); give each request once")
        for kvs, where in ((m.group("vals"), ""), (m.group("want") or "", "want: ")):
            keys = [kv.split("=", 1)[0] for kv in kvs.split()]
            dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
            if dup is not None:
                raise InputError(f"{source}:{lineno}: {where}key {show(dup)} given twice for "
                                 f"request {show(rid)}")
        out[rid] = (vals, want)
        lines[rid] = lineno
    return out


def render_golden(source: str, values: dict[str, dict[str, str]],
                  wants: dict[str, dict[str, str]]) -> str:
    lines = [f"# sim check golden for {source}: per-request hit lengths (regenerate with "
             f"`sim check {source} --update`)"]
    for rid, vals in values.items():
        line = f"{rid}: " + " ".join(f"{k}={v}" for k, v in vals.items())
        if wants.get(rid):
            line += "  want: " + " ".join(f"{k}={v}" for k, v in wants[rid].items())
        lines.append(line)
    return "\n".join(lines) + "\n"


def golden_path(golden_dir: Path, path: Path, root: Path) -> Path:
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        rel = Path(path.name)
    return golden_dir / (str(rel).replace("/", "__") + ".golden")


def check(paths: list[Path], golden_dir: Path, root: Path, update: bool = False) -> CheckResult:
    """Compare (or with ``update`` rewrite) the goldens of ``paths``.  Checking nothing is
    bad input, not a pass: no paths, or (without ``update``) a golden folder with no
    golden files, is an ``InputError``."""
    from sim.config.loader import read_text

    if not paths:
        raise InputError(f"nothing to check: no case files or scenarios given, and the defaults "
                         f"(cases/*.yaml, scenarios/athena.yaml) are not in {root} (run from "
                         f"the project root or name the files)")
    if not update and not (golden_dir.is_dir() and any(golden_dir.glob("*.golden"))):
        raise InputError(f"{golden_dir}: no golden files to check against (record them with "
                         f"`sim check --update`, or point --golden at the folder holding them)")
    res = CheckResult()
    for path in paths:
        kind, values = compute(path)
        gp = golden_path(golden_dir, path, root)
        source = str(path)
        old = parse_golden(read_text(gp), str(gp)) if gp.exists() else {}
        wants = {rid: w for rid, (_, w) in old.items() if w}
        for rid, vals in values.items():
            res.checked += 1
            if rid not in old:
                res.findings.append(Finding(source, rid, "*", "(none)", " ".join(
                    f"{k}={v}" for k, v in vals.items()), "new"))
                continue
            gold, want = old[rid]
            for key in sorted(set(gold) | set(vals)):
                g, v = gold.get(key, "(none)"), vals.get(key, "(none)")
                if key in want and v == want[key] and v != g:
                    res.findings.append(Finding(source, rid, key, g, v, "fixed"))
                elif g != v:
                    res.findings.append(Finding(source, rid, key, g, v, "drift"))
        for rid in old:
            if rid not in values:
                res.findings.append(Finding(source, rid, "*", "present", "(gone)", "missing"))
        if update:
            # a want marker that today's value satisfies has done its job: drop it
            wants = {rid: {k: w for k, w in want.items() if values.get(rid, {}).get(k) != w}
                     for rid, want in wants.items()}
            text = render_golden(source, values, wants)
            if not gp.exists() or read_text(gp) != text:
                _write_golden(gp, text)
                res.updated.append(str(gp))
    return res


def _write_golden(gp: Path, text: str) -> None:
    """A golden file, whole or not at all (temporary file, then a rename); a folder that
    cannot be written, a full disk: one line naming the file."""
    from sim.rundir.atomic import OutputPathError
    from sim.rundir.atomic_files import atomic_write_text

    try:
        atomic_write_text(gp, text)
    except OutputPathError as e:
        raise InputError(f"{gp}: cannot write the golden file: "
                         f"{str(e).split(': ', 1)[-1]}") from None


#: the differences a failed ``sim check`` lists under its summary (``--all``: every one)
FIRST_DIFFS = 10
STATUS = {"fixed": "fixed - move the marker", "new": "no golden (run --update)",
          "missing": "request gone", "drift": "DRIFT"}


def _int(v: str) -> int | None:
    try:
        return int(v)
    except ValueError:
        return None


def failure_lines(res: CheckResult, update_command: str, show_all: bool = False) -> list[str]:
    """What a failed check prints: a summary (requests changed, per file; hit tokens
    gained and lost; findings by kind), then the first ``FIRST_DIFFS`` differences (every
    one with ``show_all``) as a table, then the ``--update`` hint."""
    findings = res.findings
    changed: dict[str, set[str]] = {}
    for fd in findings:
        changed.setdefault(fd.path, set()).add(fd.request)
    n_changed = sum(len(v) for v in changed.values())
    per_file = ", ".join(f"{p}: {len(v):,}" for p, v in changed.items())
    lines = [f"sim check FAILED: {n_changed:,} of {res.checked:,} requests changed ({per_file})"]
    gained = lost = up = down = 0
    for fd in findings:
        if fd.key != "hit":
            continue
        a, b = _int(fd.golden), _int(fd.got)
        if a is None or b is None:
            continue
        if b > a:
            gained, up = gained + b - a, up + 1
        elif b < a:
            lost, down = lost + a - b, down + 1
    lines.append(f"  hit tokens: {gained:,} gained ({up:,} request(s)), {lost:,} lost "
                 f"({down:,} request(s)); net {gained - lost:+,}")
    kinds: dict[str, int] = {}
    for fd in findings:
        kinds[fd.kind] = kinds.get(fd.kind, 0) + 1
    lines.append(f"  {len(findings):,} difference(s): " + ", ".join(
        f"{n:,} {STATUS[k]}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
    shown = findings if show_all else findings[:FIRST_DIFFS]
    lines.append(f"{'every' if len(shown) == len(findings) else f'first {len(shown)} of'} "
                 f"{len(findings):,} difference(s):")
    rows = [("file", "request", "key", "golden -> now", "status")] + [
        (fd.path, fd.request, fd.key, f"{fd.golden} -> {fd.got}", STATUS[fd.kind])
        for fd in shown]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    if len(shown) < len(findings):
        lines.append(f"  ... {len(findings) - len(shown):,} more (--all lists every one)")
    lines.append(f"If the change is intended, rewrite the goldens with `{update_command}` "
                 f"and review their diff.")
    return lines

