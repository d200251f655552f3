"""The policies the simulator compares, as tier settings plus a `PolicyConfig` each.

- `default`: our policy (core/policy/): enterprise on its own level above pro and free; pro and free
  share a level 3:1 by weight with guaranteed shares 30% / 10%; aging capped at the share (an
  aged job goes ahead only while its tenant is below its max-min share of its tier and the job
  fits in the shortfall; past 3.5 x the age limit, the level's oldest job, one at a time); EASY
  backfill; checkpoint-aware preemption with a 10-minute minimum runtime (free) and at most 3
  preemptions a job.
- `fair-reclaim`: `default` with its overdue job at 2 x the age limit (opt-in,
  `GPUPLATFORM_POLICY=fair-reclaim` in the platform), plus tenant reclaim: a tenant below its
  share that waited 30 minutes preempts a job of a tenant above its share, which stays at or
  above it (no loop).
- `fifo`: submit order, head-of-line blocking, no backfill, no preemption.
- `strict`: three strict levels (enterprise > pro > free), submit order inside a level, EASY
  backfill, the same preemption safeguards as `default`, no fair share and no aging.
- `slurm`: our rendering of Slurm's documented behaviour with the peer's slurm.conf
  (../shared/peers/slurm): priority/multifactor with weights QOS 100000, FairShare 10000,
  Age 1000, PriorityMaxAge 7 days, PriorityDecayHalfLife 7 days, QOS priorities 1000/100/10;
  EASY backfill; preempt/qos with REQUEUE (higher QOS preempts the lower, preemptible one), no
  PreemptExemptTime (no minimum runtime), no cap, victims chosen youngest first (not
  checkpoint-aware).
"""

from __future__ import annotations

from dataclasses import replace

from apps.scheduling.core.policy import FAIR_RECLAIM, PolicyConfig, TierPolicy, default_tiers

POLICIES = ("default", "fair-reclaim", "fifo", "strict", "slurm")
DAY = 24 * 3600.0


def policy_preset(
    name: str, *, grace_s: float = 0.0, depth: int = 256
) -> tuple[dict[str, TierPolicy], PolicyConfig]:
    tiers = default_tiers()
    if name == "default":
        return tiers, PolicyConfig(grace_s=grace_s, backfill_depth=depth)
    if name == "fair-reclaim":
        return tiers, PolicyConfig(grace_s=grace_s, backfill_depth=depth, **FAIR_RECLAIM)
    if name == "fifo":
        config = PolicyConfig(
            ordering="fifo", backfill=False, preemption=False, grace_s=grace_s,
            aging_within_share=False,  # no aging at all; the report's bound is A_T + R
        )  # fmt: skip
        return tiers, config
    levels = {"enterprise": 3, "pro": 2, "free": 1}
    if name == "strict":
        tiers = {
            k: replace(
                t, level=levels.get(k, t.level), guaranteed_share=0.0, age_limit_s=float("inf")
            )
            for k, t in tiers.items()
        }
        return tiers, PolicyConfig(ordering="level-fifo", grace_s=grace_s, backfill_depth=depth)
    if name == "slurm":
        tiers = {
            k: replace(
                t, level=levels.get(k, t.level), guaranteed_share=0.0, min_runtime_s=0.0,
                max_preemptions=10**9, age_limit_s=float("inf"),
            )
            for k, t in tiers.items()
        }  # fmt: skip
        config = PolicyConfig(
            ordering="slurm", victim_cost="youngest", half_life_s=7 * DAY,
            grace_s=grace_s, backfill_depth=depth,
        )  # fmt: skip
        return tiers, config
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
