"""`sim case` and max_model_len: vLLM's API rejects a prompt of max_model_len
tokens or more before the KV-cache manager sees it; the case runner reports
that request as an error instead of modelling slots vLLM never allocates."""
from __future__ import annotations

from sim.cache.case import run_case_data


def _case(max_model_len: int, prompts: list[str]) -> dict:
    return {"config": {"groups": ["full", "mamba"], "block_size": 64, "hash_block_size": 16,
                       "num_blocks": 100, "max_model_len": max_model_len},
            "requests": [{"id": f"r{i}", "prompt": p} for i, p in enumerate(prompts)]}


def test_a_prompt_at_or_over_max_model_len_is_rejected_and_the_rest_still_run():
    res = run_case_data(_case(256, ["S:300", "S:256", "S:255", "S:200 U:10"]))
    assert [r["error"] for r in res] == ["PromptTooLong", "PromptTooLong", None, None]
    assert res[0]["error_message"] == ("prompt of 300 tokens >= max_model_len 256 "
                                       "(vLLM rejects it)")
    assert res[0]["chunk_ends"] is None and res[2]["chunk_ends"][-1] == 255
    # the rejected requests left nothing behind: r3 hits r2's cached prefix
    assert res[3]["hit"] > 0
