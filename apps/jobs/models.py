"""Jobs and everything that happens to them: attempts, the GPUs they hold, the audit log and
the result files. State changes go through apps.jobs.services, as guarded updates."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


class JobState(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


JOB_ACTIVE = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
JOB_PLACED = (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
JOB_TERMINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class AttemptState(models.TextChoices):
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTING = "preempting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    CANCELLED = "cancelled"
    LOST = "lost"


ATTEMPT_ACTIVE = (AttemptState.STARTING, AttemptState.RUNNING, AttemptState.PREEMPTING)
ATTEMPT_TERMINAL = (
    AttemptState.SUCCEEDED,
    AttemptState.FAILED,
    AttemptState.PREEMPTED,
    AttemptState.CANCELLED,
    AttemptState.LOST,
)


class JobTemplate(models.Model):
    """A named program the platform knows how to run. `argv` may use "{python}" for the agent's
    interpreter; parameters reach the job as JSON in GPUPLATFORM_PARAMS, never through a shell."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=300, blank=True)
    argv = models.JSONField(help_text='e.g. ["{python}", "-m", "gpuplatform_job.demo_train"]')
    params_schema = models.JSONField(default=dict, blank=True)
    version = models.PositiveIntegerField(default=1)
    checkpointable = models.BooleanField(default=False)
    cacheable = models.BooleanField(default=False)
    default_max_runtime_seconds = models.PositiveIntegerField(default=3600)
    # The cgroup limits of each member on a fencing node (workers/isolation.py) when the job asks
    # for none; 0: the node's default (GPUPLATFORM_JOB_MEMORY_MIB, ..._PIDS_MAX, ..._CPU_WEIGHT).
    memory_mib = models.PositiveIntegerField(
        default=0, help_text="memory.max per member in MiB; 0: the node's default."
    )
    pids_max = models.PositiveIntegerField(
        default=0, help_text="pids.max per member; 0: the node's default."
    )
    cpu_weight = models.PositiveIntegerField(
        default=0, help_text="cpu.weight (1-10000) per member; 0: the node's default."
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class JobArray(models.Model):
    """A job array (docs/arrays.md): one row for the whole sweep. Its tasks are Job rows with
    `array` and `array_index`, made lazily (apps/admission/arrays.py materialise): the tasks at
    positions below `materialised` have rows, the rest are queued (or, once the array is
    cancelled, cancelled) without one, and the API counts and lists them as if they existed. A
    task's id is uuid5(array id, str(index)) before and after its row exists."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="job_arrays", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays"
    )
    tier = models.ForeignKey(
        "tenants.Tier", on_delete=models.PROTECT, related_name="job_arrays", db_index=False
    )
    spec = models.CharField(max_length=1000, help_text='Slurm\'s syntax, e.g. "0-999%16".')
    size = models.PositiveIntegerField()
    throttle = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many tasks placed at once (%N); null: no cap.",
    )
    # Per task (by position in the spec's index order): a list of params objects, or a grid
    # {"name": [values...]} expanded as itertools.product (keys in order, the last fastest).
    params = models.JSONField(default=list, blank=True)
    grid = models.JSONField(default=dict, blank=True)
    # The submit shared by every task: the JobSpec's fields (FKs as `<name>_id`).
    task = models.JSONField(default=dict)
    materialised = models.PositiveIntegerField(
        default=0, help_text="Tasks at positions below this have Job rows."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="When its last task ended (array.ended sent once)."
    )
    # Dependencies (docs/pipelines.md), as a job's: every task has the array's. Held: a condition
    # on the whole array is pending, no task row is made. `failed_reason`: one can never hold:
    # every task failed with this reason, those without a row too (as `cancelled_at` for a cancel).
    has_dependencies = models.BooleanField(default=False)
    held_by_dependencies = models.BooleanField(default=False)
    failed_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="jobs_array_tenant_idx"),
            # The arrays not ended yet, for the reconcile tick (apps/jobs/arrays.py
            # end_settled_arrays): a few among all the arrays ever submitted.
            models.Index(fields=["id"], condition=Q(ended_at=None), name="jobs_array_open_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}[{self.spec}] ({self.id})"


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    # No index of its own: (tenant, -created_at) below starts with it.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    # No index of its own: every job's insert and state change paid for one, and jobs are never
    # looked up by tier alone (the queue's order index starts with state); only deleting a tier
    # or a SKU (both protected) scans the jobs table for one.
    tier = models.ForeignKey(
        "tenants.Tier", on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    template = models.ForeignKey(JobTemplate, null=True, blank=True, on_delete=models.PROTECT)
    params = models.JSONField(default=dict, blank=True)
    command = models.JSONField(null=True, blank=True)
    gpus = models.PositiveSmallIntegerField(default=1, help_text="GPUs per node.")
    nodes = models.PositiveSmallIntegerField(
        default=1, help_text="Gang size; 1 is a single-node job."
    )
    gpu_sku = models.ForeignKey(
        "nodes.GpuSku",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="jobs",
        db_index=False,
        help_text="Empty: any SKU.",
    )
    node_selector = models.JSONField(default=dict, blank=True)
    max_runtime_seconds = models.PositiveIntegerField(default=3600)
    checkpointable = models.BooleanField(default=False)
    cacheable = models.BooleanField(default=False)
    priority_boost = models.SmallIntegerField(default=0)
    retry_on_failure = models.BooleanField(
        default=False,
        help_text="Retry a user error (non-zero exit) too, not only infrastructure failures.",
    )
    # Cgroup limits per member on a fencing node: the job's request, else its template's (copied
    # at submit); 0: the node's default. Not a placement request: the scheduler does not count them.
    memory_mib = models.PositiveIntegerField(default=0)
    pids_max = models.PositiveIntegerField(default=0)
    cpu_weight = models.PositiveIntegerField(default=0)
    # Own code (docs/own-code.md): the sha256 of the tenant's uploaded bundle the command runs in
    # ("" none), extra environment variables, the names of tenant secrets set in the job's
    # environment (values never live on the job), and {"requirements": [...]} for a Python
    # environment built on the node.
    bundle = models.CharField(max_length=64, blank=True)
    env = models.JSONField(default=dict, blank=True)
    secrets = models.JSONField(default=list, blank=True)
    python = models.JSONField(default=dict, blank=True)
    # An OCI image as the job's root (docs/images.md): the reference as submitted, the tenant
    # secret with the registry's `user:password` ("" none), and the manifest digest its first
    # pull fixed (every later attempt runs that one; "" not pulled yet).
    image = models.CharField(max_length=500, blank=True)
    image_pull_secret = models.CharField(max_length=128, blank=True)
    image_digest = models.CharField(max_length=71, blank=True)
    # A task of a job array (docs/arrays.md): its array and index (the spec's, e.g. 5 of "1,5,9").
    # No index of its own: the partial unique constraint below (array, array_index) serves.
    array = models.ForeignKey(
        JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks",
        db_index=False,
    )  # fmt: skip
    array_index = models.PositiveIntegerField(null=True, blank=True)
    # An interactive job (docs/interactive.md): it holds its GPUs for shells and execs through
    # the relay; `command` is then what a shell session runs (none: a login shell). It ends when
    # its shell exits, after `idle_timeout_minutes` (0: its tier's) with nothing typed or printed,
    # or at max_runtime_seconds.
    interactive = models.BooleanField(default=False)
    idle_timeout_minutes = models.FloatField(default=0)

    # Indexed by (state, created_at) and (state, tier, created_at) below: every insert and state
    # change updates each index of the table, so none is kept twice.
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    version = models.PositiveIntegerField(default=0)
    progress = models.FloatField(default=0.0)
    reason = models.CharField(max_length=300, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    cache_hit = models.BooleanField(default=False)
    not_before = models.DateTimeField(
        null=True,
        blank=True,
        help_text="A retry waits out its backoff: the dispatcher places it from then on.",
    )
    attempts_count = models.PositiveSmallIntegerField(default=0)
    preemption_count = models.PositiveSmallIntegerField(default=0)
    # Dependencies (docs/pipelines.md): `has_dependencies` is set at submit for a job with a
    # `depends_on` and never changes (the agent then fetches its parents' artifacts);
    # `held_by_dependencies` is set while a condition is still pending: the job is queued but the
    # dispatcher, the start estimate and the queue positions leave it out until it is released.
    has_dependencies = models.BooleanField(default=False)
    held_by_dependencies = models.BooleanField(default=False)
    # The dispatcher's plan for a queued job (apps/scheduling/plan.py, API.md "Honest waiting"):
    # its start if every job runs its predicted length, the window of the predictor's quantiles,
    # its place in the order the plan starts jobs, and when the plan was made (null: none yet).
    planned_start_at = models.DateTimeField(null=True, blank=True)
    planned_start_earliest = models.DateTimeField(null=True, blank=True)
    planned_start_latest = models.DateTimeField(null=True, blank=True)
    planned_position = models.PositiveIntegerField(null=True, blank=True)
    planned_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["state", "created_at"]),
            # A submit's answer counts the queued jobs and those ahead of it in queue order (tier,
            # then submit time: apps/admission/rows.py queued_and_ahead) from this index alone.
            models.Index(fields=["state", "tier", "created_at"], name="jobs_job_queue_order_idx"),
        ]
        constraints = [
            # One row per task; partial, so jobs outside arrays add nothing to the index.
            models.UniqueConstraint(
                fields=["array", "array_index"], condition=Q(array__isnull=False),
                name="job_array_task_once",
            ),
        ]  # fmt: skip

    def __str__(self) -> str:
        return f"{self.name} ({self.id})"


class DependencyCondition(models.TextChoices):
    AFTEROK = "afterok"  # the parent succeeded (an array: every task succeeded)
    AFTERANY = "afterany"  # the parent ended, in any terminal state
    AFTERNOTOK = "afternotok"  # the parent failed or was cancelled (an array: one task did)
    AFTERCORR = "aftercorr"  # arrays: task i after task i of the parent array succeeded


class DependencyState(models.TextChoices):
    PENDING = "pending"  # the parent has not decided it yet
    SATISFIED = "satisfied"
    NEVER = "never"  # can no longer hold: the dependent job failed at once


class JobDependency(models.Model):
    """One condition of a job's `depends_on`, in the order submitted. The dependent job is
    released when all of its conditions are satisfied, and fails at once when one can never be
    (apps/jobs/dependencies.py)."""

    # The dependent: a job, or a job array (every task has the array's dependencies).
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="dependencies"
    )
    array = models.ForeignKey(
        JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="dependencies"
    )
    # The parent: a job, or a job array. Indexed with the state: a parent's end reads its pending
    # dependents from these indexes alone.
    parent_job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="dependents",
        db_index=False,
    )  # fmt: skip
    parent_array = models.ForeignKey(
        JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="dependents",
        db_index=False,
    )  # fmt: skip
    condition = models.CharField(max_length=16, choices=DependencyCondition.choices)
    position = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(
        max_length=16, choices=DependencyState.choices, default=DependencyState.PENDING
    )
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "position"]
        indexes = [
            models.Index(fields=["parent_job", "state"], name="jobs_dep_parent_state_idx"),
            models.Index(fields=["parent_array", "state"], name="jobs_dep_parent_array_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "position"], name="dependency_unique_position"),
            models.UniqueConstraint(
                fields=["array", "position"], name="dependency_unique_array_position"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id or self.array_id} {self.condition} {self.parent_job_id or self.parent_array_id}"


class JobAttempt(models.Model):
    """One try at running a job. `token` is the fencing token: the agent presents it with every
    report, so a stale delivery or a superseded attempt can never change the job."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveSmallIntegerField()
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.STARTING
    )
    token = models.UUIDField(default=uuid.uuid4, editable=False)
    version = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    reason = models.CharField(max_length=300, blank=True)
    checkpoint = models.CharField(max_length=500, blank=True)
    checkpoint_at = models.DateTimeField(
        null=True, blank=True, help_text="When the last checkpoint was saved."
    )
    stop_requested = models.CharField(
        max_length=32, blank=True, help_text='Why the agents should stop it: "cancel", "lost", ...'
    )
    preempted_for = models.CharField(
        max_length=64, blank=True, help_text="The job it is being preempted for."
    )
    master_port = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="MASTER_PORT: leased by the agent of rank 0 on its node (workers/ports.py), "
        "reported with its start; the other members wait for it.",
    )  # fmt: skip

    class Meta:
        ordering = ["job", "number"]
        indexes = [
            # The running attempts (ended_at IS NULL: a B-tree holds the NULLs, at one end) and
            # those that ended since a time: each dispatcher pass reads both (the stamps, the
            # running ids and the recent ends, apps/scheduling/kept.py), and without it each read
            # went through every attempt ever made.
            models.Index(fields=["ended_at"], name="jobs_attempt_ended_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number"),
            # At most one live attempt per job, whatever races: the database says no.
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(state__in=["starting", "running", "preempting"]),
                name="attempt_one_active_per_job",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id}#{self.number}"


