"""What preempting a running job costs: the rule the victim planner (preempt.py) minimises.

`PolicyConfig.victim_cost` names one of `VICTIM_COSTS`; a new rule is a new class there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from apps.scheduling.core.policy.model import RunningJob, last_checkpoint


class VictimCost(Protocol):
    name: str

    def cost(self, victim: RunningJob, now: float) -> float:
        """GPU-seconds lost if `victim` is stopped at `now`."""
        ...


class SinceCheckpoint:
    """GPUs x (time since its last checkpoint + its restart cost): the work a restart redoes."""

    name = "checkpoint"

    def cost(self, victim: RunningJob, now: float) -> float:
        gpus = victim.gpus * victim.nodes
        return gpus * (now - last_checkpoint(victim, now) + victim.restart_cost_s)


class Youngest:
    """GPUs x time in its current attempt (Slurm-like: checkpoints are not seen)."""

    name = "youngest"

    def cost(self, victim: RunningJob, now: float) -> float:
        return victim.gpus * victim.nodes * (now - victim.started_at)


VICTIM_COSTS: dict[str, Callable[[], VictimCost]] = {
    cls.name: cls for cls in (SinceCheckpoint, Youngest)
}


def make_victim_cost(name: str) -> VictimCost:
    make = VICTIM_COSTS.get(name)
    if make is None:
        raise ValueError(f"unknown victim_cost {name!r}; choose one of {sorted(VICTIM_COSTS)}")
    return make()
