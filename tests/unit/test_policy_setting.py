"""GPUPLATFORM_POLICY picks the dispatcher's PolicyConfig."""

import pytest

from apps.scheduling import dispatcher


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["fair", "level-fifo", "fifo", "slurm"])
def test_plain_policies_are_orderings(settings, name):
    settings.SCHEDULING_POLICY = name
    config = dispatcher.policy_config(None)
    assert config.ordering == name
    assert not config.tenant_reclaim
    # Aging capped at the share is the `fair` order's default since issue 18 (other orders
    # ignore it); gangs age with the rest of their tenant's queue.
    assert config.aging_within_share and config.aging_above_share == 3.5
    assert not config.aging_gangs_at_limit


@pytest.mark.django_db
def test_fair_reclaim_is_fair_with_fair_share_inside_tiers(settings):
    settings.SCHEDULING_POLICY = "fair-reclaim"
    config = dispatcher.policy_config(None)
    assert config.ordering == "fair"
    assert config.tenant_reclaim and config.aging_within_share
    assert config.reclaim_after_s == 1800.0
    assert config.aging_above_share == 2.0 and not config.aging_gangs_at_limit
