"""What the policy needs of a cluster: place and unplace pods, cordon nodes, read a node's state.

`ClusterManager` satisfies it; the policy holds nothing else of the placement core, so a test or
another placement engine can stand in with these eight methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from apps.scheduling.core.cluster import NodeView
from apps.scheduling.core.model import Node, Placement, Pod

if TYPE_CHECKING:
    from apps.scheduling.core.cluster import ClusterManager


class PolicyCluster(Protocol):
    def list_nodes(self) -> list[Node]:
        """Every node, in a stable order."""
        ...

    def add_node(self, node: Node) -> None: ...

    def remove_node(self, name: str) -> object:
        """Forget an (empty) node; what it returns is not used."""
        ...

    def cordon(self, name: str, cordoned: bool = True) -> None:
        """Stop (or resume) placing new pods on a node; its pods stay."""
        ...

    def node_view(self, name: str) -> NodeView:
        """The node's free GPU thousandths, GPU health and whether it is cordoned."""
        ...

    def schedule_pod(self, pod: Pod) -> Placement | None:
        """Find room and allocate in one step; None (and no change) when nothing fits."""
        ...

    def add_pod(self, pod: Pod, placement: Placement) -> None:
        """Record an allocation decided earlier."""
        ...

    def remove_pod(self, name: str) -> object:
        """Free a pod's resources (idempotent); what it returns is not used."""
        ...


if TYPE_CHECKING:  # mypy proves here that the placement core satisfies the protocol

    def _cluster_manager_is_a_policy_cluster(cluster: ClusterManager) -> PolicyCluster:
        return cluster
