"""Unit tests of the placement core: filters, strategies, shares, gangs, restore, reports."""

import pytest

from apps.scheduling.core import (
    STRATEGIES,
    Assignment,
    ClusterManager,
    Node,
    Placement,
    Pod,
)


def cluster(strategy=None, nodes=()):
    cm = ClusterManager(strategy)
    for node in nodes:
        cm.add_node(node)
    return cm


def h100(name, gpus=8, **kw):
    kw.setdefault("cpu_milli", 64_000)
    kw.setdefault("memory_mib", 512_000)
    return Node(name, gpus, "H100", **kw)


def gpus_taken(cm):
    return {n.name: [1000 - f for f in cm.node_view(n.name).free_milli] for n in cm.list_nodes()}


# -- the public API shape ----------------------------------------------------------------------


def test_the_default_strategy_is_the_fragmentation_aware_one():
    assert ClusterManager().strategy.name == "fgd-plus"
    assert {"first-fit", "best-fit", "spread", "bin-pack", "fgd-plus"} <= set(STRATEGIES)


def test_an_unknown_strategy_is_refused():
    with pytest.raises(ValueError):
        ClusterManager("worst-fit")


def test_a_placement_names_node_gpus_and_shares():
    cm = cluster(nodes=[h100("a")])
    placement = cm.schedule_pod(Pod("p", gpus=2))
    [part] = placement.assignments
    assert (part.node, part.gpu_indices, part.gpu_milli) == ("a", [0, 1], [1000, 1000])


def test_pod_and_node_validate_their_fields():
    with pytest.raises(ValueError):
        Pod("p", gpu_milli=0)
    with pytest.raises(ValueError):
        Pod("p", nodes=0)
    with pytest.raises(ValueError):
        Node("n", -1, "H100")
    with pytest.raises(ValueError):
        Node("n", 1, "H100", taints=("gpu=yes:Sometimes",))


# -- filters ---------------------------------------------------------------------------------


def test_it_places_only_on_the_requested_gpu_model():
    cm = cluster(nodes=[Node("a100", 8, "A100"), h100("h")])
    assert cm.schedule_pod(Pod("p", gpu_models=("H100",))).nodes == ["h"]


def test_it_honours_the_node_selector():
    cm = cluster(nodes=[h100("a"), h100("b", labels={"disk": "ssd"})])
    assert cm.schedule_pod(Pod("p", node_selector={"disk": "ssd"})).nodes == ["b"]


def test_a_no_schedule_taint_keeps_untolerating_pods_off():
    cm = cluster(nodes=[h100("a", taints=("dedicated=ml:NoSchedule",))])
    assert cm.schedule_pod(Pod("p")) is None
    assert cm.schedule_pod(Pod("q", tolerations=("dedicated=ml:NoSchedule",))).nodes == ["a"]
    assert cm.schedule_pod(Pod("r", tolerations=("dedicated:NoSchedule",))).nodes == ["a"]
    assert cm.schedule_pod(Pod("s", tolerations=("*",))).nodes == ["a"]
    assert cm.schedule_pod(Pod("t", tolerations=("dedicated=web:NoSchedule",))) is None


def test_a_prefer_no_schedule_taint_is_used_only_when_nothing_else_fits():
    cm = cluster(
        "first-fit", [h100("a", gpus=1, taints=("spot=yes:PreferNoSchedule",)), h100("b", gpus=1)]
    )
    assert cm.schedule_pod(Pod("p")).nodes == ["b"]
    assert cm.schedule_pod(Pod("q")).nodes == ["a"]


def test_cpu_and_memory_are_filters():
    cm = cluster(nodes=[h100("small", cpu_milli=1000, memory_mib=1000), h100("big")])
    assert cm.schedule_pod(Pod("p", cpu_milli=2000)).nodes == ["big"]
    assert cm.schedule_pod(Pod("q", memory_mib=2000)).nodes == ["big"]


def test_a_cpu_only_pod_takes_no_gpu():
    cm = cluster(nodes=[Node("cpu", 0, "", cpu_milli=8000, memory_mib=1000)])
    placement = cm.schedule_pod(Pod("p", gpus=0, cpu_milli=4000))
    assert placement.assignments[0].gpu_indices == []
    assert cm.node_view("cpu").cpu_free == 4000
    assert cm.schedule_pod(Pod("q", gpus=1)) is None


