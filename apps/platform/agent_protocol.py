"""The agent API's wire types (pure Python: the node agent imports this, never Django).

Both ends build and read these dicts through the functions here, so a field added on one side
is added on the other. Endpoints and their rules: docs/architecture.md, "Agent API".
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from dataclasses import dataclass, field

API_PREFIX = "/internal/agent/v1"
AUTH_SCHEME = "Bearer"  # Authorization: Bearer <node credential>
ATTEMPT_TOKEN_HEADER = "X-Attempt-Token"  # the fencing token of the member a request is about
LOG_OFFSET_HEADER = "X-Log-Offset"  # a log chunk's first byte: appended only where the log ends
CHECKPOINT_NAME_HEADER = "X-Checkpoint-Name"  # the checkpoint file's own name (no directories)
BUNDLE_SHA256_HEADER = "X-Bundle-Sha256"  # the digest of the bundle a member's GET bundle/ streams
CREDENTIAL_PREFIX = "gpn_"
# `POST /reports/`: several members' reports in one call, each item fenced by its own token.
REPORT_KINDS = ("started", "progress", "finished", "lost")
MAX_REPORTS_PER_CALL = 200
# A signed start message (below) is good for this long after it was signed, as the broker's own
# expiry of the message (apps/scheduling/publish.py).
START_MESSAGE_SECONDS = 300


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    memory_mib: int = 0
    healthy: bool = True
    utilization_percent: int | None = None
    memory_used_mib: int | None = None


@dataclass(frozen=True)
class Assignment:
    """Everything a node agent needs to run one member of an attempt."""

    job_id: str
    attempt_id: int
    attempt_number: int
    rank: int
    token: str
    argv: list[str]
    params: dict
    gpu_indices: list[int]
    world_size: int
    master_addr: str
    master_port: int
    max_runtime_seconds: int
    checkpoint: str
    stop_requested: str
    active: bool
    grace_seconds: int = 30  # checkpoint signal -> SIGTERM on preemption
    checkpoint_signal: str = "SIGUSR1"
    # The member's cgroup limits on a fencing node (workers/isolation.py); 0: the node's default
    # (GPUPLATFORM_JOB_MEMORY_MIB, GPUPLATFORM_JOB_PIDS_MAX, GPUPLATFORM_JOB_CPU_WEIGHT). From
    # the job's fields of these names: its submit body's, else its template's.
    memory_mib: int = 0
    pids_max: int = 0
    cpu_weight: int = 0  # cgroup v2 scale, 1..10000 (100 the default)
    # The stored checkpoint it resumes from: "" none, None not looked up (in lists; fetch to know).
    resume_from: str | None = None
    # Own code (docs/own-code.md): the bundle's sha256 ("" none: the command runs in an empty work
    # dir), extra environment variables, the names of the secrets to set (their values come from
    # the member's secrets endpoint, never in a message), the Python requirements of an
    # environment built on the node (a bundle's requirements.txt is read there, too).
    bundle: str = ""
    env: dict = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    python_requirements: list[str] = field(default_factory=list)
    # A job array's task (docs/arrays.md): its index, set as GPUPLATFORM_ARRAY_INDEX and
    # SLURM_ARRAY_TASK_ID in its environment; None for a job outside an array.
    array_index: int | None = None
    # The job has dependencies (docs/pipelines.md): the agent downloads its parents' artifacts
    # from the member's inputs endpoint before it starts, into GPUPLATFORM_INPUT_DIR.
    inputs: bool = False
    # An OCI image as the member's root (docs/images.md): the reference as submitted ("" none),
    # the manifest digest its job's first pull fixed ("" not yet: this pull fixes it, reported
    # through the member's image endpoint), and whether the member's secrets endpoint carries
    # the registry's `user:password` (`image_auth`, never in a message).
    image: str = ""
    image_digest: str = ""
    image_auth: bool = False
    # An interactive job (docs/interactive.md): its process only holds the allocation
    # (`INTERACTIVE_HOLD`); the agent ends it when its shell exits or after this many seconds
    # with nothing typed or printed through its sessions.
    interactive: bool = False
    idle_timeout_seconds: float = 0


# What an interactive job's process runs: it waits for the agent to write its shell's exit status
# into `.gpuplatform/interactive-exit` of its work dir (workers/sessions.py), and exits with it.
INTERACTIVE_HOLD = [
    "{python}", "-c",
    "import os, pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
    "path = pathlib.Path(os.environ['GPUPLATFORM_PROGRESS_FILE']).with_name('interactive-exit')\n"
    "while not path.exists():\n    time.sleep(0.2)\n"
    "sys.exit(int(path.read_text().strip() or 0) & 255)\n",
]  # fmt: skip


def to_wire(value) -> dict:
    return dataclasses.asdict(value)


def gpu_from_wire(data: dict) -> GpuInfo:
    return _from_wire(GpuInfo, data)


def assignment_from_wire(data: dict) -> Assignment:
    return _from_wire(Assignment, data)


def _from_wire(cls, data: dict):
    """Known fields only: a newer server may send more than this agent knows."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def log_name(job_id: str, attempt_number: int, rank: int) -> str:
    """Where a member's log lives in the platform's storage (the web reads it there)."""
    suffix = "" if rank == 0 else f".rank-{rank}"
    return f"logs/{job_id}/attempt-{attempt_number}{suffix}.log"


