"""`sim steps` input handling around max_model_len (the oracle-backed behaviour is in
test_golden_steps.py and test_diff_steps.py)."""
from __future__ import annotations

import pytest

from sim.cache.case import CaseError
from sim.commands.steps import run_steps_data


def _case(**cfg):
    config = {"groups": ["full", "mamba"], "block_size": 16, "max_model_len": 64}
    config.update(cfg)
    return {"config": config,
            "requests": [{"id": "ok", "prompt": "S:40", "max_tokens": 50},
                         {"id": "edge", "prompt": "T:64", "max_tokens": 4},
                         {"id": "long", "prompt": "U:80", "max_tokens": 4}]}


def test_prompts_of_max_model_len_or_more_are_rejected_and_outputs_stop_there():
    got = {r["id"]: r for r in run_steps_data(_case())}
    assert got["ok"]["output_tokens"] == 64 - 40        # stopped at max_model_len
    for rid in ("edge", "long"):                         # no room for one output token
        assert "max_model_len 64 (vLLM rejects it)" in got[rid]["error"]
        assert "first_scheduled_step" not in got[rid]


def test_long_prefill_threshold_above_max_model_len_is_refused():
    with pytest.raises(CaseError, match="long_prefill_token_threshold: 65 cannot be greater"):
        run_steps_data(_case(long_prefill_token_threshold=65))