def test_a_node_with_no_cpu_capacity_hosts_only_pods_that_ask_for_none():
    cm = cluster(nodes=[Node("n", 1, "T4")])
    assert cm.schedule_pod(Pod("p", cpu_milli=1)) is None
    assert cm.schedule_pod(Pod("q")) is not None


# -- whole GPUs and shares ----------------------------------------------------------------------


def test_no_gpu_is_handed_out_twice():
    cm = cluster(nodes=[h100("a", gpus=4)])
    placements = [cm.schedule_pod(Pod(f"p{i}")) for i in range(5)]
    assert placements[-1] is None
    indices = [p.assignments[0].gpu_indices[0] for p in placements[:4]]
    assert sorted(indices) == [0, 1, 2, 3]


def test_shares_pack_onto_one_gpu_until_it_is_full():
    cm = cluster("best-fit", [h100("a", gpus=2)])
    for i in range(3):
        assert cm.schedule_pod(Pod(f"s{i}", gpu_milli=300)).assignments[0].gpu_indices == [0]
    assert cm.schedule_pod(Pod("s3", gpu_milli=300)).assignments[0].gpu_indices == [1]
    assert cm.schedule_pod(Pod("s4", gpu_milli=100)).assignments[0].gpu_indices == [0]
    assert gpus_taken(cm)["a"] == [1000, 300]


def test_a_whole_gpu_pod_never_lands_on_a_shared_gpu():
    cm = cluster(nodes=[h100("a", gpus=1)])
    cm.schedule_pod(Pod("s", gpu_milli=100))
    assert cm.schedule_pod(Pod("w")) is None


def test_a_multi_gpu_share_takes_that_share_of_each_gpu():
    cm = cluster(nodes=[h100("a", gpus=4)])
    placement = cm.schedule_pod(Pod("p", gpus=2, gpu_milli=600))
    assert placement.assignments[0].gpu_milli == [600, 600]
    assert cm.schedule_pod(Pod("q", gpus=3, gpu_milli=600)) is None


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_every_strategy_fills_the_cluster_exactly(strategy):
    cm = cluster(strategy, [h100(f"n{i}", gpus=4) for i in range(3)])
    placed = [cm.schedule_pod(Pod(f"p{i}", gpus=1 + i % 2)) for i in range(12)]
    assert sum(1 for p in placed if p) >= 7
    assert (
        cm.utilization()["gpu"] == sum(len(p.assignments[0].gpu_indices) for p in placed if p) / 12
    )
    cm.verify()


# -- strategies -------------------------------------------------------------------------------


def test_best_fit_fills_the_tightest_node():
    cm = cluster("best-fit", [h100("a"), h100("b")])
    cm.add_pod(Pod("x", gpus=6), Placement([Assignment("b", list(range(6)), [1000] * 6)]))
    assert cm.schedule_pod(Pod("p", gpus=2)).nodes == ["b"]


def test_spread_takes_the_emptiest_node():
    cm = cluster("spread", [h100("a"), h100("b")])
    cm.add_pod(Pod("x", gpus=1), Placement([Assignment("a", [0], [1000])]))
    assert cm.schedule_pod(Pod("p")).nodes == ["b"]


def test_bin_pack_prefers_the_most_allocated_share_of_a_node():
    cm = cluster("bin-pack", [h100("big", gpus=8), h100("small", gpus=2)])
    cm.add_pod(Pod("x", gpus=3), Placement([Assignment("big", [0, 1, 2], [1000] * 3)]))
    cm.add_pod(Pod("y", gpus=1), Placement([Assignment("small", [0], [1000])]))
    assert cm.schedule_pod(Pod("p")).nodes == ["small"]


def test_first_fit_takes_the_first_node_by_name():
    cm = cluster("first-fit", [h100("b"), h100("a"), h100("c")])
    assert cm.schedule_pod(Pod("p")).nodes == ["a"]


def test_fgd_keeps_whole_gpus_whole_for_the_workload_it_has_seen():
    cm = cluster("fgd-plus", [h100("a", gpus=2)])
    for i in range(20):  # teach it that whole GPUs are common
        cm.schedule_pod(Pod(f"w{i}", gpus=0))
        cm.remove_pod(f"w{i}")
    first = cm.schedule_pod(Pod("s1", gpu_milli=500)).assignments[0].gpu_indices
    second = cm.schedule_pod(Pod("s2", gpu_milli=500)).assignments[0].gpu_indices
    assert first == second  # the second share fills the same GPU, leaving the other whole


