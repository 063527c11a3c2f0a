"""``sim explain``'s two outputs: plain words, and a stable dict for tools (``--json``).

The dict (``SCHEMA`` 1; keys are only ever added):

* ``schema`` 1; ``request``; ``source`` ``{"kind": "run" | "case", "path"}``;
  ``prompt_tokens``; ``hit`` (the reconciled hit at its first admission, null when there
  was no lookup); ``time_s`` (the lookup's simulated time; null for a case file);
  ``refused`` / ``error`` (null, or why there was no lookup / vLLM raises in it).
* ``cache``: ``vllm`` (vLLM's rules), ``ideal`` (cache.policy ideal) or ``off`` (none).
* ``limits``: ``max_hit`` (prompt - 1), ``hashed_tokens`` (what its keys cover: lookahead
  hashes hold the last tokens back), ``hash_unit``, ``align`` (the grid a hit lands on),
  ``ceiling`` (the longest hit the prompt allows).
* ``eagle``: ``drop`` (the legacy EAGLE drop is on), ``lookahead_tokens``.
* ``groups``: per KV-cache group ``group``, ``kind``, ``block_size``, ``alone`` (its hit
  looked up alone, EAGLE drop included), ``without_drop`` (an EAGLE-drop attention group:
  before the drop; else null), ``capped`` (its hit asked for at most the shortest group's
  reach), ``stop`` (full attention: ``{"position", "reason"}`` of the first block it missed,
  reason ``prompt_end | evicted | never_computed | in_flight | not_cached``, with
  ``evicted_by`` and ``evicted_at_s`` when evicted, ``by`` when in flight); ``per_group_error`` (vLLM's per-group probe raised).
* ``capped_by``: the group ids whose lookup set the hit ([] when the prompt allows no more).
* ``junction``: ``position`` (vLLM's shared_prefix_boundary; 0 none), ``flag`` (the
  setting), ``applies`` (the flag has an effect on this layout: EAGLE groups, partial
  hits, no multi-module MTP).
* ``mamba`` (null without a Mamba group): ``group``, ``block_size``, ``grid``, ``states``
  (this prefix's cached state positions), ``reach`` (what attention reached), ``nearest``
  (the state nearest at or below it; 0 none), ``gap_counts`` (reason -> positions on the
  grid in (nearest, reach] without a state), ``gaps`` (the first ``GAPS_SHOWN`` of them from
  the top: ``position``, ``reason`` one of ``evicted | never_computed | in_flight |
  align_grid | retention | no_chunk_end``, ``evicted_by``, ``evicted_at_s``).
* ``computed``: ``tokens`` of this prefix some earlier request computed, ``by`` which;
  ``in_flight``: tokens of it a request still computing its prompt will reach, ``in_flight_by``.
* ``settings``: the three switches as they ran; ``counterfactuals``: per what-if ``name``
  (``junction_flag | retention | hash_unit``), ``setting``, ``was``, ``value``, ``hit``,
  ``change`` (hit - this hit), ``note``.
"""
from __future__ import annotations

from sim.explain.facts import REASONS, Facts

SCHEMA = 1
GAPS_SHOWN = 32

_STOP_WORDS = {"prompt_end": "the prompt ends there",
               "never_computed": "no earlier request computed it",
               "not_cached": "computed, but not cached"}


def _s(ns: int | None) -> float | None:
    return None if ns is None else round(ns * 1e-9, 6)


def as_dict(request: str, kind: str, path: str, lookup, whatifs) -> dict:
    """The documented dict (module docstring) of one explanation."""
    f: Facts | None = lookup.facts
    out: dict = {"schema": SCHEMA, "request": request, "source": {"kind": kind, "path": path},
                 "prompt_tokens": f.prompt_tokens if f else None, "hit": lookup.hit,
                 "time_s": _s(f.time_ns) if f else None, "refused": lookup.refused,
                 "error": lookup.error}
    if f is None:
        return out
    from sim.explain.facts import ceiling

    out["cache"] = f.cache
    out["limits"] = {"max_hit": f.max_hit, "hashed_tokens": f.hashed_tokens,
                     "hash_unit": f.hash_unit, "align": f.align, "ceiling": ceiling(f)}
    out["eagle"] = {"drop": f.eagle_drop, "lookahead_tokens": f.lookahead}
    out["groups"] = [{"group": g.group, "kind": g.kind, "block_size": g.block_size,
                      "alone": g.alone, "without_drop": g.without_drop, "capped": g.capped,
                      "stop": _stop(g.stop)} for g in f.groups]
    out["per_group_error"] = f.per_group_error
    out["capped_by"] = f.capped_by
    out["junction"] = {"position": f.junction,
                       "flag": f.settings.get("enable_mamba_shared_prefix_checkpoint"),
                       "applies": f.junction_applies}
    m = f.mamba
    out["mamba"] = None if m is None else {
        "group": m.group, "block_size": m.block_size, "grid": m.grid, "states": m.states,
        "reach": m.reach, "nearest": m.nearest, "gap_counts": gap_counts(m.gaps),
        "gaps": [{"position": g.position, "reason": g.reason, "evicted_by": g.evicted_by,
                  "evicted_at_s": _s(g.evicted_at_ns)} for g in m.gaps[:GAPS_SHOWN]]}
    out["computed"] = {"tokens": f.computed, "by": f.computed_by, "in_flight": f.in_flight,
                       "in_flight_by": f.in_flight_by}
    out["settings"] = {k: v for k, v in f.settings.items() if k != "scheduler_block_size"}
    out["counterfactuals"] = [{"name": w.name, "setting": w.setting, "was": w.was,
                               "value": w.value, "hit": w.hit,
                               "change": None if w.hit is None else w.hit - f.hit,
                               "note": w.note} for w in whatifs]
    return out


