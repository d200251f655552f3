"""Preemption planning: the cheapest set of victims that makes room for one job.

The cost of a victim is the GPU-time it loses: its GPUs x (time since its last checkpoint +
its restart cost). Per node, the planner covers the node's GPU deficit with the cheapest victims
(greedy by cost per GPU, then pruned, compared with the cheapest single victim that covers it
alone); a gang of k nodes takes the k cheapest nodes. Victims shared between nodes (gangs) are
counted once. Ties go to fewer victims. Whether the job then really fits is checked by the
caller against the placement core; if it does not, nothing is preempted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def plan_victims(
    gpus: int,
    nodes: int,
    allowed_models: set[str],
    free: dict[str, int],
    model_of: dict[str, str],
    candidates: list[Any],
    cost: Callable[[Any], float],
) -> tuple[list[Any], float] | None:
    """Victims (running jobs with `.alloc` = [(node, gpus)]) so that `nodes` x `gpus` fit.

    O(V log V) for V candidate victims plus O(N log N) over the nodes they touch. Returns
    `(victims, total_cost)` or None when even preempting every candidate would not make room.
    """
    on_node: dict[str, list[tuple[float, int, Any]]] = {}
    for victim in candidates:
        c = cost(victim)
        for node, n in victim.alloc:
            if model_of.get(node) in allowed_models:
                on_node.setdefault(node, []).append((c, n, victim))
    plans: list[tuple[float, int, str, list[Any]]] = []
    free_nodes = 0
    for node, f in free.items():
        if f >= gpus and model_of[node] in allowed_models:
            free_nodes += 1
            if free_nodes >= nodes:
                return None  # it fits without preemption: the caller should not be here
    for node, victims in on_node.items():
        deficit = gpus - free[node]
        if deficit <= 0:
            continue
        plan = _cover(deficit, victims)
        if plan is not None:
            plans.append((plan[0], len(plan[1]), node, plan[1]))
    if free_nodes + len(plans) < nodes:
        return None
    plans.sort(key=lambda p: (p[0], p[1]))
    chosen: dict[int, Any] = {}
    for _, _, _, on_it in plans[: nodes - free_nodes]:
        for victim in on_it:
            chosen[id(victim)] = victim
    picked = list(chosen.values())
    return picked, sum(cost(v) for v in picked)


def _cover(deficit: int, victims: list[tuple[float, int, Any]]) -> tuple[float, list[Any]] | None:
    """Cheapest victims on one node whose GPUs there add up to `deficit`."""
    if sum(n for _, n, _ in victims) < deficit:
        return None
    best_single = min(((c, [v]) for c, n, v in victims if n >= deficit), default=None, key=_key)
    greedy: list[tuple[float, int, Any]] = []
    covered = 0
    for c, n, v in sorted(victims, key=lambda e: (e[0] / e[1], e[0])):
        greedy.append((c, n, v))
        covered += n
        if covered >= deficit:
            break
    # Drop victims the others already cover, most expensive first.
    for item in sorted(greedy, key=lambda e: -e[0]):
        if covered - item[1] >= deficit:
            greedy.remove(item)
            covered -= item[1]
    multi = (sum(c for c, _, _ in greedy), [v for _, _, v in greedy])
    if best_single is not None and _key(best_single) <= _key(multi):
        return best_single
    return multi


def _key(plan: tuple[float, list[Any]]) -> tuple[float, int]:
    return plan[0], len(plan[1])
