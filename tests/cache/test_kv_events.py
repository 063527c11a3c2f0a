"""KV cache events queued by the cache model (sim/cache/events.py) and shown by `sim steps`.

Step for step equality with vLLM's real scheduler is ``tests/engine/test_golden_events.py``
(oracle answers); these tests cover what the goldens cannot: events off change nothing, the
corrected stream, the canonical form's identities and the step cases' keys.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cache.case import CaseError
from sim.commands.steps import run_steps_data

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "events"


def _golden(name: str) -> dict:
    return yaml.safe_load((GOLDEN / f"{name}.yaml").read_text())


def _case(cfg: dict | None = None, **reqs) -> dict:
    """The oracle's ev_full_indexerror_mamba shape (hash 16, attention 16, Mamba 32)."""
    base = {"block_size": 16, "mamba_block_size": 32, "hash_block_size": 16,
            "num_blocks": 1024, "enable_kv_cache_events": True}
    base.update(cfg or {})
    r = [{"id": "p", "prompt": "S:48 P_p:8", "max_tokens": 2},
         {"id": "c", "prompt": "S:48 P_c:8", "arrival_step": 5, "max_tokens": 2,
          "report_mode": "full"}]
    for q in r:
        q.update(reqs.get(q["id"], {}))
    return {"config": base, "requests": r}


def test_events_change_no_answer():
    """With events on, off, or asked for without the switch, the requests are the same."""
    for path in sorted(GOLDEN.glob("gen_*.yaml"))[:12]:
        data = yaml.safe_load(path.read_text())
        on = run_steps_data(data, str(path), kv_events=True)["requests"]
        data["config"]["enable_kv_cache_events"] = False
        assert run_steps_data(data, str(path)) == on
        off = run_steps_data(data, str(path), kv_events=True)
        assert off == {"requests": on, "kv_events": [], "kv_events_error": None}


def test_kv_events_flag_turns_events_on_when_the_case_is_silent():
    data = _case()
    del data["config"]["enable_kv_cache_events"]
    got = run_steps_data(data, kv_events=True)
    assert got["kv_events"] and got["kv_events_error"]["type"] == "IndexError"


def test_the_mamba_indexerror_and_its_fix():
    got = run_steps_data(_case(), kv_events=True)
    err = got["kv_events_error"]
    # vLLM: the attention group's announcement was queued, the Mamba group's raised
    assert err == {"step": 5, "type": "IndexError", "request": "c", "group": 1, "unpublished": [
        {"type": "BlockStored", "group": 0, "req": "c", "blocks": [[0, 16], [16, 32], [32, 48]],
         "block_size": 16, "num_token_ids": 48, "parent_end": None}]}
    assert max(s["step"] for s in got["kv_events"]) < 5   # nothing published after it
    fixed = run_steps_data(_case({"kv_events_fix_emit": True}), kv_events=True)
    assert fixed["kv_events_error"] is None
    assert fixed["requests"] == got["requests"]
    step5 = next(s["events"] for s in fixed["kv_events"] if s["step"] == 5)
    # the attention keys are held by the hit blocks: announced as vLLM does; the Mamba hit
    # list is [null, a state inside its block] (published as a partial entry when stored):
    # no full-block key the pool holds there, nothing announced for it
    assert step5 == err["unpublished"]
    assert [s["step"] for s in fixed["kv_events"]] == [0, 1, 5]


def test_fix_emit_announces_only_held_keys():
    """vLLM announces the null positions of a Mamba hit list; the fix leaves them out."""
    cfg = {"mamba_block_size": 16, "hash_block_size": 4, "report_mode": "full"}
    reqs = {"p": {"prompt": "S:64 P_p:4"}, "c": {"prompt": "S:64 P_c:20"}}
    vllm = run_steps_data(_case(cfg, **reqs), kv_events=True)
    fixed = run_steps_data(_case(dict(cfg, kv_events_fix_emit=True), **reqs), kv_events=True)

    def announced(res):
        return [e for s in res["kv_events"] for e in s["events"]
                if e["type"] == "BlockStored" and e["req"] == "c" and e["parent_end"] is None
                and e["group"] == 1]

    (a,), (b,) = announced(vllm), announced(fixed)
    assert a["blocks"] == [[0, 16], [16, 32], [32, 48], [48, 64]]   # every position
    assert b["blocks"] == [[48, 64]]        # the one state the Mamba group holds
    assert a["num_token_ids"] == b["num_token_ids"] == 64


def test_report_mode_incremental_announces_nothing():
    got = run_steps_data(_case(c={"report_mode": "incremental"}), kv_events=True)
    assert got["kv_events_error"] is None
    assert not [e for s in got["kv_events"] for e in s["events"]
                if e["type"] == "BlockStored" and e["req"] == "c" and e["parent_end"] is None
                and e["blocks"][:1] == [[0, 16]]]


def test_removed_keys_name_their_first_store():
    """A removal resolves to the [req, start, end] of the first BlockStored of that key."""
    got = run_steps_data(_golden("ev_preempt_small_pool"), kv_events=True)
    stores = {}
    for s in got["kv_events"]:
        for e in s["events"]:
            if e["type"] == "BlockStored":
                for blk in e["blocks"]:
                    stores.setdefault((e["group"], e["req"]), []).append(blk)
            else:
                (rid, start, end), = e["blocks"]
                assert [start, end] in stores[(e["group"], rid)]


@pytest.mark.parametrize("cfg, msg", [
    ({"enable_kv_cache_events": "yes"}, "config.enable_kv_cache_events: must be true or false"),
    ({"kv_events_fix_emit": 1}, "config.kv_events_fix_emit: must be true or false"),
    ({"report_mode": "fast"}, "config.report_mode: must be full, incremental or null"),
])
def test_bad_event_keys_are_one_line(cfg, msg):
    with pytest.raises(CaseError, match=msg):
        run_steps_data(_case(cfg), "x.yaml")


def test_bad_request_report_mode():
    with pytest.raises(CaseError, match=r"requests\[1\]\.report_mode: must be full"):
        run_steps_data(_case(c={"report_mode": "all"}))