def _stop(stop: dict | None) -> dict | None:
    if stop is None:
        return None
    d = dict(stop)
    if "evicted_at_ns" in d:
        d["evicted_at_s"] = _s(d.pop("evicted_at_ns"))
    return d


def gap_counts(gaps) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in gaps:
        out[g.reason] = out.get(g.reason, 0) + 1
    return out


def _evicted(by: str | None, at_s: float | None) -> str:
    return f"evicted by {by}" + (f" at {at_s:.3f} s" if at_s is not None else "")


def text(d: dict) -> str:
    """The dict in plain words (a few lines)."""
    src = d["source"]["path"]
    head = f"{d['request']} ({src})"
    if d["refused"]:
        return f"{head}: never looked up: refused on arrival: {d['refused']}"
    if d["error"]:
        return f"{head}: no hit: {d['error']}"
    when = f" at {d['time_s']:.3f} s" if d["time_s"] is not None else ""
    lines = [f"{head}: prompt {d['prompt_tokens']} tokens, reused {d['hit']}{when}"]
    lim = d["limits"]
    if d["eagle"]["lookahead_tokens"]:
        more = _n(d["eagle"]["lookahead_tokens"], "more token")
        lines.append(f"  lookahead hashes: each key covers {more}, so its keys reach "
                     f"{lim['hashed_tokens']} of {d['prompt_tokens']}")
    for g in _runs(d["groups"]):
        lines.append("  " + _group_line(g))
    if d["per_group_error"]:
        lines.append(f"  (vLLM's per-group probe raises here: {d['per_group_error']})")
    lines.append("  " + _cap_line(d))
    m = d["mamba"]
    if m is not None:
        lines.append("  " + _mamba_line(m, d))
    j = d["junction"]
    if j["position"]:
        lines.append(f"  junction {j['position']}: the cached attention prefix goes on past the "
                     f"hit to there; junction flag {'on' if j['flag'] else 'off'}"
                     + ("" if j["applies"] else " (it has no effect on this layout)"))
    if d["counterfactuals"]:
        lines.append("  re-simulated with one setting changed:")
        for w in d["counterfactuals"]:
            if w["hit"] is None:
                got = w["note"]
            else:
                ch = w["change"]
                got = f"hit {w['hit']} ({'same' if ch == 0 else f'{ch:+d}'})"
            lines.append(f"    {w['setting']} {_value(w['value'])}: {got}")
    if d.get("fleet"):
        lines += _fleet_lines(d)
    return "\n".join(lines)


def _fleet_lines(d: dict) -> list[str]:
    """Where the router sent the request, what it believed, where else the prefix lived."""
    f = d["fleet"]
    out = [f"  fleet: the {f['router']} router sent it to replica {f['replica']} of "
           f"{f['replicas']}" + (f", believing it would reuse {f['routed_hit_tokens']}"
                                 if f.get("routed_hit_tokens") is not None else "")]
    if f.get("best_hit_tokens") is None:
        out.append("  (where else the prefix lived at its arrival: run with "
                   "cluster.hindsight: true)")
        return out
    here = f.get("arrival_hit_tokens")
    out.append(f"  at its arrival replica {f['replica']} held {here} in every group; the best, "
               f"replica {f['best_replica']}, held {f['best_hit_tokens']}"
               + (f": {f['routed_away_tokens']} tokens routed away"
                  if f.get("routed_away_tokens") else ""))
    return out


