"""``sim marconi --rule / --marconi-code / --budget``: the rules reach the replay, are written
to summary.json and report.md only when set, and bad values exit 2 on one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.entrypoints.cli import main
from sim.entrypoints.cli_marconi import parse_bytes
from sim.errors import InputError
from sim.marconi import replay
from sim.marconi.rules import MARCONI_CODE, Rules

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios/marconi/mooncake-parity.yaml"
N = 300


def _sim(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


def _direct(variant: str, budget: int, rules: Rules):
    from sim.config.scenario import load_scenario
    from sim.marconi.route import arrival_order, scenario_pool
    from workloads import build_workload

    sc = load_scenario(SCENARIO, {"workload.num_requests": N})
    pool, costs = scenario_pool(sc)
    reqs = arrival_order(build_workload(sc.workload, sc.seed, sc.path.parent))
    return pool, replay(reqs, costs, budget, variant, rules=rules)


@pytest.mark.parametrize("variant", ["marconi", "sglang+", "vllm+"])
def test_marconi_code_and_budget_reach_the_replay_and_the_files(tmp_path, variant, capsys):
    out = tmp_path / "ref"
    assert _sim(["marconi", str(SCENARIO), "--requests", str(N), "--variant", variant,
                 "--marconi-code", "--budget", "20GB", "--out", str(out)]) == 0
    pool, res = _direct(variant, 20 * 10**9, MARCONI_CODE)
    s = json.loads((out / "summary.json").read_text())
    assert s["budget_bytes"] == 20 * 10**9 and s["pool_bytes"] == pool != s["budget_bytes"]
    assert s["hit_tokens"] == sum(res.hit_tokens) and s["evictions"] == res.evictions > 0
    assert s["rules"] == {**MARCONI_CODE.changed()}
    report = (out / "report.md").read_text()
    assert "| budget (given; the scenario's pool is" in report
    assert "| rules away from the default | evict=before-insert, lru_refresh=descended," in report
    assert "partial_block=true |" in report
    assert "budget 18.63 GiB" in capsys.readouterr().out


def test_one_rule_and_a_rule_over_the_preset(tmp_path):
    one = tmp_path / "one"
    assert _sim(["marconi", str(SCENARIO), "--requests", "50", "--rule", "lru_refresh=descended",
                 "--variant", "sglang+", "--out", str(one), "-q"]) == 0
    assert json.loads((one / "summary.json").read_text())["rules"] == {"lru_refresh": "descended"}
    over = tmp_path / "over"
    assert _sim(["marconi", str(SCENARIO), "--requests", "50", "--marconi-code",
                 "--rule", "evict=after-insert", "--out", str(over), "-q"]) == 0
    rules = json.loads((over / "summary.json").read_text())["rules"]
    assert "evict" not in rules and rules["tune_last"] == 500


def test_the_default_writes_no_rules(tmp_path):
    out = tmp_path / "d"
    assert _sim(["marconi", str(SCENARIO), "--requests", "50", "--out", str(out), "-q"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert "rules" not in s and s["budget_bytes"] == s["pool_bytes"]
    assert "rules" not in (out / "report.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--rule", "evict=never"], "error: --rule evict: must be one of after-insert, before-insert"),
    (["--rule", "colour=red"], "error: --rule expected NAME=VALUE"),
    (["--budget", "12XB"], "error: --budget: must be a whole number of bytes"),
    (["--budget", "-5"], "error: --budget: must be a whole number of bytes"),
])
def test_bad_values_exit_2_one_line(tmp_path, capsys, extra, message):
    out = tmp_path / "bad"
    assert _sim(["marconi", str(SCENARIO), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("text, value", [
    ("50GB", 50 * 10**9), ("4GiB", 4 * 2**30), ("50e9", 50 * 10**9), ("1000", 1000),
    ("1.5GB", 1_500_000_000), ("512 MiB", 512 * 2**20), ("1_000_000", 10**6),
])
def test_budget_values(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["1.5", "-1GB", "GB", "1e400", "nan"])
def test_bad_budget_values(text):
    with pytest.raises(InputError, match="marconi.budget"):
        parse_bytes(text)
