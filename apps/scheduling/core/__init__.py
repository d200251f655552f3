"""The pure placement core: cluster state, free-capacity indexes, strategies, gangs.

No Django, DRF, Celery or Redis import here (checked by scripts.check_core_imports): the
dispatcher, the simulator and the benchmarks all run this same code.
"""

from .cluster import ClusterManager, NodeView, WhyNot, choose_gang, restore
from .frag import Workload, node_fragmentation
from .model import MILLI, Assignment, Node, Placement, Pod, Taint, Toleration
from .strategies import (
    DEFAULT,
    FGD,
    STRATEGIES,
    BestFit,
    BinPack,
    FGDPlus,
    FirstFit,
    Spread,
    Strategy,
)

__all__ = [
    "DEFAULT",
    "FGD",
    "MILLI",
    "STRATEGIES",
    "Assignment",
    "BestFit",
    "BinPack",
    "ClusterManager",
    "FGDPlus",
    "FirstFit",
    "Node",
    "NodeView",
    "Placement",
    "Pod",
    "Spread",
    "Strategy",
    "Taint",
    "Toleration",
    "WhyNot",
    "Workload",
    "choose_gang",
    "node_fragmentation",
    "restore",
]
