"""mooncake and azure trace readers, against fixtures cut from the real traces."""
import csv
import json
import math
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from workloads import WorkloadError, build_workload

MOONCAKE = "mooncake_conversation_head.jsonl"
AZURE = "azure_conv_head.csv"


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mooncake(fixtures, **opts):
    return list(build_workload({"kind": "mooncake", "path": MOONCAKE, **opts}, 0, fixtures))


# ----------------------------------------------------------------------------- mooncake

def test_mooncake_lengths_match_the_trace(fixtures):
    recs = records(fixtures / MOONCAKE)
    reqs = mooncake(fixtures)
    assert len(reqs) == len(recs) == 200
    for rec, req in zip(recs, reqs):
        assert sum(n for _, _, n in req.segments) == rec["input_length"] == req.prompt_tokens
        assert req.output_tokens == rec["output_length"]
        # one segment per hash id, in order, each a whole block but the last
        # (streams mc/<h> are named by the integer hash id h)
        assert [s for s, _, _ in req.segments] == rec["hash_ids"]
        assert all(off == 0 for _, off, _ in req.segments)
        assert all(n == 512 for _, _, n in req.segments[:-1])
        assert 1 <= req.segments[-1][2] <= 512
        assert req.session is None and req.after is None


def test_mooncake_shared_hash_ids_give_identical_segments(fixtures):
    reqs = mooncake(fixtures)
    by_id: dict[object, set] = {}
    uses: dict[object, int] = {}
    for req in reqs:
        for seg in req.segments:
            by_id.setdefault(seg[0], set()).add(seg)
            uses[seg[0]] = uses.get(seg[0], 0) + 1
    shared = [h for h, n in uses.items() if n > 1]
    assert 0 in shared and uses[0] == 200                # the common system prompt (mc/0)
    assert len(shared) > 10
    for h in shared:
        assert len(by_id[h]) == 1, (h, by_id[h])
    # two records whose hash ids agree on a leading run give requests sharing that prefix
    recs = records(fixtures / MOONCAKE)
    first: dict[tuple, int] = {}
    pairs = 0
    for i, rec in enumerate(recs):
        key = tuple(rec["hash_ids"][:2])
        if len(key) == 2 and key in first:
            j = first[key]
            run = 0
            while (run < min(len(recs[i]["hash_ids"]), len(recs[j]["hash_ids"]))
                   and recs[i]["hash_ids"][run] == recs[j]["hash_ids"][run]):
                run += 1
            full = min(run, len(recs[i]["hash_ids"]) - 1, len(recs[j]["hash_ids"]) - 1)
            assert reqs[i].segments[:full] == reqs[j].segments[:full]
            pairs += 1
        first.setdefault(key, i)
    assert pairs > 0


def test_mooncake_arrivals_are_timestamps_scaled(fixtures):
    recs = records(fixtures / MOONCAKE)
    for scale in (1.0, 2.5):
        reqs = mooncake(fixtures, time_scale=scale)
        assert [r.arrival_s for r in reqs] == [rec["timestamp"] / 1000 * scale for rec in recs]
        assert all(x.arrival_s <= y.arrival_s for x, y in zip(reqs, reqs[1:]))
    assert reqs[-1].arrival_s > 0


def test_mooncake_limit_and_ids(fixtures):
    reqs = mooncake(fixtures, limit=7)
    assert [r.request_id for r in reqs] == [f"r{i:07d}" for i in range(7)]
    assert len({r.request_id for r in mooncake(fixtures)}) == 200


def test_request_ids_are_the_index_zero_padded_to_seven_digits():
    """The compiled reader's ids (no format spec) are f"r{index:07d}" at every width."""
    from sim.engine.codecs import request_id
    for i in (0, 7, 10, 999_999, 1_000_000, 9_999_999, 10_000_000, 123_456_789):
        assert request_id(i) == f"r{i:07d}"