def _value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _runs(groups: list[dict]) -> list[dict]:
    """Consecutive groups that saw the same thing, as one (``label``: group 5 full, groups
    0-4 mamba): Nemotron-H's six identical Mamba groups make one line."""
    out: list[dict] = []
    same = ("kind", "block_size", "alone", "without_drop", "capped", "stop")
    for g in groups:
        if out and all(out[-1][k] == g[k] for k in same):
            out[-1]["last"] = g["group"]
        else:
            out.append({**g, "last": g["group"]})
    for r in out:
        ids = (f"group {r['group']}" if r["last"] == r["group"]
               else f"groups {r['group']}-{r['last']}")
        r["label"] = f"{ids} {r['kind']}"
    return out


def _group_line(g: dict) -> str:
    name = f"{g['label']} (block {g['block_size']})"
    if g["alone"] is None:
        return f"{name}: not probed"
    if g["without_drop"] is not None and g["without_drop"] != g["alone"]:
        s = (f"{name}: cached to {g['without_drop']}, {g['alone']} after the EAGLE drop "
             f"(-{g['without_drop'] - g['alone']})")
    else:
        s = f"{name}: reaches {g['alone']} alone"
    st = g["stop"]
    if st is not None and st["reason"] != "prompt_end":
        if st["reason"] == "evicted":
            why = _evicted(st.get("evicted_by"), st.get("evicted_at_s"))
        elif st["reason"] == "in_flight":
            why = f"in flight ({st['by']} is still computing it)"
        else:
            why = _STOP_WORDS[st["reason"]]
        s += f"; its block to {st['position']} missed: {why}"
    return s


def _cap_line(d: dict) -> str:
    cap = d["capped_by"]
    hit = d["hit"]
    if d["cache"] != "vllm":
        return (f"reconciled hit {hit}: " + ("prefix caching is off (cache.policy none)"
                if d["cache"] == "off" else "the ideal cache: the longest prefix any earlier "
                "request computed, on the hash unit"))
    if not d["groups"] or d["per_group_error"] or (not cap and hit == 0):
        return f"reconciled hit {hit}"
    if not cap:
        return (f"reconciled hit {hit}: the longest this prompt allows (below its last token, "
                f"within its keys, on the {d['limits']['align']}-token grid)")
    runs = _runs(d["groups"])
    capping = [r for r in runs if r["group"] in cap]
    if len(capping) == len(runs):
        return f"reconciled hit {hit}: every group reaches {hit} alone, no further"
    names = ", ".join(r["label"] for r in capping)
    g = capping[0]
    if g["alone"] == hit:
        return f"reconciled hit {hit}: capped by {names}, which reaches no further alone"
    others = min(x["alone"] for x in d["groups"] if x["group"] not in cap)
    held = (f"its nearest usable state is at {hit}" if hit else
            f"it has no usable state at or below {others}")
    if g["kind"] != "mamba":
        held = f"it holds nothing usable past {hit}"
    return f"reconciled hit {hit}: capped by {names}: asked for at most {others}, {held}"


_GAP_WORDS = {
    "never_computed": "never computed (earlier requests computed {computed} tokens of it)",
    "in_flight": "in flight ({by} is still computing its prompt)",
    "align_grid": "off the {bs}-token block grid (inside a block a state is kept only at a "
                  "prompt checkpoint or a junction)",
    "retention": "dropped by retention {ret}",
    "no_chunk_end": "on the grid, but no chunk ended there",
}


def _mamba_line(m: dict, d: dict) -> str:
    states = m["states"]
    shown = ", ".join(str(p) for p in states[-6:]) if states else "none"
    s = f"Mamba states of this prefix: {'..., ' if len(states) > 6 else ''}{shown}"
    if m["reach"] > 0:
        s += f"; nearest at or below {m['reach']}: {m['nearest'] or 'none'}"
    counts = m["gap_counts"]
    if not counts:
        return s
    parts = []
    ret = d["settings"]["prefix_cache_retention_interval"]
    for reason in REASONS:
        n = counts.get(reason)
        if not n:
            continue
        if reason == "evicted":
            top = next(g for g in m["gaps"] if g["reason"] == "evicted") if any(
                g["reason"] == "evicted" for g in m["gaps"]) else None
            words = "evicted" + (f" (at {top['position']}: "
                                 f"{_evicted(top['evicted_by'], top['evicted_at_s'])})"
                                 if top else "")
        else:
            words = _GAP_WORDS[reason].format(bs=m["block_size"], ret=_value(ret),
                                              computed=d["computed"]["tokens"],
                                              by=d["computed"]["in_flight_by"])
        parts.append(f"{n} {words}")
    lo = m["nearest"] + m["grid"]
    return s + f"\n  no state at {lo}..{m['reach']}: " + "; ".join(parts)


def _n(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")
