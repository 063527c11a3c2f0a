"""The ``cluster:`` section: parsed once, every mistake one line naming the field."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.cluster.fleet import replica_scenarios
from sim.config.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"


def test_no_cluster_section_is_one_replica_alone():
    assert load_scenario(TINY).cluster is None


def test_a_count_and_a_router():
    sc = load_scenario(TINY, {"cluster": {"replicas": 3, "router": {
        "policy": "session_affinity", "seed": 4, "max_outstanding": 8}}})
    cl = sc.cluster
    assert cl.replicas == 3 and cl.router.policy == "session_affinity" and cl.router.seed == 4
    assert cl.router.options.max_outstanding == 8
    assert load_scenario(TINY, {"cluster.replicas": 2}).cluster.router.policy == "round_robin"


def test_a_mixed_fleet_sets_fields_per_group():
    sc = load_scenario(TINY, {"cluster": {"replicas": [
        {"count": 2}, {"count": 1, "set": {"kv_cache.num_gpu_blocks_override": 200}}]}})
    assert sc.cluster.replicas == 3
    per = replica_scenarios(sc)
    blocks = [s.kv_cache.num_gpu_blocks_override for s in per]
    assert blocks[:2] == [sc.kv_cache.num_gpu_blocks_override] * 2 and blocks[2] == 200
    assert per[0] is per[1] is sc


@pytest.mark.parametrize("cluster, names", [
    ({"replicas": 0}, ("cluster.replicas",)),
    ({"replicas": "many"}, ("cluster.replicas",)),
    ({"replicas": 10_000}, ("cluster.replicas", "4,096")),
    ({"replicas": 2, "routers": {}}, ("cluster.routers", "unknown key")),
    ({"router": {"policy": "magic"}}, ("cluster.router.policy", "round_robin")),
    ({"router": {"policy": "random", "seed": -1}}, ("cluster.router.seed",)),
    ({"router": {"policy": "round_robin", "max_outstanding": 3}},
     ("cluster.router.max_outstanding", "unknown key")),
    ({"router": {"policy": "power_of_two", "load": "bytes"}}, ("cluster.router.load",)),
    ({"replicas": [{"count": 2, "set": {"workload.num_requests": 5}}]},
     ("cluster.replicas[0].set", "workload")),
    ({"replicas": [{"cnt": 2}]}, ("cluster.replicas[0]",)),
    ([1, 2], ("cluster",)),
])
def test_bad_cluster_sections_name_the_field(cluster, names):
    with pytest.raises(ScenarioError) as e:
        load_scenario(TINY, {"cluster": cluster})
    msg = str(e.value)
    assert "\n" not in msg
    for n in names:
        assert n in msg, msg