class AttemptMember(models.Model):
    """One process of an attempt: a single-node job has one (rank 0), a gang has one per node."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="members")
    rank = models.PositiveSmallIntegerField(default=0)
    node = models.ForeignKey("nodes.Node", on_delete=models.PROTECT, related_name="members")
    gpu_indices = models.JSONField(default=list)
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.STARTING
    )
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "rank"], name="member_unique_rank")
        ]

    def __str__(self) -> str:
        return f"{self.attempt} rank {self.rank} on {self.node_id}"


class GpuAllocation(models.Model):
    """A GPU held by an attempt. The partial unique index makes a double allocation impossible
    at the database, whatever the dispatcher believes."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("nodes.Gpu", on_delete=models.PROTECT, related_name="allocations")
    allocated_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="gpu_allocated_once"
            )
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} to attempt {self.attempt_id}"


class JobEvent(models.Model):
    """The audit log: every transition with who and why. Append-only."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt = models.ForeignKey(JobAttempt, null=True, blank=True, on_delete=models.CASCADE)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, default="state")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    actor = models.CharField(
        max_length=100, help_text='"user:alice", "system:dispatcher", "agent:n1"'
    )
    reason = models.CharField(max_length=300, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state}->{self.to_state} by {self.actor}"


def artifact_path(instance: "Artifact", filename: str) -> str:
    return f"artifacts/{instance.job_id}/{filename}"


class Artifact(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    attempt = models.ForeignKey(JobAttempt, null=True, blank=True, on_delete=models.SET_NULL)
    name = models.CharField(max_length=255)
    file = models.FileField(upload_to=artifact_path, max_length=500)
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="artifact_unique_name")]

    def __str__(self) -> str:
        return self.name