# -- gangs --------------------------------------------------------------------------------------


def racked(name, rack, zone):
    return h100(name, labels={"rack": rack, "zone": zone})


def test_a_gang_prefers_one_rack():
    cm = cluster(
        "first-fit",
        [
            racked("a1", "r1", "z1"),
            racked("b1", "r2", "z1"),
            racked("b2", "r2", "z1"),
            racked("c1", "r3", "z2"),
        ],
    )
    assert sorted(cm.schedule_pod(Pod("g", gpus=8, nodes=2)).nodes) == ["b1", "b2"]


def test_a_gang_falls_back_to_one_zone_then_to_the_fewest_racks():
    nodes = [racked("a1", "r1", "z1"), racked("a2", "r2", "z1"), racked("c1", "r3", "z2")]
    nodes += [racked("d1", "r4", "z3"), racked("d2", "r4", "z3"), racked("e1", "r5", "z4")]
    cm = cluster("first-fit", nodes)
    assert sorted(cm.schedule_pod(Pod("g", gpus=8, nodes=3)).nodes) in (
        ["d1", "d2", "a1"],
        ["a1", "d1", "d2"],
    )
    cm.verify()


def test_a_gang_within_one_zone_wins_over_fewer_racks_across_zones():
    nodes = [racked("a1", "r1", "z1"), racked("a2", "r2", "z1"), racked("d1", "r4", "z3")]
    cm = cluster("first-fit", nodes)
    assert sorted(cm.schedule_pod(Pod("g", gpus=8, nodes=2)).nodes) == ["a1", "a2"]


def test_a_gang_that_does_not_fit_leaves_nothing_behind():
    cm = cluster(nodes=[h100("a"), h100("b")])
    assert cm.schedule_pod(Pod("g", gpus=4, nodes=3)) is None
    assert cm.utilization()["gpu"] == 0
    assert cm.list_pods() == []
    cm.verify()


def test_gang_members_land_on_distinct_nodes():
    cm = cluster(nodes=[h100("a"), h100("b")])
    placement = cm.schedule_pod(Pod("g", gpus=2, nodes=2))
    assert sorted(placement.nodes) == ["a", "b"]


# -- add_pod, remove_pod, remove_node, health, cordon ----------------------------------------


def test_add_pod_restores_a_known_allocation():
    cm = cluster(nodes=[h100("a")])
    cm.add_pod(Pod("p", gpus=2), Placement([Assignment("a", [3, 5], [1000, 1000])]))
    assert gpus_taken(cm)["a"] == [0, 0, 0, 1000, 0, 1000, 0, 0]
    assert cm.placement_of("p").assignments[0].gpu_indices == [3, 5]


@pytest.mark.parametrize(
    "placement",
    [
        Placement([Assignment("a", [0], [1000])]),  # GPU 0 is taken
        Placement([Assignment("a", [8], [1000])]),  # no such GPU
        Placement([Assignment("zz", [1], [1000])]),  # no such node
        Placement([Assignment("a", [1, 2], [1000, 1000])]),  # wrong GPU count for the pod
        Placement([Assignment("a", [1], [1000]), Assignment("a", [2], [1000])]),  # not a gang
    ],
)
def test_a_conflicting_add_pod_raises_and_changes_nothing(placement):
    cm = cluster(nodes=[h100("a")])
    cm.schedule_pod(Pod("first"))
    before = (gpus_taken(cm), cm.node_view("a").cpu_free, cm.list_pods())
    with pytest.raises(ValueError):
        cm.add_pod(Pod("p", gpus=1), placement)
    assert (gpus_taken(cm), cm.node_view("a").cpu_free, cm.list_pods()) == before
    cm.verify()


def test_add_pod_refuses_a_pod_name_twice():
    cm = cluster(nodes=[h100("a")])
    cm.add_pod(Pod("p"), Placement([Assignment("a", [0], [1000])]))
    with pytest.raises(ValueError):
        cm.add_pod(Pod("p"), Placement([Assignment("a", [1], [1000])]))
    with pytest.raises(ValueError):
        cm.schedule_pod(Pod("p"))


def test_add_pod_refuses_cpu_beyond_the_node():
    cm = cluster(nodes=[h100("a", cpu_milli=1000)])
    with pytest.raises(ValueError):
        cm.add_pod(Pod("p", cpu_milli=2000), Placement([Assignment("a", [0], [1000])]))