def test_mooncake_blank_lines_are_skipped_and_not_counted(tmp_path):
    p = tmp_path / "t.jsonl"
    rec = {"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [7]}
    p.write_text("\n" + json.dumps(rec) + "\n   \n" + json.dumps({**rec, "timestamp": 6}) + "\n")
    a, b = build_workload({"kind": "mooncake", "path": str(p)}, 0)
    assert (a.request_id, b.request_id) == ("r0000000", "r0000001")
    assert (a.arrival_s, b.arrival_s) == (0.005, 0.006)
    p.write_text(p.read_text() + "{oops\n")
    with pytest.raises(WorkloadError, match=r"t\.jsonl:5: invalid JSON \("):
        list(build_workload({"kind": "mooncake", "path": str(p)}, 0))


def test_mooncake_rest_beyond_hash_blocks_is_private(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 5, "input_length": 1200, "output_length": 3,
                             "hash_ids": [7, 9]}) + "\n"
                 + json.dumps({"timestamp": 6, "input_length": 600, "output_length": 1,
                               "hash_ids": [7, 9, 11]}) + "\n")
    a, b = build_workload({"kind": "mooncake", "path": "t.jsonl"}, 0, tmp_path)
    assert a.segments == [(7, 0, 512), (9, 0, 512), ("mcu/r0000000", 0, 176)]
    assert b.segments == [(7, 0, 512), (9, 0, 88)]                    # truncated; id 11 unused
    c, _ = build_workload({"kind": "mooncake", "path": str(p), "block_tokens": 256}, 0)
    assert c.segments == [(7, 0, 256), (9, 0, 256), ("mcu/r0000000", 0, 688)]
    assert a.arrival_s == 0.005


BROKEN = {
    "truncated": lambda line: line[: len(line) // 2],
    "missing field": lambda line: json.dumps({k: v for k, v in json.loads(line).items()
                                              if k != "input_length"}),
    "negative length": lambda line: json.dumps({**json.loads(line), "output_length": -1}),
    "bad hash ids": lambda line: json.dumps({**json.loads(line), "hash_ids": "0,1"}),
    "time goes back": None,
    "not an object": lambda line: "[1, 2]",
}


@pytest.mark.parametrize("how", BROKEN)
def test_mooncake_broken_line_names_path_and_line(fixtures, tmp_path, how):
    lines = (fixtures / MOONCAKE).read_text().splitlines()
    if how == "time goes back":                     # line 36 is at 9000 ms
        lines[36] = json.dumps({**json.loads(lines[36]), "timestamp": 8999})
    else:
        lines[36] = BROKEN[how](lines[36])
    bad = tmp_path / "broken.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    it = build_workload({"kind": "mooncake", "path": "broken.jsonl"}, 0, tmp_path)
    got = [next(it) for _ in range(36)]            # lazy: the good lines before it come out
    assert len(got) == 36
    with pytest.raises(WorkloadError) as e:
        next(it)
    msg = str(e.value)
    assert msg.startswith(f"{bad}:37: ") and "\n" not in msg


def test_trace_file_checked_up_front(tmp_path):
    for kind in ("mooncake", "azure", "jsonl"):
        with pytest.raises(WorkloadError, match=r"^workload\.path: no such file: .*nope"):
            build_workload({"kind": kind, "path": "nope.jsonl"}, 0, tmp_path)


# ----------------------------------------------------------------------------- azure

def _azure_time(text: str) -> float:
    whole, frac = text.split(".")
    t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    return t + int(frac) / 10 ** len(frac)


def test_azure_fixture(fixtures):
    rows = list(csv.DictReader((fixtures / AZURE).open()))
    reqs = list(build_workload({"kind": "azure", "path": AZURE}, 0, fixtures))
    assert len(reqs) == len(rows) == 50
    t0 = _azure_time(rows[0]["TIMESTAMP"])
    for row, req in zip(rows, reqs):
        assert req.segments == [(f"az/{req.request_id}", 0, int(row["ContextTokens"]))]
        assert req.output_tokens == int(row["GeneratedTokens"])
        assert math.isclose(req.arrival_s, _azure_time(row["TIMESTAMP"]) - t0, abs_tol=1e-6)
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(4.314579, abs=1e-9)   # 50.9951690 - 46.6805900
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(reqs, reqs[1:]))
    assert len({r.segments[0][0] for r in reqs}) == 50                # no shared prompt tokens


def test_azure_time_scale_and_limit(fixtures):
    full = list(build_workload({"kind": "azure", "path": AZURE}, 0, fixtures))
    half = list(build_workload({"kind": "azure", "path": AZURE, "time_scale": 0.5, "limit": 10},
                               0, fixtures))
    assert len(half) == 10
    assert [r.arrival_s for r in half] == [r.arrival_s * 0.5 for r in full[:10]]


@pytest.mark.parametrize("row, what", [
    ("2023-11-16 18:15:52.0000000,abc,5", "ContextTokens"),
    ("2023-11-16 18:15:52.0000000,10,0", "GeneratedTokens"),
    ("16/11/2023 18:15,10,5", "TIMESTAMP"),
    ("2023-11-16 18:15:52.0000000,10", "columns"),
    ("2023-11-16 18:15:40.0000000,10,5", "before the previous"),
])
def test_azure_broken_row_names_path_and_line(fixtures, tmp_path, row, what):
    lines = (fixtures / AZURE).read_text().splitlines()
    lines[5] = row                                   # file line 6
    bad = tmp_path / "bad.csv"
    shutil.copy(fixtures / AZURE, bad)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError) as e:
        list(build_workload({"kind": "azure", "path": str(bad)}, 0))
    assert str(e.value).startswith(f"{bad}:6: ") and what in str(e.value)


