"""``sim explain CASE_FILE``: the seed's shapes (expected hits from the seed PR's tables and
the vLLM oracle's goldens, never from our own output), what-ifs equal to rerunning the case
with the switch flipped, the JSON keys, and bad input."""
from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
import yaml

from sim.cache.case import run_case_data
from sim.explain import explain, text
from tests.entrypoints.sim_cli import run_sim

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "cases"


def test_seed_defect_1_names_mamba_as_the_cap_and_the_eagle_drop():
    # seed PR section 1 (rule before the 0.33 fix): block 16, hash unit 4, producer cached 48;
    # full attention alone 48 -> 44 (one hash unit), Mamba alone 48, reconciled 32
    d = explain(GOLDEN / "seed_rule" / "d1_eagle.yaml", "consumer")
    full, mamba = d["groups"]
    assert (full["kind"], full["without_drop"], full["alone"]) == ("full", 48, 44)
    assert (mamba["kind"], mamba["alone"]) == ("mamba", 48)
    assert d["hit"] == 32 and d["capped_by"] == [1]
    assert d["mamba"]["reach"] == 44 and d["mamba"]["nearest"] == 32
    assert {g["position"]: g["reason"] for g in d["mamba"]["gaps"]} == {
        44: "align_grid", 40: "align_grid", 36: "align_grid"}
    words = text(d)
    assert "cached to 48, 44 after the EAGLE drop (-4)" in words
    assert "capped by group 1 mamba: asked for at most 44, its nearest usable state is at 32" in words


def test_seed_defect_3_junction_and_a_hit_of_nothing():
    # seed PR section 3: producer 24 shared + 16 private; full alone 16 -> 12, Mamba 16,
    # reconciled 0; the oracle's golden gives the junction (12)
    g = yaml.safe_load((GOLDEN / "dense" / "d3_eagle.yaml").read_text())["expect"]["consumer"]
    d = explain(GOLDEN / "dense" / "d3_eagle.yaml", "consumer")
    assert [x["alone"] for x in d["groups"]] == g["per_group"] == [12, 16]
    assert d["hit"] == g["hit"] == 0 and d["junction"]["position"] == g["junction"] == 12
    assert d["groups"][0]["without_drop"] == 16
    assert d["capped_by"] == [1] and d["mamba"]["nearest"] == 0
    assert d["computed"] == {"tokens": 24, "by": "producer", "in_flight": 0,
                             "in_flight_by": None}
    assert "junction 12" in text(d) and "EAGLE drop (-4)" in text(d)


def test_0_33_rule_the_prompt_checkpoint_holds_the_drop():
    # the oracle (vLLM 0.33.0): with the prompt checkpoint one unit below the tail the
    # consumer keeps 44, capped by full attention's EAGLE drop, not by Mamba
    d = explain(GOLDEN / "dense" / "d1_eagle.yaml", "consumer")
    assert d["hit"] == 44 and d["capped_by"] == [0]
    assert d["groups"][0]["without_drop"] == 48 and 44 in d["mamba"]["states"]


@pytest.mark.parametrize("path", sorted(glob.glob(str(GOLDEN / "dense" / "*.yaml"))),
                         ids=lambda p: Path(p).stem)
def test_hit_of_every_request_matches_the_oracle_golden(path):
    data = yaml.safe_load(Path(path).read_text())
    for rid, want in (data.get("expect") or {}).items():
        if "hit" not in want:
            continue
        d = explain(path, rid, counterfactuals=False)
        assert d["hit"] == want["hit"], rid
        if want.get("per_group") and d.get("groups"):
            assert [g["alone"] for g in d["groups"]] == want["per_group"], rid


@pytest.mark.parametrize("case,rid", [("cases/junction-flag.yaml", "follower2"),
                                      ("cases/junction-flag.yaml", "follower1"),
                                      ("tests/golden/cases/dense/d3_eagle.yaml", "consumer"),
                                      ("tests/golden/cases/checkpoints/c22_ck0.yaml", "consumer2")])
def test_what_ifs_equal_rerunning_the_case_with_the_switch_flipped(case, rid):
    path = ROOT / case
    d = explain(path, rid)
    data = yaml.safe_load(path.read_text())
    cfg = data["config"]
    by_name = {w["name"]: w for w in d["counterfactuals"]}
    for name, key in (("junction_flag", "shared_prefix_checkpoint"),
                      ("retention", "prefix_cache_retention_interval"),
                      ("hash_unit", "hash_block_size")):
        w = by_name[name]
        drop = {key, "enable_mamba_shared_prefix_checkpoint" if name == "junction_flag" else key}
        flipped = {k: v for k, v in cfg.items() if k not in drop}
        flipped[key] = w["value"]
        res = {r["id"]: r for r in run_case_data({**data, "config": flipped})}
        assert w["hit"] == res[rid]["hit"], (name, w)
    real = {r["id"]: r for r in run_case_data(data)}
    assert d["hit"] == real[rid]["hit"]


def test_a_what_if_that_changes_the_hit():
    # c22's second follower hits the junction state the first planted (the oracle: 12);
    # with the flag off no one plants it
    d = explain(ROOT / "cases" / "junction-flag.yaml", "follower2")
    w = {w["name"]: w for w in d["counterfactuals"]}["junction_flag"]
    assert d["hit"] == 12 and (w["was"], w["value"]) == (True, False)
    assert w["hit"] == 0 and w["change"] == -12


def test_json_is_valid_and_has_the_documented_keys(capsys):
    assert run_sim("explain", "cases/seed-d3-eagle.yaml", "--json", cwd=ROOT) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"schema", "request", "source", "prompt_tokens", "hit", "time_s", "refused", "error", "cache",
            "limits", "eagle", "groups", "per_group_error", "capped_by", "junction", "mamba",
            "computed", "settings", "counterfactuals"} <= set(d)
    assert d["schema"] == 1 and d["request"] == "consumer"
    assert set(d["groups"][0]) == {"group", "kind", "block_size", "alone", "without_drop",
                                   "capped", "stop"}
    assert {"group", "block_size", "grid", "states", "reach", "nearest", "gap_counts",
            "gaps"} == set(d["mamba"])
    assert [w["name"] for w in d["counterfactuals"]] == ["junction_flag", "retention",
                                                         "hash_unit"]


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert run_sim("explain", "cases/seed-d3-eagle.yaml", "--request", "nobody", cwd=ROOT) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("config: {groups: [full, bogus]}\nrequests: [{id: a, prompt: 'S:8'}]\n")
    assert run_sim("explain", str(bad), cwd=ROOT) == 2
    assert run_sim("explain", str(tmp_path), "r0", cwd=ROOT) == 2      # not a run folder
    assert run_sim("explain", str(tmp_path / "missing.yaml"), cwd=ROOT) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("error: ") for e in err)
    assert "no request 'nobody'" in err[0] and "not a run folder" in err[2]
