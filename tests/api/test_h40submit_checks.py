"""A submit's body is checked by the thread's one JobSubmitSerializer through its own loop over
the fields (apps/jobs/serializers.py `JobSubmitSerializer.checked`), which passes over the
optional fields a body leaves out instead of having DRF raise and catch SkipField for each. For
good and bad bodies of every kind it must give exactly what a fresh serializer's `is_valid`
gives: the validated data, or the errors with their codes, twice over (nothing kept between
bodies)."""

import pytest
from rest_framework import serializers

from apps.jobs.serializers import JobSubmitSerializer, validate_submission
from tests.admission.conftest import TRAIN
from tests.factories import make_cast, make_node

pytestmark = pytest.mark.django_db

BODIES = [
    {"command": ["true"], "gpus": 1},
    {"command": ["true"]},
    TRAIN,
    {**TRAIN, "gpu_sku": None, "name": "any"},
    {**TRAIN, "template": "no-such", "gpu_sku": "no-such"},
    {"gpus": 1},
    {},
    {"command": "true", "gpus": "1"},
    {"command": ["true"], "gpus": -1, "nodes": 0},
    {"command": ["true"], "gpus": True},
    {"command": ["true"], "gpus": None, "nodes": None, "name": None},
    {"command": ["true"], "name": ""},
    {"command": ["true"], "name": "x" * 101},
    {"command": ["true"], "max_runtime_seconds": 0},
    {"command": ["true"], "max_runtime_seconds": 10**9},
    {"command": ["true"], "tier": "no-such"},
    {"command": ["true"], "node_selector": {"zone": "a"}, "cpu_weight": 10, "memory_mib": 64},
    {"command": ["true"], "node_selector": "zone=a"},
    {"command": ["true"], "retry_on_failure": "yes", "checkpointable": 1},
    {"command": ["true"], "env": {"A": "1"}, "secrets": ["db-password"]},
    {"command": ["true"], "env": {"1A": 2}, "secrets": "x"},
    {"command": ["true"], "bundle": "nothex"},
    {"command": ["true"], "python": {"requirements": 3}},
    {"command": ["true"], "image": "", "image_pull_secret": "x"},
    {"command": ["true"], "array": "0-9"},
    {"command": ["true"], "array": "0-9", "array_params": [{}]},
    {"command": ["true"], "array": [1, 2]},
    {"command": ["true"], "depends_on": "x"},
    {"command": ["true"], "depends_on": [{"job": "00000000", "condition": "afterok"}]},
    {"interactive": True, "idle_timeout_minutes": 0},
    {"interactive": True, "idle_timeout_minutes": 5},
    {"command": ["true"], "idle_timeout_minutes": 5},
    {**TRAIN, "command": ["true"]},
    {**TRAIN, "params": {"steps": "two"}},
    {"command": ["true"], "params": {"a": 1}},
]


def drfs_own(body):
    serializer = JobSubmitSerializer(data=body)
    if serializer.is_valid():
        return "valid", serializer.validated_data
    return "invalid", (
        serializer.errors,
        serializers.ValidationError(serializer.errors).get_codes(),
    )


def ours(body):
    try:
        return "valid", validate_submission(body)
    except serializers.ValidationError as error:
        return "invalid", (error.detail, error.get_codes())


@pytest.mark.parametrize("index", range(len(BODIES)))
def test_the_shared_serializers_answer_is_a_fresh_ones(index):
    make_cast()
    make_node("h1", "H100-80GB", 8)
    body = BODIES[index]
    expected = drfs_own(dict(body))
    assert ours(dict(body)) == expected
    assert ours(dict(body)) == expected  # again: nothing kept from the first


def test_a_good_body_after_a_bad_one_and_back():
    make_cast()
    make_node("h1", "H100-80GB", 8)
    for body in [BODIES[7], BODIES[0], BODIES[5], TRAIN, BODIES[8]]:
        assert ours(dict(body)) == drfs_own(dict(body))