def test_remove_pod_frees_its_gpus_and_is_idempotent():
    cm = cluster(nodes=[h100("a", gpus=1)])
    cm.schedule_pod(Pod("p"))
    assert cm.remove_pod("p").nodes == ["a"]
    assert cm.remove_pod("p") is None
    assert cm.schedule_pod(Pod("q")) is not None


def test_remove_node_evicts_its_pods_and_whole_gangs():
    cm = cluster(nodes=[h100("a"), h100("b")])
    cm.schedule_pod(Pod("g", gpus=8, nodes=2))
    evicted = cm.remove_node("a")
    assert [p.name for p in evicted] == ["g"]
    assert gpus_taken(cm)["b"] == [0] * 8
    assert cm.list_pods() == []
    cm.verify()


def test_an_unhealthy_gpu_gets_no_new_pods_but_keeps_its_own():
    cm = cluster("first-fit", [h100("a", gpus=2)])
    cm.schedule_pod(Pod("p"))
    cm.set_gpu_health("a", 0, False)
    cm.set_gpu_health("a", 1, False)
    assert cm.schedule_pod(Pod("q", gpu_milli=10)) is None
    assert cm.placement_of("p") is not None
    cm.set_gpu_health("a", 1, True)
    assert cm.schedule_pod(Pod("q")).assignments[0].gpu_indices == [1]
    cm.verify()


def test_a_cordoned_node_gets_no_new_pods():
    cm = cluster(nodes=[h100("a")])
    cm.cordon("a")
    assert cm.schedule_pod(Pod("p")) is None
    assert "1 node cordoned" in cm.why_not(Pod("p")).message
    cm.uncordon("a")
    assert cm.schedule_pod(Pod("p")) is not None
    cm.verify()


def test_a_returned_placement_cannot_corrupt_the_books():
    cm = cluster(nodes=[h100("a")])
    placement = cm.schedule_pod(Pod("p"))
    placement.assignments[0].gpu_indices[0] = 7
    cm.remove_pod("p")
    cm.verify()


def test_placements_round_trip_through_json_form():
    placement = Placement([Assignment("a", [1, 2], [1000, 1000])])
    assert Placement.from_dict(placement.to_dict()) == placement


# -- reports ------------------------------------------------------------------------------------


def test_why_not_counts_nodes_per_constraint():
    nodes = [Node(f"a{i}", 8, "A100") for i in range(6)]
    nodes += [h100("h1"), h100("h2"), h100("t", taints=("x=y:NoSchedule",))]
    cm = cluster(nodes=nodes)
    for i, name in enumerate(("h1", "h2")):
        cm.add_pod(Pod(f"x{i}", gpus=6), Placement([Assignment(name, list(range(6)), [1000] * 6)]))
    why = cm.why_not(Pod("p", gpus=4, gpu_models=("H100",)))
    assert why.excluded == {"gpu_model": 6, "taint": 1, "gpus": 2}
    assert why.message == "6 nodes lack H100, 1 tainted, 2 lack 4 free GPUs"
    assert not why.placeable


def test_why_not_says_a_pod_fits_when_it_does():
    cm = cluster(nodes=[h100("a")])
    assert cm.why_not(Pod("p")).placeable


def test_why_not_explains_a_gang_short_of_nodes():
    cm = cluster(nodes=[h100("a"), h100("b")])
    why = cm.why_not(Pod("g", nodes=3))
    assert why.message.endswith("gang needs 3 nodes, 2 fit")


def test_utilization_reports_overall_per_model_and_fragmentation():
    cm = cluster(nodes=[h100("h", gpus=2), Node("t", 2, "T4")])
    cm.schedule_pod(Pod("p", gpus=2, gpu_models=("H100",)))
    cm.schedule_pod(Pod("s", gpu_milli=500, gpu_models=("T4",)))
    report = cm.utilization()
    assert report["gpu"] == pytest.approx(2.5 / 4)
    assert report["by_model"] == {"H100": 1.0, "T4": 0.25}
    assert 0 < report["fragmentation"] < 1


def test_an_empty_cluster_reports_zeroes():
    assert ClusterManager().utilization() == {"gpu": 0.0, "by_model": {}, "fragmentation": 0.0}


def test_a_pod_retried_every_pass_counts_once_in_the_workload_mix():
    cm = cluster(nodes=[h100("a", gpus=1)])
    cm.schedule_pod(Pod("big", gpus=1))
    for _ in range(50):
        assert cm.schedule_pod(Pod("waiting", gpus=1)) is None
    assert sum(cm._seen.values()) == 2