def test_azure_header_checked(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n")
    with pytest.raises(WorkloadError, match=r":1: header lacks column\(s\) TIMESTAMP"):
        list(build_workload({"kind": "azure", "path": str(p)}, 0))


def test_hash_id_streams_are_distinct_from_named_streams_and_print_as_mc(tmp_path):
    """Hash id h is the stream mc/<h>: a stream id of its own (never a registered
    name's, never LITERAL's), equal for equal ids, and written as "mc/<h>" to JSONL."""
    from sim.cache.hashing import LITERAL
    from sim.cache.prompt import StreamRegistry
    from workloads.jsonl import format_prompt, request_to_dict

    reg = StreamRegistry()
    named = reg.runs_of([("S", 0, 4), ("mc/0", 0, 4), ("out/r1", 0, 2)])
    hashed = reg.runs_of([(0, 0, 512), (1, 0, 512), (0, 0, 7), (2**53 - 1, 0, 1)])
    ids = {r[0] for r in named} | {r[0] for r in hashed}
    assert len(ids) == 3 + 3 and LITERAL not in ids
    assert hashed[0][0] == hashed[2][0] != hashed[1][0]
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"timestamp": 5, "input_length": 600, "output_length": 3,
                             "hash_ids": [7, 9]}) + "\n")
    (req,) = build_workload({"kind": "mooncake", "path": "t.jsonl"}, 0, tmp_path)
    assert request_to_dict(req)["segments"] == [["mc/7", 0, 512], ["mc/9", 0, 88]]
    assert format_prompt(req.segments) == "mc/7:512 mc/9:88"
    for bad in ([-1], [2**53], [True], [1.0]):
        p.write_text(json.dumps({"timestamp": 5, "input_length": 600, "output_length": 3,
                                 "hash_ids": bad}) + "\n")
        with pytest.raises(WorkloadError, match="hash_ids must be a list of integers"):
            list(build_workload({"kind": "mooncake", "path": "t.jsonl"}, 0, tmp_path))


def _layout_line(rng) -> bytes:
    """A record in the published trace's own layout (``json.dumps``' separators)."""
    big = rng.random() < 0.2
    rec = {"timestamp": rng.choice([0, 7, rng.randrange(10**6), 10**15 - 1 if big else 9]),
           "input_length": rng.randrange(1, 20_000), "output_length": rng.randrange(1, 2_000),
           "hash_ids": [rng.choice([0, 5, rng.randrange(10**6), 10**15 - 1])
                        for _ in range(rng.randint(1, 30))]}
    return json.dumps(rec).encode() + rng.choice([b"\n", b""])


MUTATIONS = [
    lambda b, r: b.replace(b": ", b":", 1),
    lambda b, r: b.replace(b", ", b",", r.randint(1, 3)),
    lambda b, r: b.replace(b"]}", b"] }"),
    lambda b, r: b.replace(b"]}", b"]}x"),
    lambda b, r: b.replace(b"\n", b"\r\n") if b.endswith(b"\n") else b + b"\r\n",
    lambda b, r: b.replace(b": ", b": 0", 1),                # a leading zero
    lambda b, r: b.replace(b": ", b": -", 1),                # a sign
    lambda b, r: b.replace(b"[", b"[1.5, ", 1),              # a float id
    lambda b, r: b.replace(b"[", b"[1e3, ", 1),
    lambda b, r: b.replace(b"[", b"[1234567890123456, ", 1),  # 16 digits
    lambda b, r: b.replace(b"[", b"[]" if r.random() < 0.5 else b"[ ", 1).split(b"]")[0] + b"]}",
    lambda b, r: b.replace(b'"timestamp": ', b'"timestamp": 1.25, "x": ', 1),
    lambda b, r: b.replace(b'"input_length"', b'"input_lengthX"', 1),
    lambda b, r: b[: r.randrange(len(b))],
    lambda b, r: b" " + b,
    lambda b, r: b.replace(b"}", b', "hash_ids": [1]}', 1),    # a second hash_ids
]


