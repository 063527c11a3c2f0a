"""Workloads a router needs: sessions on the Mooncake traces (one per chain of hash ids)
and a multi-tenant ``system_prompt`` generator (each tenant its own prompts and rate)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from workloads import WorkloadError, build_workload, load_config

ROOT = Path(__file__).resolve().parents[2]
HEAD = ROOT / "tests" / "fixtures" / "mooncake_conversation_head.jsonl"


def _mooncake(tmp_path: Path, lines: list[dict], **kw) -> list:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return list(build_workload({"kind": "mooncake", "path": str(p), **kw}, 0, tmp_path))


def test_a_record_extending_an_earlier_one_continues_its_session(tmp_path):
    # (512-token blocks; a partial last block's id differs from the block its answer
    # completes in the next turn)
    recs = _mooncake(tmp_path, [
        {"timestamp": 0, "input_length": 1100, "output_length": 100, "hash_ids": [1, 2, 3]},
        {"timestamp": 1, "input_length": 700, "output_length": 5, "hash_ids": [1, 9]},
        # r0's two full blocks, then its answer and a new message: r0's conversation
        {"timestamp": 2, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 30, 40]},
        # r1's one full block, then more: r1's conversation
        {"timestamp": 3, "input_length": 1500, "output_length": 5, "hash_ids": [1, 90, 7]},
        {"timestamp": 4, "input_length": 400, "output_length": 5, "hash_ids": [5]},
        {"timestamp": 5, "input_length": 2560, "output_length": 5,
         "hash_ids": [1, 2, 30, 40, 50]},
        # extends r0's full blocks but is shorter than r0's prompt + answer: not r0's
        {"timestamp": 6, "input_length": 1150, "output_length": 5, "hash_ids": [1, 2, 31]},
    ], sessions="chain")
    s = [r.session for r in recs]
    assert s[0] == s[2] == s[5] == f"s{recs[0].request_id}"
    assert s[1] == s[3] != s[0]
    assert s[4] not in s[:4] and s[6] not in s[:6]
    # without the key the column stays blank, as before
    assert all(r.session is None for r in _mooncake(
        tmp_path, [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}]))


def test_the_conversation_trace_has_multi_turn_chains():
    trace = ROOT / "data" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    recs = list(build_workload({"kind": "mooncake", "path": str(trace), "sessions": "chain",
                                "num_requests": 3000}, 0, ROOT))
    sizes = Counter(r.session for r in recs)
    assert len(sizes) < len(recs) / 2 and max(sizes.values()) >= 10


def test_a_bad_sessions_value_is_one_line():
    with pytest.raises(WorkloadError, match="workload.sessions"):
        load_config({"kind": "mooncake", "path": "x.jsonl", "sessions": "by-user"})


TENANTS = {
    "kind": "system_prompt",
    "tenants": [
        {"name": "big", "num_system_prompts": 2, "system_prompt_tokens": [5000, 800],
         "rate_per_s": 3.0},
        {"name": "small", "count": 10, "num_system_prompts": 1,
         "system_prompt_tokens": {"dist": "uniform", "low": 100, "high": 900},
         "rate_per_s": 0.1},
    ],
    "suffix_tokens": {"dist": "fixed", "value": 50},
    "output_tokens": {"dist": "fixed", "value": 8},
    "num_requests": 4000,
}


def test_tenants_have_their_own_prompts_and_rates():
    recs = list(build_workload(TENANTS, 3, ROOT))
    assert len(recs) == 4000
    tenant = Counter(r.segments[0][0].split("/")[1] for r in recs)
    assert set(tenant) == {"big"} | {f"small-{i}" for i in range(10)}
    # big has 3.0 of the 4.0 requests per second in all
    assert abs(tenant["big"] / 4000 - 0.75) < 0.03
    # each small tenant's one prompt, drawn once: one length per tenant
    lengths = {}
    for r in recs:
        name, off, n = r.segments[0]
        assert lengths.setdefault(name, n) == n
    assert lengths["sys/big/0"] == 5000 and lengths["sys/big/1"] == 800
    span = recs[-1].arrival_s - recs[0].arrival_s
    assert abs(4000 / span - 4.0) < 0.3
    assert list(build_workload(TENANTS, 3, ROOT)) == recs


@pytest.mark.parametrize("change, field", [
    ({"rate_per_s": 2.0}, "workload.rate_per_s"),
    ({"tenants": []}, "workload.tenants"),
    ({"tenants": [{"name": "a", "rate_per_s": 1, "colour": 3}]}, "workload.tenants[0].colour"),
    ({"tenants": [{"name": "a", "system_prompt_tokens": 100}]}, "workload.tenants[0].rate_per_s"),
    ({"tenants": [{"name": "a", "rate_per_s": 1, "system_prompt_tokens": 9},
                  {"name": "a", "rate_per_s": 1, "system_prompt_tokens": 9}]},
     "workload.tenants[1].name"),
])
def test_bad_tenants_name_the_field(change, field):
    with pytest.raises(WorkloadError) as e:
        load_config({**TENANTS, **change})
    assert field in str(e.value)