def members_digest(members: list[dict]) -> str:
    """What a heartbeat's members list says the agent must act on (which members, their tokens,
    stop requests and activity), as a short digest: the agent sends back the last one it got,
    and an unchanged list is not sent again. Both ends compute it here."""
    keys = sorted(
        (m["attempt_id"], m["rank"], m["token"], m["stop_requested"], bool(m["active"]))
        for m in members
    )
    return hashlib.sha256(repr(keys).encode()).hexdigest()[:32]


# --- signed start messages ---------------------------------------------------------------------------
#
# A start message carries the whole assignment of each member it names, signed with a key only
# the platform and the agent that runs the node now hold (HMAC-SHA256 of the exact JSON text; the
# key is derived from the platform's secret key, the node and the agent's instance, and handed to
# the agent in its register answer: apps/nodes/credentials.py `message_key`). The agent starts a
# member it can verify without asking the agent API first. A message that does not verify
# (forged, another node's, an earlier agent's, expired) is only a hint: the agent confirms it
# through the API, as it does every stop message.


class BadStartMessage(ValueError):
    """A signed start message this agent cannot act on alone (why, in the message)."""


def start_message_signature(key: bytes, signed: str) -> str:
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


def signed_start_message(key: bytes, *, node: str, agent_instance: str,
                         members: list[Assignment], expires: float) -> dict:  # fmt: skip
    """The `signed` text and its `signature`, as a start message's arguments."""
    signed = json.dumps({"node": node, "agent_instance": agent_instance, "expires": expires,
                         "members": [to_wire(m) for m in members]},
                        separators=(",", ":"), sort_keys=True)  # fmt: skip
    return {"signed": signed, "signature": start_message_signature(key, signed)}


def open_start_message(key: bytes, signed, signature, *, node: str, agent_instance: str,
                       now: float) -> list[Assignment]:  # fmt: skip
    """The assignments of a start message signed for this agent, or BadStartMessage."""
    if not isinstance(signed, str) or not isinstance(signature, str):
        raise BadStartMessage("not signed")
    if not hmac.compare_digest(start_message_signature(key, signed), signature):
        raise BadStartMessage("its signature does not verify with this agent's key")
    data = json.loads(signed)  # signed by the platform: well formed
    if data["node"] != node or data["agent_instance"] != agent_instance:
        raise BadStartMessage(f"signed for {data['node']} agent {data['agent_instance']}")
    if now > float(data["expires"]):
        raise BadStartMessage("expired")
    return [assignment_from_wire(m) for m in data["members"]]
