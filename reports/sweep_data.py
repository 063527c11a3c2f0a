"""A sweep folder as data: its points, their axis values and their requests.

Everything here reads files by column name (``points.csv``, each point's
``requests.csv``, the ``name`` of the copied ``sweep.yaml``) and never reruns or
builds a scenario, so ``sim report`` can redraw a sweep from what is stored.  It also
holds the sweep's analysis that figures and tables share: the Reuse-Pareto frontier,
the flag off/on pairs, the labels that name a point by its axis values, and the
grouping of points whose results are identical (drawn once, and said so).
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reports.style import GIB, finite
from sim.rundir.stats import percentile

BASE_COLUMNS = ("point", "label", "status", "error")
# summary.json keys, in the order sim run writes them: the first of these in points.csv
# ends the axis columns.
SUMMARY_KEYS = ("scenario", "model", "policy", "block_size", "hash_block_size", "num_gpu_blocks",
                "requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
                "lost_tokens", "lost_token_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "output_tokens", "makespan_s", "throughput_tok_s",
                "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions", "steps",
                "wall_s", "sim_requests_per_s")
STRING_KEYS = {"scenario", "model", "policy"}
TRUE, FALSE = "true", "false"
# the flag a sweep of several boolean axes is compared off vs on by, when it is one of them
JUNCTION_FLAG = "cache.enable_mamba_shared_prefix_checkpoint"
# the requests.csv columns the report reads
REQUEST_FIELDS = ("prompt_tokens", "lost_tokens", "ttft_s", "mamba_states_written")
# short names for long axis fields in figure labels (the key and report.md give the full one)
AXIS_ALIASES = {"enable_mamba_shared_prefix_checkpoint": "checkpoint",
                "disable_lookahead_block_hashes": "disable_lookahead",
                "prefix_cache_retention_interval": "retention"}


def natural_key(s: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", s) if t]


def short_axis(a: str) -> str:
    """The field name of a dotted axis (``cache.hash_block_size`` -> ``hash_block_size``)."""
    return a.rsplit(".", 1)[-1]


def axis_value(a: str, v: str) -> str:
    """The text a figure prints for axis ``a``'s value ``v``: a byte count (an axis named
    ``*_bytes``) in GiB (``0.5 GiB``, not ``536870912``); any other value as stored."""
    if short_axis(a).endswith("_bytes") and re.fullmatch(r"\d+", v or ""):
        return f"{int(v) / GIB:.4g} GiB"
    return v


def axis_name(a: str) -> str:
    """The name a figure prints for an axis: its field name, shortened when very long."""
    return AXIS_ALIASES.get(short_axis(a), short_axis(a))


@dataclass
class Requests:
    """The requests.csv columns the report uses, as arrays."""

    prompt_tokens: np.ndarray
    lost_tokens: np.ndarray
    ttft_s: np.ndarray
    mamba_states_written: np.ndarray

    def __len__(self) -> int:
        return len(self.ttft_s)


@dataclass
class Point:
    id: str
    label: str
    status: str
    error: str
    axes: dict[str, str]
    metrics: dict[str, object]
    requests: Requests | None = None
    note: str = ""  # why an ok point is not plotted, if it is not

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def plotted(self) -> bool:
        """In the figures: ok, with the memory and hit metrics and its requests.csv."""
        return (self.ok and self.requests is not None
                and finite(self.metrics.get("mamba_state_bytes_peak"))
                and finite(self.metrics.get("token_hit_rate")))

    def m(self, key: str) -> float:
        v = self.metrics.get(key)
        return float(v) if isinstance(v, (int, float)) else math.nan

    @property
    def mamba_gib(self) -> float:
        return self.m("mamba_state_bytes_peak") / GIB

    @property
    def hit_pct(self) -> float:
        return self.reuse * 100.0

    @property
    def reuse(self) -> float:
        """Prompt tokens reused, as a share: the GPU prefix-cache hit, plus what the CPU
        tier loaded where the run had one (``cpu_token_hit_rate``)."""
        cpu = self.metrics.get("cpu_token_hit_rate")
        return self.m("token_hit_rate") + (float(cpu) if isinstance(cpu, (int, float)) else 0.0)

    @property
    def cache_bytes(self) -> float:
        """Cache memory provisioned per GPU: the GPU pool, plus the CPU tier's host pool
        (its share per GPU, ``host_pool_bytes``) where the run had one."""
        host = self.metrics.get("host_pool_bytes")
        return self.m("pool_bytes") + (float(host) if isinstance(host, (int, float)) else 0.0)

    @property
    def states_per_request(self) -> float:
        if self.requests is None or len(self.requests) == 0:
            return math.nan
        return float(np.mean(self.requests.mamba_states_written))

    def ttft(self, key: str) -> float:
        """ttft_mean_s / ttft_p50_s / ... from points.csv, else from requests.csv."""
        v = self.m(key)
        if finite(v) or self.requests is None or len(self.requests) == 0:
            return v
        if key == "ttft_mean_s":
            return float(np.mean(self.requests.ttft_s))
        q = {"ttft_p50_s": 50, "ttft_p90_s": 90, "ttft_p99_s": 99}[key]
        return percentile(self.requests.ttft_s, q)


@dataclass
class Sweep:
    points: list[Point]
    axes: list[str]
    boolean_axes: list[str] = field(default_factory=list)
    name: str = "sweep"

    @property
    def flag_axis(self) -> str | None:
        """The boolean axis the report compares off vs on: the only one, or among several
        the junction checkpoint flag (the comparison this project exists for; the other
        boolean axes then group the pairs like any other axis); None otherwise."""
        if len(self.boolean_axes) == 1:
            return self.boolean_axes[0]
        from sim.cache.config import canonical_path

        for a in self.boolean_axes:
            if canonical_path(a) == JUNCTION_FLAG:
                return a
        return None

    @property
    def plotted(self) -> list[Point]:
        return [p for p in self.points if p.plotted]

    @property
    def varying_axes(self) -> list[str]:
        """The axes whose value differs between points: the ones that tell points apart."""
        return [a for a in self.axes if len({p.axes[a] for p in self.points}) > 1]

    def point_label(self, p: Point, sep: str = ", ") -> str:
        """The point by the axis values that differ across the sweep (its id when none do)."""
        text = sep.join(f"{axis_name(a)}={axis_value(a, p.axes[a])}"
                        for a in self.varying_axes)
        return text or p.id

    def group_label(self, group: list[Point], sep: str = ", ") -> str:
        """Points with identical results, by the axis values they share; the axes that
        vary inside the group evidently do not matter to what is drawn."""
        const = [a for a in self.varying_axes if len({p.axes[a] for p in group}) == 1]
        text = sep.join(f"{axis_name(a)}={axis_value(a, group[0].axes[a])}" for a in const)
        if len(group) == 1:
            return text or group[0].id
        return text or "every setting"

    def value_table(self, points: list[Point]) -> tuple[str, list[str]]:
        """A monospace key: a header (``point`` and the varying axes' names) and one
        aligned row of values per point, in the order given."""
        axes = self.varying_axes
        head = ["point"] + [axis_name(a) for a in axes]
        rows = [[p.id] + [axis_value(a, p.axes[a]) for a in axes] for p in points]
        width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

        def line(r):        # every line the same width: they align left or right
            return "  ".join(v.ljust(w) for v, w in zip(r, width))

        return line(head), [line(r) for r in rows]

    def aliases(self, shown: str | None = None) -> list[str]:
        """``short = full`` for every varying axis printed under a shortened name (only
        those named in ``shown``, the drawn labels, when given)."""
        return [f"{axis_name(a)} = {a}" for a in self.varying_axes
                if axis_name(a) != short_axis(a)
                and (shown is None or f"{axis_name(a)}=" in shown)]


def group_ids(group: list[Point]) -> str:
    return " = ".join(p.id for p in group)


def identical_groups(points: list[Point], key: Callable[[Point], object]) -> list[list[Point]]:
    """Points with equal ``key`` (e.g. the bytes of their TTFT column) in one group each,
    groups and members in point-id order."""
    by: dict[object, list[Point]] = {}
    for p in sorted(points, key=lambda p: natural_key(p.id)):
        by.setdefault(key(p), []).append(p)
    return sorted(by.values(), key=lambda g: natural_key(g[0].id))


def merge_note(groups: list[list[Point]], what: str = "curves") -> str:
    """What a caption says when identical results are drawn once ("" when none are)."""
    n = sum(len(g) for g in groups)
    if n == len(groups):
        return ""
    return f"Identical {what} are drawn once ({n} points, {len(groups)} distinct)."


# --------------------------------------------------------------------------- loading


def _parse_number(s: str):
    s = (s or "").strip()
    if not s:
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def _read_requests(path: Path) -> Requests:
    from sim.config.loader import open_input

    cols: dict[str, list[float]] = {k: [] for k in REQUEST_FIELDS}
    with open_input(path, text=True, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("rejected"):
                continue        # refused on arrival: no measurements
            for k, acc in cols.items():
                acc.append(float(row[k]))
    return Requests(**{k: np.asarray(v, dtype=float) for k, v in cols.items()})


def _sweep_name(sweep_dir: Path) -> str:
    """The ``name`` of the sweep file copied into the folder; else the folder's name."""
    from sim.errors import InputError
    from sim.config.loader import load_file

    path = sweep_dir / "sweep.yaml"
    if path.is_file():
        try:
            data = load_file(path, fmt="yaml")
        except InputError:
            data = None     # the report reads results; a broken copy only loses the name
        if isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"].strip():
            return data["name"].strip()
    return sweep_dir.resolve().name


def load_sweep(sweep_dir: Path) -> Sweep:
    """Read points.csv and every ok point's requests.csv."""
    sweep_dir = Path(sweep_dir)
    from sim.errors import InputError
    from sim.config.loader import read_text

    # unreadable / not UTF-8 / not a regular file: one line (a table of at most
    # MAX_POINTS rows: a larger limit than a configuration file's)
    text = read_text(sweep_dir / "points.csv", limit=64 * 2**20)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = list(reader.fieldnames or [])
        rows = list(reader)
    except csv.Error as e:
        raise InputError(f"{sweep_dir / 'points.csv'}: bad CSV ({e})") from None
    missing = [c for c in ("point", "status") if c not in header]
    if missing:
        raise InputError(f"{sweep_dir / 'points.csv'}: missing column(s) {', '.join(missing)}")
    # axis columns: after the fixed columns, up to the first summary metric
    axes = []
    for c in header:
        if c in BASE_COLUMNS:
            continue
        if c in SUMMARY_KEYS:
            break
        axes.append(c)
    metric_cols = [c for c in header if c not in BASE_COLUMNS and c not in axes]
    points = []
    for row in rows:
        pid = (row.get("point") or "").strip()
        metrics = {}
        for c in metric_cols:
            raw = (row.get(c) or "").strip()
            metrics[c] = raw if c in STRING_KEYS else _parse_number(raw)
        p = Point(id=pid, label=(row.get("label") or "").strip(),
                  status=(row.get("status") or "").strip().lower(),
                  error=" ".join((row.get("error") or "").split()),
                  axes={a: (row.get(a) or "").strip() for a in axes}, metrics=metrics)
        if p.ok:
            req = sweep_dir / "points" / pid / "requests.csv"
            try:
                if not req.exists():
                    raise FileNotFoundError(req)
                p.requests = _read_requests(req)
            except FileNotFoundError:
                p.note = "requests.csv missing"
            except InputError as e:          # (not a regular file, cannot read ...)
                p.note = f"requests.csv unreadable ({str(e).rsplit(': ', 1)[-1]})"
            except (KeyError, ValueError) as e:
                p.note = f"requests.csv unreadable ({type(e).__name__}: {e})"
            if not p.note and not p.plotted:
                p.note = "memory or hit rate missing in points.csv"
        points.append(p)
    points.sort(key=lambda p: natural_key(p.id))
    # a boolean axis takes both values (a single-valued one pairs nothing)
    booleans = [a for a in axes if {p.axes[a].lower() for p in points} == {TRUE, FALSE}]
    return Sweep(points=points, axes=axes, boolean_axes=booleans, name=_sweep_name(sweep_dir))


# --------------------------------------------------------------------------- analysis


def pareto_frontier(items) -> list[str]:
    """Ids of the non-dominated items of ``(id, memory, hit)``: minimise memory,
    maximise hit. An item is dominated when another has memory <= and hit >= with at
    least one strict. Items with a non-finite value are ignored; equal items both stay.
    Returned in order of memory ascending (then hit descending, then id)."""
    pts = [(i, float(m), float(h)) for i, m, h in items
           if math.isfinite(float(m)) and math.isfinite(float(h))]
    front = []
    for i, m, h in pts:
        if not any(m2 <= m and h2 >= h and (m2 < m or h2 > h) for _, m2, h2 in pts):
            front.append((m, -h, natural_key(i), i))
    return [t[-1] for t in sorted(front)]


def dominators(items, target: str) -> list[str]:
    """Ids of the items that dominate ``target`` (see ``pareto_frontier``)."""
    d = {i: (float(m), float(h)) for i, m, h in items}
    m, h = d[target]
    out = [i for i, (m2, h2) in d.items()
           if i != target and m2 <= m and h2 >= h and (m2 < m or h2 > h)]
    return sorted(out, key=natural_key)


def provisioned(points: list[Point]) -> bool:
    """Whether the Pareto's memory is what each point provisions (``pool_bytes``): when
    every point carries it and they differ in it (a sweep of budgets).  Else peak
    Mamba-state memory: where every point provisions the same pool (a sweep of cache
    switches) it would stack them on one line; an older sweep folder has no pool_bytes."""
    pools = {p.cache_bytes for p in points}
    return len(pools) > 1 and all(finite(b) for b in pools)


def pareto_items(points: list[Point]):
    """``(id, memory, hit)`` of each point, memory as ``provisioned`` decides (the
    figure, the frontier tables and report_pareto.csv read the same)."""
    if provisioned(points):
        return [(p.id, p.cache_bytes, p.reuse) for p in points]
    return [(p.id, p.m("mamba_state_bytes_peak"), p.reuse) for p in points]


def by_memory(points: list[Point]) -> list[Point]:
    if provisioned(points):
        return sorted(points, key=lambda p: (p.cache_bytes, -p.hit_pct, natural_key(p.id)))
    return sorted(points, key=lambda p: (p.mamba_gib, -p.hit_pct, natural_key(p.id)))


@dataclass
class FlagPair:
    others: dict[str, str]
    off: Point | None
    on: Point | None

    @property
    def complete(self) -> bool:
        return (self.off is not None and self.on is not None
                and self.off.plotted and self.on.plotted)


def flag_pairs(sweep: Sweep) -> tuple[str, list[FlagPair]] | None:
    """The flag axis's (``Sweep.flag_axis``) off/on points per combination of the others."""
    flag = sweep.flag_axis
    if flag is None:
        return None
    others = [a for a in sweep.axes if a != flag]
    groups: dict[tuple, FlagPair] = {}
    for p in sweep.points:
        key = tuple(p.axes[a] for a in others)
        g = groups.setdefault(key, FlagPair(dict(zip(others, key)), None, None))
        side = "on" if p.axes[flag].lower() == TRUE else "off"
        if getattr(g, side) is None:  # first by point id wins
            setattr(g, side, p)
    order = sorted(groups, key=lambda k: [natural_key(v) for v in k])
    return flag, [groups[k] for k in order]


def lost_reuse_stats(p: Point) -> dict:
    lost = p.requests.lost_tokens if p.requests is not None else np.zeros(0)
    nz = lost[lost > 0]
    return {"requests": len(lost), "with_loss": int(len(nz)), "total": float(nz.sum()),
            "mean": float(nz.mean()) if len(nz) else math.nan,
            "max": float(nz.max()) if len(nz) else math.nan}