def test_layout_reader_agrees_with_orjson():
    """``sim.engine.codecs.layout_record`` reads the published trace's layout
    without a JSON decoder: on lines in that layout it gives what ``orjson.loads`` gives;
    on any other (spacing, signs, leading zeros, floats, 16 digits, other keys, \\r\\n,
    truncation) it gives NOT_LAYOUT, or what orjson gives."""
    import random

    import orjson

    from sim.engine.codecs import NOT_LAYOUT, layout_record

    rng = random.Random(31)
    fields = ("timestamp", "input_length", "output_length")
    for i in range(3000):
        line = _layout_line(rng)
        if i % 2:
            line = rng.choice(MUTATIONS)(line, rng)
        ts, n_in, n_out, ids = layout_record(line)
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            rec = None
        if i % 2 == 0:
            assert ts != NOT_LAYOUT, line
        if ts == NOT_LAYOUT:
            continue
        assert rec is not None and list(rec) == [*fields, "hash_ids"], line
        assert [ts, n_in, n_out] == [rec[f] for f in fields], line
        assert list(ids) == rec["hash_ids"] and all(type(v) is int for v in rec.values()
                                                    if not isinstance(v, list)), line


def test_mooncake_records_are_the_same_in_any_json_layout(tmp_path):
    """The same records written in the trace's layout (read without a JSON decoder) and
    compactly (read by orjson) come out identical, as do files mixing both."""
    import random

    rng = random.Random(37)
    recs = []
    ts = 0
    for _ in range(200):
        ts += rng.choice([0, 1, 250, 10_000])
        recs.append({"timestamp": ts, "input_length": rng.randrange(1, 9_000),
                     "output_length": rng.randrange(1, 600),
                     "hash_ids": [rng.randrange(10**9) for _ in range(rng.randint(1, 20))]})
    texts = {"layout": [json.dumps(r) for r in recs],
             "compact": [json.dumps(r, separators=(",", ":")) for r in recs],
             "mixed": [json.dumps(r, separators=(",", ":") if i % 3 else None)
                       for i, r in enumerate(recs)]}
    got = {}
    for name, lines in texts.items():
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        got[name] = [(r.request_id, r.arrival_s, list(r.segments), r.output_tokens)
                     for r in build_workload({"kind": "mooncake", "path": f"{name}.jsonl",
                                              "time_scale": 0.7}, 0, tmp_path)]
    assert got["layout"] == got["compact"] == got["mixed"]
    assert len(got["layout"]) == 200
    assert got["layout"][5][1] == recs[5]["timestamp"] / 1000 * 0.7


def _mixed_file(rng) -> list[bytes]:
    """A random Mooncake file: records in the trace's layout, compact, with float
    timestamps or ids past the prompt, blank lines, and now and then a broken one."""
    out = []
    ts = 0
    for _ in range(rng.randint(1, 40)):
        ts += rng.choice([0, 1, 250, 10_000])
        rec = {"timestamp": ts + (0.5 if rng.random() < 0.1 else 0),
               "input_length": rng.choice([1, 7, 512, 600, rng.randrange(1, 20_000)]),
               "output_length": rng.randrange(1, 2_000),
               "hash_ids": [rng.choice([0, 5, rng.randrange(10**6), 10**15 - 1])
                            for _ in range(rng.randint(1, 30))]}
        line = json.dumps(rec, separators=(",", ":") if rng.random() < 0.2 else None).encode()
        if rng.random() < 0.05:
            line = rng.choice(MUTATIONS)(line, rng)
        out.append(line + b"\n")
        if rng.random() < 0.05:
            out.append(b"  \n")
    return out


def test_the_codec_reads_what_its_plain_twin_reads(tmp_path):
    """The Mooncake reader (``workloads.trace_records.mooncake_records``: a line in the
    trace's layout by the compiled codec ``sim.engine.codecs.mooncake_lines``) and its
    plain reference twin (``plain_records``: every line through orjson) give the same
    records, or the same one-line error at the same line, on random files."""
    import random

    from workloads.trace_records import mooncake_records, plain_records
    from workloads.traces import MooncakeConfig

    def read(reader, path, block, limit, scale, bad):
        out = []
        try:
            for r in reader(path, block, limit, scale, bad):
                out.append((r.request_id, r.arrival_s, list(r.segments), r.output_tokens,
                            list(r.segments.ids), r.session, r.after))
        except WorkloadError as e:
            out.append(("error", str(e)))
        return out

    rng = random.Random(43)
    p = tmp_path / "t.jsonl"
    errors = records = 0
    for _ in range(150):
        p.write_bytes(b"".join(_mixed_file(rng)))
        block = rng.choice([16, 512, 1000])
        scale = rng.choice([1.0, 0.7, 2.0])
        limit = rng.choice([-1, -1, rng.randrange(0, 30)])
        bad = MooncakeConfig(str(p), time_scale=scale, block_tokens=block)._bad
        got = read(mooncake_records, str(p), block, limit, scale, bad)
        assert got == read(plain_records, str(p), block, limit, scale, bad)
        errors += bool(got) and got[-1][0] == "error"
        records += len(got)
    assert errors > 5 and records > 1000
