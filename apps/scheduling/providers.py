"""Where new nodes come from. A provider turns "N more nodes of this SKU" into machines and gives
them back; the autoscaler never knows which.

- `LocalProvider` (the `make run` demo and the tests): after the policy's provisioning lag it
  starts a fake-GPU node agent process on this machine; terminating sends it SIGTERM.

Writing another provider (Kubernetes, a cloud API) means implementing the same three calls:
`provision(policy, count)` asks for machines that will start `python -m workers.agent --node
NAME --sku SKU --gpus N` (a node pool template, an instance template with that start command),
recording a ProvisionRequest per machine; `advance()` notices machines that came up or failed;
`terminate(node)` deletes the machine after the autoscaler drained it. See docs/autoscaling.md.
"""

from __future__ import annotations

import logging
import os
import pathlib
import signal
import subprocess
import sys
import threading
import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.nodes.models import Node, NodeState
from apps.scheduling.models import AutoscalePolicy, ProvisionRequest, ProvisionState

log = logging.getLogger(__name__)
ROOT = pathlib.Path(__file__).resolve().parents[2]


class Provider:
    name = "base"

    def provision(self, policy: AutoscalePolicy, count: int) -> list[ProvisionRequest]:
        now = timezone.now()
        return [
            ProvisionRequest.objects.create(
                sku=policy.sku,
                provider=self.name,
                gpus=policy.gpus_per_node,
                node_name=f"auto-{_slug(policy.sku.name)}-{uuid.uuid4().hex[:6]}",
                ready_at=now + timedelta(seconds=policy.provision_lag_seconds),
            )  # fmt: skip
            for _ in range(count)
        ]

    def pending(self, policy: AutoscalePolicy) -> list[ProvisionRequest]:
        """Asked for and not yet a registered node (a started agent takes a moment to register)."""
        registered = Node.objects.filter(sku=policy.sku).values("name")
        return list(
            ProvisionRequest.objects.filter(
                sku=policy.sku, state__in=[ProvisionState.PENDING, ProvisionState.RUNNING]
            ).exclude(node_name__in=registered)
        )

    def advance(self) -> None:
        raise NotImplementedError

    def terminate(self, node: Node) -> None:
        raise NotImplementedError


def _agent_environment(node_name: str) -> dict[str, str]:
    """A local agent gets what one on another machine would: the web's URL, its own node
    credential and data dir; never this process's database URL or secret key."""
    from apps.nodes.credentials import issue_credential

    _, credential = issue_credential(node_name=node_name)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT),
        "LOG_LEVEL": os.environ.get("LOG_LEVEL", "INFO"), "GPUPLATFORM_URL": settings.PLATFORM_URL,
        "GPUPLATFORM_NODE_CREDENTIAL": credential,
        "GPUPLATFORM_DATA_DIR": str(pathlib.Path(settings.DATA_DIR) / "agents" / node_name),
    }  # fmt: skip


class LocalProvider(Provider):
    """Starts fake node agents as local processes once their lag has passed."""

    name = "local"

    def advance(self) -> None:
        self._fail_stragglers()
        due = ProvisionRequest.objects.filter(
            state=ProvisionState.PENDING, ready_at__lte=timezone.now()
        )
        for request in due.select_related("sku"):
            policy = request.sku.autoscale
            labels = ",".join(
                f"{k}={v}" for k, v in {**policy.labels, "autoscaled": "true"}.items()
            )
            argv = _agent_argv(request, labels)
            logs = pathlib.Path(settings.DATA_DIR) / "autoscaled"
            logs.mkdir(parents=True, exist_ok=True)
            with open(logs / f"{request.node_name}.log", "ab") as out:
                # Local "machines" stop with the dispatcher that started them (make run's Ctrl-C).
                process = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,  # noqa: S603
                                           stdin=subprocess.DEVNULL, start_new_session=True,
                                           env=_agent_environment(request.node_name),
                                           preexec_fn=_stop_with_parent)  # fmt: skip
            _reap_when_it_exits(process, request.node_name)
            ProvisionRequest.objects.filter(pk=request.pk).update(
                state=ProvisionState.RUNNING, pid=process.pid
            )
            log.info(
                "provisioned node %s (%s x %s), pid %s",
                request.node_name,
                request.gpus,
                request.sku,
                process.pid,
            )

    def _fail_stragglers(self, grace_s: float = 120.0) -> None:
        """A started agent that never registered (crashed on start) stops counting as coming."""
        late = timezone.now() - timedelta(seconds=grace_s)
        registered = Node.objects.values("name")
        ProvisionRequest.objects.filter(state=ProvisionState.RUNNING, ready_at__lt=late).exclude(
            node_name__in=registered
        ).update(state=ProvisionState.FAILED, ended_at=timezone.now())

    def terminate(self, node: Node) -> None:
        request = ProvisionRequest.objects.filter(
            node_name=node.name, state=ProvisionState.RUNNING
        ).first()
        Node.objects.filter(pk=node.pk).update(state=NodeState.TERMINATED, version=node.version + 1)
        self._revoke(node)
        if request is None or request.pid is None:
            return
        try:
            os.kill(request.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        ProvisionRequest.objects.filter(pk=request.pk).update(
            state=ProvisionState.TERMINATED, ended_at=timezone.now()
        )
        log.info("terminated node %s (pid %s)", node.name, request.pid)

    def _revoke(self, node: Node) -> None:
        """A machine given back keeps no way in: no agent API credential, no broker user."""
        from apps.nodes.credentials import revoke_node

        try:
            revoke_node(node_name=node.name)
        except Exception:  # Redis down: the credentials are revoked; the broker user outlives it
            log.exception("node %s: its broker user could not be deleted; run "
                          "`manage.py create_node_credential %s --revoke` again", node.name, node.name)  # fmt: skip


def _agent_argv(request: ProvisionRequest, labels: str) -> list[str]:
    return [sys.executable, "-m", "workers.agent", "--node", request.node_name, "--sku", request.sku.name,
            "--gpus", str(request.gpus), "--fake", "--labels", labels]  # fmt: skip


def _reap_when_it_exits(process: subprocess.Popen, node_name: str) -> None:
    """Wait for the agent in a thread of its own, so that when it exits (terminated, or crashed)
    its exit status is collected at once: a child nobody waits for stays a zombie under the
    dispatcher for as long as the dispatcher lives."""

    def wait() -> None:
        code = process.wait()
        log.info("local node %s's agent (pid %s) exited with %s", node_name, process.pid, code)

    threading.Thread(target=wait, name=f"reap-{node_name}", daemon=True).start()


def _stop_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-")


PROVIDERS = {"local": LocalProvider}


def get_provider() -> Provider:
    return PROVIDERS[settings.AUTOSCALE_PROVIDER]()
