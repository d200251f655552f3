"""The set-up the in-process profilers share (bench._profile_submit, _profile_reports, _profile_start,
_profile_drain): a fresh SQLite file (or a fresh PostgreSQL database beside DATABASE_URL's), an
embedded Redis, the migrations and the e2e cast (tests/e2e/seed.py), then Django set up here."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def django_in_process() -> Iterator[str]:
    """Yields bob's API token, with Django set up in this process; stops the Redis after."""
    os.environ.setdefault("SECRET_KEY", "bench-only")
    with tempfile.TemporaryDirectory(prefix="gpuplatform-profile-") as tmp:
        from gpuplatform import embedded_redis
        from tests.e2e.platform import fresh_database_url

        redis_server = embedded_redis.start(pathlib.Path(tmp) / "redis", persist=False)
        os.environ["REDIS_URL"] = redis_server.url
        os.environ["DATABASE_URL"] = fresh_database_url(pathlib.Path(tmp), "profile")
        os.environ["GPUPLATFORM_DATA_DIR"] = tmp
        try:
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
            )
            seed = subprocess.run([sys.executable, "-m", "tests.e2e.seed"], cwd=ROOT, env=env,
                                  check=True, capture_output=True, text=True)  # fmt: skip
            token = json.loads(seed.stdout.strip().splitlines()[-1])["bob"]
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpuplatform.settings")
            import django

            django.setup()
            yield token
        finally:
            redis_server.stop()


def peer_cluster():
    """bench.slurm_peer's shape through the services, after `django_in_process`: 4 nodes x 4 GPUs
    (`peer-0`..`peer-3`), and bob's membership with a one-GPU `true` JobSpec to submit with
    (`enqueue.job_submit(tenant=member.tenant, user=member.user, spec=spec)`)."""
    from apps.jobs import services
    from apps.tenants.models import Membership
    from tests.factories import make_node

    for i in range(4):
        make_node(f"peer-{i}", gpus=4)
    member = Membership.objects.select_related("user", "tenant").get(user__username="bob")
    spec = services.JobSpec(name="", tier=member.tenant.tier, template=None, params={},
                            command=["true"], gpus=1, nodes=1, gpu_sku=None, node_selector={},
                            max_runtime_seconds=3600, checkpointable=False, cacheable=False)  # fmt: skip
    return member, spec
