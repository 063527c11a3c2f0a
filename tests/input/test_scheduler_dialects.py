"""A scenario's ``scheduler:`` section, a step case's and a case file's scheduler keys are
built by one builder (``sim.config.scheduler.build_scheduler``): the same bad limit gets
the same reason in all three, each naming the field as its file does; only the defaults
(``DIALECT_DEFAULTS``) differ."""
from __future__ import annotations

import pytest

from sim.cache.case import CaseError, parse_case
from sim.commands.steps import parse_steps
from sim.config.dialects import DIALECT_DEFAULTS
from sim.config.scheduler import build_scheduler
from sim.errors import ConfigError

REQUESTS = [{"id": "a", "prompt": "S:40"}]


def _case_file(**limits) -> dict:
    return {"config": {"block_size": 16, **limits}, "requests": REQUESTS}


def _step_case(**limits) -> dict:
    return {"config": {"block_size": 16, "num_blocks": 64, **limits}, "requests": REQUESTS}


def _scenario_reason(**limits) -> str:
    with pytest.raises(ConfigError) as e:
        build_scheduler(limits, "scheduler.", "scenario")
    assert e.value.field_name.startswith("scheduler.")
    return e.value.reason


@pytest.mark.parametrize("limits", [
    {"max_num_batched_tokens": 0},
    {"max_num_batched_tokens": "lots"},
    {"max_num_batched_tokens": 1 << 70},
    {"long_prefill_token_threshold": -1},
    {"long_prefill_token_threshold": 1.5},
])
def test_a_bad_limit_gets_one_reason_in_every_dialect(limits):
    reason = _scenario_reason(**limits)
    (key,) = limits
    for parse, data in ((parse_case, _case_file(**limits)), (parse_steps, _step_case(**limits))):
        with pytest.raises(CaseError) as e:
            parse(data)
        assert str(e.value) == f"config.{key}: {reason}"


def test_each_dialect_takes_its_own_defaults():
    _, sched, _ = parse_case(_case_file())
    assert sched.max_num_batched_tokens == DIALECT_DEFAULTS["case file"]["max_num_batched_tokens"]
    sc = parse_steps(_step_case())[1]
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (
        DIALECT_DEFAULTS["step case"]["max_num_batched_tokens"],
        DIALECT_DEFAULTS["step case"]["max_num_seqs"])
    sc = build_scheduler({}, "scheduler.", "scenario")
    assert sc.max_num_seqs == DIALECT_DEFAULTS["scenario"]["max_num_seqs"]


def test_a_case_file_budget_below_the_scenario_sequence_limit_is_fine():
    """A case file serves one request at a time: a small budget never meets a sequence
    limit it does not have."""
    _, sched, _ = parse_case(_case_file(max_num_batched_tokens=8))
    assert sched.max_num_batched_tokens == 8


def test_cross_field_rules_name_the_step_case_field():
    with pytest.raises(CaseError, match=r"^config\.max_num_batched_tokens: 8 is smaller than "
                                        r"max_num_seqs 16 \(vLLM rejects this\)$"):
        parse_steps(_step_case(max_num_batched_tokens=8))
    with pytest.raises(CaseError, match=r"^config\.policy: unknown policy 'lifo'"):
        parse_steps(_step_case(policy="lifo"))
