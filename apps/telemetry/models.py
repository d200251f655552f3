"""GPU telemetry records (docs/telemetry.md): a bounded series per (attempt member, GPU) and a
summary per job, which also holds the idle policy's state."""

from django.db import models


class GpuSeries(models.Model):
    """One GPU of one attempt member over time: its points (GpuPoint), the last reading and the
    idle state. A heartbeat appends its samples as points (its write grows with its samples, not
    with the series); past MAX_POINTS (apps/telemetry/series.py) the series is merged into
    `bucket_seconds`-wide buckets, so its older points are coarser and it never passes MAX_POINTS."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="gpu_series")
    attempt = models.ForeignKey("jobs.JobAttempt", on_delete=models.CASCADE, related_name="+")
    rank = models.PositiveSmallIntegerField(default=0)
    node = models.CharField(max_length=64)  # the node's name (kept if the node goes)
    gpu_index = models.PositiveSmallIntegerField()
    gpu_uuid = models.CharField(max_length=80, blank=True)
    bucket_seconds = models.FloatField(default=0.0)  # its merged points' width; 0: none merged
    point_count = models.PositiveIntegerField(default=0)  # its GpuPoint rows
    last_t = models.FloatField(default=0.0)
    last_util = models.FloatField(null=True, blank=True)
    last_memory_mib = models.PositiveIntegerField(null=True, blank=True)
    idle_since = models.FloatField(null=True, blank=True)  # start of its current idle stretch
    util_max = models.FloatField(default=0.0)
    memory_max_mib = models.PositiveIntegerField(default=0)
    health = models.CharField(max_length=32, blank=True)  # "xid 79", "ecc 2": its first error
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["job", "attempt", "rank", "gpu_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "rank", "gpu_index"], name="gpu_series_unique_member_gpu"
            )
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.node}:{self.gpu_index}"


class GpuPoint(models.Model):
    """A point of a GPU series: a sample, or (once the series was merged) a bucket of them: its
    start (Unix time), mean utilisation (0..100), highest memory used (MiB) and the seconds it
    covers."""

    series = models.ForeignKey(GpuSeries, on_delete=models.CASCADE, related_name="points")
    t = models.FloatField()
    util = models.FloatField()
    memory_mib = models.PositiveIntegerField()
    seconds = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["series", "t"], name="gpu_point_series_t")]

    def __str__(self) -> str:
        return f"{self.series_id} {self.t}"


class JobGpuSummary(models.Model):
    """A job's GPU figures over all its attempts, and where its idle policy stands."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="gpu_summary"
    )
    gpu_seconds = models.FloatField(default=0.0)  # sampled GPU-seconds
    util_gpu_seconds = models.FloatField(default=0.0)  # GPU-seconds x utilisation (0..1)
    util_max = models.FloatField(default=0.0)
    memory_max_mib = models.PositiveIntegerField(default=0)
    idle_seconds = models.FloatField(default=0.0)  # time every GPU of the job read idle
    idle_counted_to = models.FloatField(null=True, blank=True)  # idle time counted up to here
    idle_warned_for = models.FloatField(null=True, blank=True)  # the stretch warned about
    idle_acted_for = models.FloatField(null=True, blank=True)  # the stretch acted on
    idle_requeues = models.PositiveSmallIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.job_id}"

    @property
    def util_mean(self) -> float | None:
        return 100.0 * self.util_gpu_seconds / self.gpu_seconds if self.gpu_seconds else None
