"""`sim run --kv-events`: vLLM's KV event stream in the run folder (sim/rundir/kv_events.py)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sim.cache.hashing import LITERAL, PrefixKeys
from sim.config.scenario import ScenarioError, load_scenario
from sim.rundir.kv_events import JSONL, MSGPACK, token_ids
from sim.commands.run import simulate, write_run
from sim.oracle.worker import default_oracle_python

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
STORED_FIELDS = ["type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                 "lora_id", "medium", "lora_name", "extra_keys", "group_idx"]


def _run(tmp_path: Path, name: str, over: dict, path: Path = TINY) -> Path:
    sc = load_scenario(path, {"workload.num_requests": 16, **over})
    dep, rows, summary = simulate(sc)
    out = tmp_path / name
    write_run(out, sc, dep, rows, summary, report=False)
    return out


def _lines(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / JSONL).read_text().splitlines()]


def test_token_ids_are_synthetic_and_shared_by_equal_prefixes():
    keys = PrefixKeys([(LITERAL, 5, 1), (LITERAL, 9, 1), (3, 10, 4), (-7, 0, 2)], 4, 0)
    assert token_ids(keys, 0, 8) == [5, 9, (6 << 24) + 10, (6 << 24) + 11, (6 << 24) + 12,
                                     (6 << 24) + 13, 13 << 24, (13 << 24) + 1]
    assert token_ids(keys, 3, 5) == [(6 << 24) + 11, (6 << 24) + 12]
    assert token_ids(keys, 7, 20) == [(13 << 24) + 1]     # (stops at the sequence's end)
    other = PrefixKeys([(LITERAL, 5, 1), (LITERAL, 9, 1), (3, 10, 2), (4, 0, 5)], 4, 0)
    assert token_ids(other, 0, 4) == token_ids(keys, 0, 4)


def test_run_writes_vllms_records_and_changes_nothing_else(tmp_path):
    on = _run(tmp_path, "on", {"kv_events": True, "kv_cache.num_gpu_blocks_override": 40})
    off = _run(tmp_path, "off", {"kv_cache.num_gpu_blocks_override": 40})
    assert (on / "requests.csv").read_bytes() == (off / "requests.csv").read_bytes()
    assert not (off / JSONL).exists() and not (on / MSGPACK).exists()
    lines = _lines(on)
    head = lines[0]["kv_events_header"]
    assert sorted(head["groups"], key=lambda g: g["kind"]) == [
        {"kind": "full", "block_size": 48}, {"kind": "mamba", "block_size": 48}]
    assert head["hash_block_size"] == 16 and head["report_mode"] == "incremental"
    batches = lines[1:]
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    assert all(a["ts"] < b["ts"] for a, b in zip(batches, batches[1:]))
    kinds = set()
    for b in batches:
        assert b["data_parallel_rank"] == 0 and b["events"]
        assert len(b["sim"]["req"]) == len(b["sim"]["source"]) == len(b["events"])
        for ev, src in zip(b["events"], b["sim"]["source"]):
            kinds.add(ev["type"])
            if ev["type"] == "BlockRemoved":
                assert list(ev) == ["type", "block_hashes", "medium", "group_idx"]
                assert len(ev["block_hashes"]) == 1 and src is None
                continue
            assert list(ev)[:8] == STORED_FIELDS[:8] and ev["medium"] == "GPU"
            assert src in ("full", "partial")
            assert ("extra_keys" in ev) == bool(ev["block_hashes"])
            assert len(ev["token_ids"]) >= len(ev["block_hashes"]) * ev["block_size"] or \
                src == "partial"
    assert kinds == {"BlockStored", "BlockRemoved"}       # (a 40-block pool evicts)
    # every request's first lookup is recorded with its hit (what `sim events check` judges)
    looked = [lk for b in lines[1:] for lk in b.get("sim", {}).get("lookups", [])]
    assert sorted(lk["req"] for lk in looked) == sorted(
        ln.split(",")[0] for ln in (on / "requests.csv").read_text().splitlines()[1:])


def test_token_ids_false_keeps_the_hashes(tmp_path):
    a = _lines(_run(tmp_path, "a", {"kv_events": True}))
    b = _lines(_run(tmp_path, "b", {"kv_events": {"enable_kv_cache_events": True,
                                                  "token_ids": False}}))
    assert len(a) == len(b)
    for x, y in zip(a[1:], b[1:]):
        for ex, ey in zip(x["events"], y["events"]):
            assert ex.get("block_hashes") == ey.get("block_hashes")
            assert ey.get("token_ids", []) == []


@pytest.mark.parametrize("value, msg", [
    ("maybe", "kv_events: expected true, false or a mapping of fields"),
    ({"report_mode": "fast"}, "kv_events.report_mode: must be full, incremental or null"),
    ({"enable": True}, "kv_events.enable: unknown key"),
    ({"fix_emit": "yes"}, "kv_events.fix_emit: must be true or false"),
])
def test_bad_kv_events_section_is_one_line(value, msg):
    with pytest.raises(ScenarioError, match=msg):
        load_scenario(TINY, {"kv_events": value})


def _indexerror_scenario(tmp_path: Path, **kv) -> Path:
    """athena-tiny without EAGLE and with short suffixes: a follower's hit ends inside the
    block its prompt ends in, so announcing it (report_mode full) raises IndexError."""
    d = yaml.safe_load(TINY.read_text())
    del d["speculative"]
    d["workload"]["suffix_tokens"] = {"dist": "uniform", "low": 4, "high": 20}
    d["kv_events"] = {"enable_kv_cache_events": True, "report_mode": "full", **kv}
    p = tmp_path / "kverr.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


def test_indexerror_ends_the_stream_not_the_run(tmp_path):
    sc_path = _indexerror_scenario(tmp_path)
    sc = load_scenario(sc_path)
    dep, rows, summary = simulate(sc)
    assert len(rows) == 40                     # the replay goes on
    err = dep.kv_events.log.error
    assert err["type"] == "IndexError" and err["group"] == 0
    write_run(tmp_path / "err", sc, dep, rows, summary, report=False)
    last = _lines(tmp_path / "err")[-1]
    assert last["kv_events_error"]["request"] == err["request"]
    fixed = _run(tmp_path, "fixed", {"workload.num_requests": 40},
                 _indexerror_scenario(tmp_path, fix_emit=True))
    assert not any("kv_events_error" in ln for ln in _lines(fixed))
    assert (fixed / "requests.csv").read_bytes() == (tmp_path / "err" / "requests.csv").read_bytes()


def test_cli_flag_turns_events_on_and_run_json_records_it(tmp_path):
    from typer.testing import CliRunner

    from sim.entrypoints.cli import app

    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["run", str(TINY), "--requests", "8", "--kv-events",
                                   "--no-report", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "KV events in" in res.output and (out / JSONL).exists()
    rec = json.loads((out / "run.json").read_text())
    assert rec["scenario"]["kv_events"] is True


def test_msgpack_frames_are_what_vllms_publisher_sends(tmp_path):
    """Each frame's payload decodes as vLLM's KVEventBatch and re-encodes (msgspec, in the
    oracle venv) to the same bytes."""
    msgpack = pytest.importorskip("msgpack")
    py = default_oracle_python()
    if not py.exists():
        pytest.skip(f"vLLM oracle venv not found ({py})")
    out = _run(tmp_path, "mp", {"kv_events": {"enable_kv_cache_events": True, "msgpack": True,
                                              "report_mode": "full"},
                                "kv_cache.num_gpu_blocks_override": 40,
                                "cache.disable_lookahead_block_hashes": False})
    with open(out / MSGPACK, "rb") as f:
        frames = [[t.hex(), s.hex(), p.hex()] for t, s, p in msgpack.Unpacker(f, raw=False)]
    assert len(frames) == len(_lines(out)) - 1
    (tmp_path / "frames.json").write_text(json.dumps(frames))
    script = (
        "import json, sys, msgspec\n"
        "from vllm.distributed.kv_events import KVEventBatch\n"
        "dec = msgspec.msgpack.Decoder(type=KVEventBatch); enc = msgspec.msgpack.Encoder()\n"
        "fr = json.load(open(sys.argv[1])); kinds = set(); same = 0\n"
        "for i, (t, s, p) in enumerate(fr):\n"
        "    b = dec.decode(bytes.fromhex(p)); same += enc.encode(b) == bytes.fromhex(p)\n"
        "    assert int(s, 16) == i and t == ''\n"
        "    kinds |= {type(e).__name__ for e in b.events}\n"
        "    kinds |= {'lookahead' for e in b.events if getattr(e, 'lookahead_token_ids', None)}\n"
        "print(same, len(fr), sorted(kinds))\n")
    got = subprocess.run([str(py), "-c", script, str(tmp_path / "frames.json")],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    same, n, kinds = got.stdout.split(" ", 2)
    assert same == n and int(n) > 10
    assert kinds.strip() == "['BlockRemoved', 'BlockStored', 'lookahead']"


def test_decode_jumps_publish_every_event_at_its_own_step(tmp_path):
    """A run publishing KV events takes decode jumps (memory.csv samples one row a jump),
    and its stream is the one stepping one by one gives: no jump covers a step whose
    allocation or (drafts accepted) update caches, frees or evicts a block.  multi-turn
    (EAGLE k=3) caches at update time inside what would otherwise be a jump."""
    sc = load_scenario(ROOT / "scenarios" / "multi-turn.yaml", {"kv_events": True})
    outs = {}
    for jump in (True, False):
        dep, rows, summary = simulate(sc, jump=jump)
        outs[jump] = out = tmp_path / f"jump{jump}"
        write_run(out, sc, dep, rows, summary, report=False)
    a, b = outs[True], outs[False]
    assert (a / JSONL).read_bytes() == (b / JSONL).read_bytes()
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    rows_jump = len((a / "memory.csv").read_text().splitlines())
    rows_step = len((b / "memory.csv").read_text().splitlines())
    assert rows_jump < rows_step / 2
