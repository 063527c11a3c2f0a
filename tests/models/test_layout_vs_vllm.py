"""derive_layout against vLLM 0.33.0's own pool derivation (golden table written by
tools/check_layout_vs_vllm.py in the vLLM oracle venv: source = vLLM)."""
from collections import Counter

import pytest

from sim.models import CATALOGUE
from tools.check_layout_vs_vllm import RESULT, SETTING, TPS, normalize, read_golden, sim_row

GOLDEN = read_golden()


def test_golden_covers_the_catalogue_grid():
    """Every catalogue model x TP 1/2/4/8 x KV dtype x method is in the table, with both
    answers (accepted and refused) present."""
    seen = {(r["model"], int(r["tp"]), r["kv"], r["method"]) for r in GOLDEN}
    for name, m in CATALOGUE.items():
        for tp in TPS:
            for kv in ("auto", "bfloat16", "float16", "float32", "fp8"):
                for method in ("none", "eagle", "eagle3", "ngram") + (("mtp",) if m.mtp_layers else ()):
                    assert (name, tp, kv, method) in seen
    refused = Counter(r["refuse"] for r in GOLDEN)
    assert refused[""] > 2000 and refused["kv_cache_dtype"] and refused["speculative_method"]
    assert refused["draft_num_kv_heads"]
    # drafters of another shape: own groups, scaled target / drafter blocks, padded pages
    assert any(r["draft_groups"] not in ("", "0") for r in GOLDEN)
    assert any(r["attention_block_size"] not in ("", r["block_size"]) for r in GOLDEN)
    assert any(r["draft_block_size"] not in ("", "0", r["block_size"]) for r in GOLDEN)


@pytest.mark.parametrize("model", sorted(CATALOGUE))
def test_derive_layout_equals_vllm(model):
    rows = [r for r in GOLDEN if r["model"] == model]
    assert rows
    bad = []
    for r in rows:
        want, got = normalize(r), normalize(sim_row(r))
        if want != got:
            bad.append(({c: r[c] for c in SETTING},
                        {c: (want[c], got[c]) for c in RESULT if want[c] != got[c]}))
    assert not bad, f"{len(bad)} of {len(rows)} settings differ from vLLM, e.g. {bad[:3]}"


def _row(**key):
    hits = [r for r in GOLDEN if all(r[k] == str(v) for k, v in key.items())]
    assert len(hits) == 1, key
    return hits[0]


def test_issue_20_eagle_drafter_in_the_pool():
    """Issue #20 §2: Nemotron-H-8B with EAGLE k=3 has 5 attention + 24 Mamba layers in vLLM,
    group size 5, 21,626,880 B per pool block."""
    r = _row(model="nemotron-h-8b", tp=1, kv="auto", conv="auto", ssm="auto", method="eagle",
             k=3, draft="")
    assert (r["group_size"], r["attention_groups"], r["mamba_groups"]) == ("5", "1", "5")
    assert r["pool_block_bytes"] == "21626880" and r["eagle_groups"] == "1"
    # every method reserves 2 + k (+1 prefill checkpoint) Mamba blocks per request, ngram too
    assert _row(model="nemotron-h-8b", tp=1, kv="auto", conv="auto", ssm="auto", method="ngram",
                k=3)["mamba_blocks_per_request"] == "6"
