"""Long random sequences of node and pod operations, checked against a brute-force reference.

The reference keeps its own books (free thousandths per GPU, CPU, memory, who holds what) and
answers every question by looking at every node. After each step the core's books and indexes
must equal a recomputation, and every decision must agree with the brute-force one.

Set CORE_HYPOTHESIS_EXAMPLES (default 30) for longer runs, e.g. 1000 before a release.
"""

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from apps.scheduling.core import STRATEGIES, Assignment, ClusterManager, Node, Placement, Pod
from apps.scheduling.core.cluster import node_verdict

EXAMPLES = int(os.environ.get("CORE_HYPOTHESIS_EXAMPLES", "30"))
NODE_NAMES = [f"n{i}" for i in range(8)]
POD_NAMES = [f"p{i}" for i in range(12)]
MODELS = ["A100", "H100"]
TAINTS = ["", "dedicated=ml:NoSchedule", "spot=yes:PreferNoSchedule"]
TOLERATIONS = [(), ("dedicated=ml:NoSchedule",), ("spot:PreferNoSchedule",), ("*",)]

nodes = st.builds(
    lambda name, gpus, model, cpu, mem, rack, zone, taint: Node(
        name,
        gpus,
        model,
        cpu,
        mem,
        labels={k: v for k, v in (("rack", rack), ("zone", zone)) if v},
        taints=(taint,) if taint else (),
    ),
    st.sampled_from(NODE_NAMES),
    st.integers(0, 4),
    st.sampled_from(MODELS),
    st.sampled_from([0, 4000, 16000]),
    st.sampled_from([0, 1000, 64000]),
    st.sampled_from([None, "r1", "r2"]),
    st.sampled_from([None, "z1", "z2"]),
    st.sampled_from(TAINTS),
)

pods = st.builds(
    lambda name, gpus, milli, cpu, mem, models, rack, tolerations, gang: Pod(
        name,
        gpus=gpus,
        gpu_milli=milli if gpus else 1000,
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_models=models,
        node_selector={"rack": rack} if rack else {},
        tolerations=tolerations,
        nodes=gang,
    ),
    st.sampled_from(POD_NAMES),
    st.integers(0, 4),
    st.sampled_from([1000, 1000, 250, 500, 700]),
    st.sampled_from([0, 0, 1000, 4000]),
    st.sampled_from([0, 0, 500]),
    st.sampled_from([(), (), ("H100",), ("A100", "H100")]),
    st.sampled_from([None, None, None, "r1"]),
    st.sampled_from(TOLERATIONS),
    st.sampled_from([1, 1, 1, 2, 3]),
)


class Reference:
    """Brute-force books: everything by looking at every node."""

    def __init__(self):
        self.nodes: dict[str, Node] = {}
        self.free: dict[str, list[int]] = {}
        self.healthy: dict[str, list[bool]] = {}
        self.cpu: dict[str, int] = {}
        self.mem: dict[str, int] = {}
        self.cordoned: set[str] = set()
        self.pods: dict[str, tuple[Pod, Placement]] = {}

    def add_node(self, node):
        self.nodes[node.name] = node
        self.free[node.name] = [1000] * node.gpus
        self.healthy[node.name] = [True] * node.gpus
        self.cpu[node.name] = node.cpu_milli
        self.mem[node.name] = node.memory_mib

    def holders(self, node_name):
        return sorted(n for n, (_, pl) in self.pods.items() if node_name in pl.nodes)

    def apply(self, pod, placement, sign):
        for a in placement.assignments:
            for i, m in zip(a.gpu_indices, a.gpu_milli, strict=True):
                self.free[a.node][i] -= sign * m
            self.cpu[a.node] -= sign * pod.cpu_milli
            self.mem[a.node] -= sign * pod.memory_mib
        if sign > 0:
            self.pods[pod.name] = (pod, placement)
        else:
            del self.pods[pod.name]

    def hosts(self, pod, name, pool_verdicts=("ok",)):
        """Can node `name` take one member of `pod` now (static filters of the given tiers)?"""
        if (
            name in self.cordoned
            or self.cpu[name] < pod.cpu_milli
            or self.mem[name] < pod.memory_mib
        ):
            return False
        roomy = [
            i for i, f in enumerate(self.free[name]) if self.healthy[name][i] and f >= pod.gpu_milli
        ]
        return len(roomy) >= pod.gpus

    def restorable(self, pod, placement):
        if pod.name in self.pods or len(placement.assignments) != pod.nodes:
            return False
        if len(set(placement.nodes)) != pod.nodes:
            return False
        for a in placement.assignments:
            if a.node not in self.nodes or len(a.gpu_indices) != pod.gpus:
                return False
            if any(m != pod.gpu_milli for m in a.gpu_milli):
                return False
            if any(
                i >= len(self.free[a.node]) or self.free[a.node][i] < pod.gpu_milli
                for i in a.gpu_indices
            ):
                return False
            if self.cpu[a.node] < pod.cpu_milli or self.mem[a.node] < pod.memory_mib:
                return False
        return True


class PlacementMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.ref = Reference()

    @initialize(strategy=st.sampled_from(sorted(STRATEGIES)))
    def start(self, strategy):
        self.cm = ClusterManager(strategy)

    # -- nodes --

    @rule(node=nodes)
    def add_node(self, node):
        if node.name in self.ref.nodes:
            return
        self.cm.add_node(node)
        self.ref.add_node(node)

    @precondition(lambda self: self.ref.nodes)
    @rule(data=st.data())
    def remove_node(self, data):
        name = data.draw(st.sampled_from(sorted(self.ref.nodes)))
        expected = self.ref.holders(name)
        evicted = self.cm.remove_node(name)
        assert [p.name for p in evicted] == expected
        for pod_name in expected:
            pod, placement = self.ref.pods[pod_name]
            self.ref.apply(pod, placement, -1)
        for table in (self.ref.nodes, self.ref.free, self.ref.healthy, self.ref.cpu, self.ref.mem):
            del table[name]
        self.ref.cordoned.discard(name)

    @precondition(lambda self: self.ref.nodes)
    @rule(data=st.data(), cordoned=st.booleans())
    def cordon(self, data, cordoned):
        name = data.draw(st.sampled_from(sorted(self.ref.nodes)))
        self.cm.cordon(name, cordoned)
        (self.ref.cordoned.add if cordoned else self.ref.cordoned.discard)(name)

    @precondition(lambda self: any(n.gpus for n in self.ref.nodes.values()))
    @rule(data=st.data(), healthy=st.booleans())
    def set_gpu_health(self, data, healthy):
        name = data.draw(
            st.sampled_from(sorted(n for n, node in self.ref.nodes.items() if node.gpus))
        )
        index = data.draw(st.integers(0, self.ref.nodes[name].gpus - 1))
        self.cm.set_gpu_health(name, index, healthy)
        self.ref.healthy[name][index] = healthy

    # -- pods --

    @rule(pod=pods)
    def schedule_pod(self, pod):
        if pod.name in self.ref.pods:
            return
        before = self.snapshot()
        placement = self.cm.schedule_pod(pod)
        tiers = self.eligible(pod)
        if placement is None:
            assert self.snapshot() == before  # all or nothing
            for tier in tiers:
                assert len([n for n in tier if self.ref.hosts(pod, n)]) < pod.nodes, (
                    "it fits somewhere"
                )
            return
        assert len(placement.assignments) == pod.nodes
        assert len(set(placement.nodes)) == pod.nodes
        allowed = next(
            t for t in tiers if len([n for n in t if self.ref.hosts(pod, n)]) >= pod.nodes
        )
        for a in placement.assignments:
            assert a.node in allowed and self.ref.hosts(pod, a.node)
            assert a.gpu_milli == [pod.gpu_milli] * pod.gpus
            assert all(
                self.ref.healthy[a.node][i] and self.ref.free[a.node][i] >= pod.gpu_milli
                for i in a.gpu_indices
            )
        if pod.nodes == 1:
            self.check_best(pod, placement, allowed)
        self.ref.apply(pod, placement, +1)

    @rule(pod=pods, data=st.data())
    def add_pod(self, pod, data):
        names = sorted(self.ref.nodes) or ["ghost"]
        parts = []
        for node_name in data.draw(
            st.lists(st.sampled_from(names + ["ghost"]), min_size=1, max_size=3)
        ):
            indices = data.draw(st.lists(st.integers(0, 4), max_size=4, unique=True))
            parts.append(Assignment(node_name, indices, [pod.gpu_milli] * len(indices)))
        placement = Placement(parts)
        ok = self.ref.restorable(pod, placement)
        before = self.snapshot()
        try:
            self.cm.add_pod(pod, placement)
        except ValueError:
            assert not ok
            assert self.snapshot() == before
        else:
            assert ok
            self.ref.apply(pod, placement, +1)

    @precondition(lambda self: self.ref.pods)
    @rule(data=st.data())
    def remove_pod(self, data):
        name = data.draw(st.sampled_from(sorted(self.ref.pods)))
        pod, placement = self.ref.pods[name]
        assert self.cm.remove_pod(name) == placement
        self.ref.apply(pod, placement, -1)

    @rule(name=st.sampled_from(POD_NAMES))
    def remove_unknown_pod(self, name):
        if name not in self.ref.pods:
            assert self.cm.remove_pod(name) is None

    # -- checks --

    @invariant()
    def books_match(self):
        if not hasattr(self, "cm"):
            return
        self.cm.verify()
        assert self.snapshot() == self.ref_snapshot()
        assert sorted(p.name for p in self.cm.list_pods()) == sorted(self.ref.pods)

    def snapshot(self):
        out = {}
        for node in self.cm.list_nodes():
            view = self.cm.node_view(node.name)
            out[node.name] = (view.free_milli, view.cpu_free, view.memory_free, view.pods)
        return out

    def ref_snapshot(self):
        return {
            n: (self.ref.free[n], self.ref.cpu[n], self.ref.mem[n], self.ref.holders(n))
            for n in sorted(self.ref.nodes)
        }

    def eligible(self, pod):
        """Node names per tier: untainted or tolerated first, then PreferNoSchedule ones."""
        first, second = [], []
        for name in sorted(self.ref.nodes):
            verdict = node_verdict(self.cm._nodes[name], pod)
            (first if verdict == "ok" else second if verdict == "prefer-not" else []).append(name)
        return [first, first + second] if pod.nodes > 1 else [first, second]

    def check_best(self, pod, placement, allowed):
        """The indexed choice equals the brute-force best over every node that fits."""
        strategy = self.cm.strategy
        fitting = [n for n in allowed if self.ref.hosts(pod, n)]

        def rank(name):
            st_ = self.cm._nodes[name]
            if strategy.uses_classes:
                return (
                    strategy.class_score(st_.pool.gpu_model, st_.shape(), st_.cpu_free, pod)[0],
                    name,
                )
            return (*strategy.order_key(st_), name)

        # The chosen node already holds the pod: rank every node as it was before the decision.
        self.cm.remove_pod(pod.name)
        try:
            assert placement.nodes[0] == min(fitting, key=rank)
        finally:
            self.cm.add_pod(pod, placement)


TestPlacementMachine = PlacementMachine.TestCase
TestPlacementMachine.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
