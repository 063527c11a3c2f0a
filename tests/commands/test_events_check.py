"""`sim events check`: what a router trusting a KV event stream gets wrong (sim/commands/events_check.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.entrypoints.cli import app
from sim.config.scenario import load_scenario
from sim.commands.events_check import EventStreamError, check_stream
from sim.commands.run import simulate, write_run

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
runner = CliRunner()


def _stored(hashes, parent=None, group=0, bs=16):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [], "block_size": bs, "lora_id": None, "medium": "GPU",
            "lora_name": None, "group_idx": group}


def _removed(h, group=0):
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": group}


def _write(tmp_path: Path, lines: list, name: str = "s.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def test_a_sound_stream(tmp_path):
    p = _write(tmp_path, [{"ts": 0.1, "events": [_stored([1, 2]), _stored([3], parent=2)]},
                          [0.2, [_removed(3), _removed(2)], 0]])     # (msgspec's array form)
    rep = check_stream(p)
    assert rep.batches == 2 and rep.events["BlockStored"] == 2 and not rep.problems
    res = runner.invoke(app, ["events", "check", str(p)])
    assert res.exit_code == 0 and "keys removed that were never stored: 0" in res.output


def test_removals_of_keys_never_stored(tmp_path):
    p = _write(tmp_path, [{"events": [_stored([1]), _removed(9), _removed(1), _removed(1)]}])
    rep = check_stream(p)
    assert rep.removed_never_stored == 1 and rep.removed_more_than_stored == 1
    res = runner.invoke(app, ["events", "check", str(p)])
    assert res.exit_code == 1
    assert "keys removed that were never stored: 1 (and 1 removed more often than stored)" \
        in res.output


def test_announced_keys_never_stored_with_and_without_annotations(tmp_path):
    # a Mamba group (1) stored only its state at 32 (key 2); a full hit is announced for
    # every position: key 1 (the null block at 16) was never stored there
    events = [_stored([1, 2], group=0), _stored([2], group=1), _stored([1, 2], group=0),
              _stored([1, 2], group=1)]
    ann = {"events": events, "sim": {"req": ["a", "a", "b", "b"],
                                     "source": ["full", "full", "announce", "announce"]}}
    rep = check_stream(_write(tmp_path, [ann], "a.jsonl"))
    assert rep.annotated and rep.published_never_stored == 1
    assert rep.announcements_with_phantoms == 1
    assert rep.examples["published_never_stored"] == [{"line": 1, "group": 1, "hash": 1}]
    # a stream captured from vLLM names no source: a root event naming a cached key is taken
    # for an announcement
    rep = check_stream(_write(tmp_path, [{"events": events}], "v.jsonl"))
    assert not rep.annotated and rep.published_never_stored == 1
    assert "requests: not judged" in rep.text()


def test_a_key_stored_twice_and_removed_once(tmp_path):
    events = [_stored([1]), _stored([1]), _removed(1)]
    p = _write(tmp_path, [{"events": events, "sim": {"source": ["full", "full", None]}}])
    rep = check_stream(p)
    assert rep.removed_while_cached == 1 and rep.removed_never_stored == 0
    # unannotated, a second store from the root of a cached key looks like an announcement
    rep = check_stream(_write(tmp_path, [{"events": events}], "v.jsonl"))
    assert rep.removed_while_cached == 0 and rep.published_never_stored == 0


def test_requests_a_trusting_router_misjudges(tmp_path):
    head = {"kv_events_header": {"groups": [{"kind": "full", "block_size": 16},
                                            {"kind": "mamba", "block_size": 16}],
                                 "lookup_grid": 16, "hash_block_size": 16}}
    # attention holds 16, 32, 48; Mamba its state at 32; an announcement adds 48 to Mamba
    b1 = {"events": [_stored([1, 2, 3]), _stored([2], group=1), _stored([1, 2, 3], group=1)],
          "sim": {"req": ["a", "a", "b"], "source": ["full", "full", "announce"]}}
    look = {"req": "c", "hit": 32, "tokens": 60, "keys": [1, 2, 3]}
    b2 = {"events": [_removed(2, group=1)], "sim": {"lookups": [look]}}
    look2 = {"req": "d", "hit": 0, "tokens": 60, "keys": [1, 2, 3]}
    rep = check_stream(_write(tmp_path, [head, b1, b2, {"sim": {"lookups": [look2]}}]))
    assert rep.lookups == 2
    # c: the router sees a Mamba state at 48 (never stored): 48 against the cache's 32;
    # d: after the state at 32 is removed, the router still trusts the announced one at 48
    assert rep.misjudged == [{"req": "c", "router": 48, "cache": 32, "vllm_hit": 32},
                             {"req": "d", "router": 48, "cache": 0, "vllm_hit": 0}]
    res = runner.invoke(app, ["events", "check", "--json", str(tmp_path / "s.jsonl")])
    assert res.exit_code == 1 and json.loads(res.output)["misjudged"][0]["router"] == 48


@pytest.mark.parametrize("text, msg", [
    ("{\"events\": [\n", r"s\.jsonl:1: not JSON"),
    ('{"events": 3}\n', r"s\.jsonl:1: events: expected a list"),
    ('{"events": [{"type": "BlockMoved"}]}\n', r"unknown type 'BlockMoved'"),
    ('"x"\n', r"expected an object or an array"),
])
def test_bad_streams_are_one_line(tmp_path, text, msg):
    p = tmp_path / "s.jsonl"
    p.write_text(text)
    with pytest.raises(EventStreamError, match=msg):
        check_stream(p)
    res = runner.invoke(app, ["events", "check", str(p)])
    assert res.exit_code != 0


def _run(tmp_path: Path, name: str, **kv) -> Path:
    sc = load_scenario(TINY, {"kv_events": {"enable_kv_cache_events": True, **kv}})
    dep, rows, summary = simulate(sc)
    write_run(tmp_path / name, sc, dep, rows, summary, report=False)
    return tmp_path / name / "kv_events.jsonl"


def test_vllms_stream_and_the_corrected_one(tmp_path):
    """report_mode full: vLLM announces keys no block holds and a trusting router then
    over-estimates some followers' reuse; the corrected stream (fix_emit) has neither."""
    rep = check_stream(_run(tmp_path, "vllm", report_mode="full"))
    assert rep.published_never_stored > 0 and rep.misjudged
    assert all(m["router"] > m["cache"] for m in rep.misjudged)
    assert all(m["cache"] == m["vllm_hit"] for m in rep.misjudged)
    fixed = check_stream(_run(tmp_path, "fixed", report_mode="full", fix_emit=True))
    assert not fixed.problems and fixed.lookups == rep.lookups == 40
    plain = check_stream(_run(tmp_path, "incremental"))
    assert not plain.problems


def test_reads_msgpack_frames(tmp_path):
    pytest.importorskip("msgpack")
    jsonl = _run(tmp_path, "mp", report_mode="full", msgpack=True)
    a = check_stream(jsonl)
    b = check_stream(jsonl.with_suffix(".msgpack"))
    assert b.batches == a.batches and b.events == a.events
    assert b.published_never_stored == a.published_never_stored   # (by the heuristic)
    assert not b.annotated


def test_written_with_yaml_scenario_switch(tmp_path):
    d = yaml.safe_load(TINY.read_text())
    d["kv_events"] = True
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(d))
    sc = load_scenario(p)
    assert sc.kv_events.enable_kv_cache_events and sc.kv_events.report_mode is None
