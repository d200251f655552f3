"""Seeded random interleavings on PostgreSQL (issue 36; tests/concurrency/stress.py): submits
(identical and not, with and without Idempotency-Key), arrays, dependencies on jobs and arrays,
cancels, agents' starts, finishes and preemption ends, dispatcher passes and reconcile ticks,
all at once; then every invariant of docs/reliability.md's "Concurrency" is read from the
database. Replay a seed with GPUPLATFORM_STRESS_SEED=<seed>."""

import pytest
from django.test import override_settings

from tests.concurrency.stress import ON_POSTGRESQL, SEED_ENV, Run, seeds

pytestmark = [ON_POSTGRESQL, pytest.mark.django_db(transaction=True)]


# No node is lost and no lease runs out in a run of seconds: every requeue is a preemption's,
# and every end is one an agent reported.
@override_settings(HEARTBEAT_SECONDS=300, STARTING_TIMEOUT_SECONDS=300)
@pytest.mark.parametrize("seed", seeds(), ids=lambda seed: f"seed={seed}")
def test_every_invariant_holds_under_random_interleavings(seed, server_evidence):
    print(f"\nconcurrency stress: seed {seed} (replay: {SEED_ENV}={seed})")
    run = Run(seed)
    run.forget_evidence()  # an earlier failure's, if this seed failed before
    run.setup()
    run.play()
    broken = run.check()
    print(f"seed {seed}: {run.seconds}, aborted and run again: {dict(run.retried) or 'none'}")
    if broken:
        path = run.evidence(broken)
        summary = "; ".join(
            f"{name} ({len(items)}): {items[0][:300]}" for name, items in broken.items()
        )
        pytest.fail(
            f"seed {seed}: {summary}\nevidence: {path}\nreplay: {SEED_ENV}={seed} "
            "python -m pytest tests/concurrency",
            pytrace=False,
        )
