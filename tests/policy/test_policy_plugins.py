"""The policy's extension points: each rule is a named class in a registry, not a branch."""

from collections.abc import Iterator

import pytest

from apps.scheduling.core import ClusterManager, Node
from apps.scheduling.core.policy import (
    ORDERINGS,
    VICTIM_COSTS,
    PolicyConfig,
    QueuedJob,
    Scheduler,
    Start,
    default_tiers,
)
from apps.scheduling.core.policy.backfill import BACKFILLS
from apps.scheduling.core.policy.sort import Fifo


def test_the_registries_name_every_rule_the_config_may_choose():
    assert sorted(ORDERINGS) == ["fair", "fifo", "level-fifo", "slurm"]
    assert sorted(VICTIM_COSTS) == ["checkpoint", "youngest"]
    assert sorted(BACKFILLS) == ["easy", "off"]


def test_an_unknown_ordering_or_victim_cost_is_refused_when_the_scheduler_is_built():
    with pytest.raises(ValueError, match="unknown ordering 'lifo'"):
        Scheduler(ClusterManager(), default_tiers(), PolicyConfig(ordering="lifo"))
    with pytest.raises(ValueError, match="unknown victim_cost 'oldest'"):
        Scheduler(ClusterManager(), default_tiers(), PolicyConfig(victim_cost="oldest"))


class NewestFirst(Fifo):
    """A rule the policy does not have: the latest submit goes first."""

    name = "newest-first"

    def order(self, s, now, shares) -> Iterator[QueuedJob]:
        return iter(sorted(s.queued.values(), key=lambda j: -j.submit))


def test_a_new_queue_order_is_one_class_in_the_registry(monkeypatch):
    monkeypatch.setitem(ORDERINGS, NewestFirst.name, NewestFirst)
    config = PolicyConfig(ordering="newest-first", backfill=False, preemption=False)
    scheduler = Scheduler(ClusterManager("first-fit"), default_tiers(), config)
    scheduler.add_node(Node("n0", 4, "A100"))
    for i in range(3):
        scheduler.submit(QueuedJob(f"j{i}", "t", "free", 4, float(i), 100.0))
    started = [d.job_id for d in scheduler.decide(10.0) if isinstance(d, Start)]
    assert started == ["j2"]