def test_fgd_plus_sends_cpu_heavy_pods_where_cpu_is_spare():
    tight = Node("a-tight", 8, "G2", cpu_milli=96_000, memory_mib=100_000)
    rich = Node("b-rich", 2, "T4", cpu_milli=104_000, memory_mib=100_000)
    for strategy, expected in (("fgd-plus", "b-rich"), ("first-fit", "a-tight")):
        cm = cluster(strategy, [tight, rich])
        for i in range(64):  # the mix: one-GPU pods asking 12 cores each
            cm.schedule_pod(Pod(f"w{i}", gpus=1, cpu_milli=12_000))
            cm.remove_pod(f"w{i}")
        assert cm.schedule_pod(Pod("cpu", gpus=0, cpu_milli=32_000)).nodes == [expected]


def test_why_not_names_selector_share_cpu_and_memory():
    cm = cluster(
        nodes=[
            h100("a", labels={"disk": "hdd"}),
            h100("b", gpus=1, labels={"disk": "ssd"}),
            h100("c", cpu_milli=100, labels={"disk": "ssd"}),
            h100("d", memory_mib=10, labels={"disk": "ssd"}),
        ]
    )
    cm.add_pod(Pod("x", gpu_milli=800), Placement([Assignment("b", [0], [800])]))
    why = cm.why_not(
        Pod("p", gpu_milli=500, cpu_milli=1000, memory_mib=100, node_selector={"disk": "ssd"})
    )
    assert why.excluded == {"selector": 1, "gpu_share": 1, "cpu": 1, "memory": 1}
    assert "lack 1 GPU with 500m free" in why.message


class CountingDict(dict):
    """Counts node look-ups, to show a placement does not visit every node."""

    lookups = 0

    def __getitem__(self, key):
        CountingDict.lookups += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_placement_visits_a_few_nodes_not_all(strategy):
    nodes = [h100(f"n{i:04}", labels={"rack": f"r{i // 16}"}) for i in range(2000)]
    cm = cluster(strategy, nodes)
    for i in range(1500):  # make it busy and uneven
        cm.schedule_pod(Pod(f"fill{i}", gpus=1 + i % 4, cpu_milli=1000))
    cm._nodes = CountingDict(cm._nodes)
    CountingDict.lookups = 0
    for i in range(100):
        assert (
            cm.schedule_pod(Pod(f"p{i}", gpus=1 + i % 3, gpu_milli=1000 if i % 5 else 500))
            is not None
        )
    assert CountingDict.lookups / 100 < 20  # of 2,000 nodes (2 to 6 in practice)
    cm.verify()


def test_a_cpu_only_pod_keeps_to_its_gpu_models():
    cm = cluster(nodes=[Node("h", 8, "H100", cpu_milli=8000), Node("a", 8, "A100", cpu_milli=8000)])
    for i in range(3):
        placement = cm.schedule_pod(Pod(f"cpu{i}", gpus=0, cpu_milli=2000, gpu_models=("A100",)))
        assert placement.nodes == ["a"] and placement.assignments[0].gpu_indices == []
    assert cm.schedule_pod(Pod("cpu3", gpus=0, cpu_milli=4000, gpu_models=("A100",))) is None
    assert cm.why_not(Pod("x", gpus=0, gpu_models=("V100",))).excluded == {"gpu_model": 2}


def test_add_pods_restores_like_add_pod_one_by_one():
    nodes = [h100(f"n{i}", gpus=4) for i in range(3)]
    one, many = cluster(nodes=nodes), cluster(nodes=[h100(f"n{i}", gpus=4) for i in range(3)])
    made = []
    for i in range(5):
        pod = Pod(f"p{i}", gpus=2)
        made.append((pod, one.schedule_pod(pod)))
    many.cordon("n2")
    many.add_pods(made)
    many.verify()
    many.cordon("n2", False)
    many.verify()
    assert sorted(p.name for p in many.list_pods()) == [f"p{i}" for i in range(5)]
    assert [many.node_view(f"n{i}").free_milli for i in range(3)] == [
        one.node_view(f"n{i}").free_milli for i in range(3)
    ]
    with pytest.raises(ValueError):
        many.add_pods([(Pod("again", gpus=2), made[0][1])])  # those GPUs are taken
    many.verify()
