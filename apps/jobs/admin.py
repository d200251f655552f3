from django import forms
from django.contrib import admin, messages

from apps.jobs import services
from apps.jobs.models import (
    Artifact,
    AttemptMember,
    GpuAllocation,
    Job,
    JobAttempt,
    JobEvent,
    JobTemplate,
)
from apps.jobs.params import ParamsError, validate_schema
from apps.tenants.audit import AuditedAdmin, ReasonActionForm, action_reason


class JobTemplateForm(forms.ModelForm):
    class Meta:
        model = JobTemplate
        fields = ["name", "description", "argv", "params_schema", "version", "checkpointable", "cacheable",
                  "default_max_runtime_seconds", "memory_mib", "pids_max", "cpu_weight"]  # fmt: skip

    def clean(self):
        """The submit body's bounds (apps/jobs/serializers.py), field by field."""
        from apps.jobs.serializers import MAX_CPU_WEIGHT, MAX_MEMORY_MIB, MAX_PIDS

        data = super().clean()
        for name, most in [
            ("memory_mib", MAX_MEMORY_MIB),
            ("pids_max", MAX_PIDS),
            ("cpu_weight", MAX_CPU_WEIGHT),
        ]:
            if (data.get(name) or 0) > most:
                self.add_error(name, f"must be at most {most} (0: the node's default)")
        return data

    def clean_params_schema(self):
        schema = self.cleaned_data["params_schema"]
        try:
            validate_schema(schema)
        except ParamsError as error:
            raise forms.ValidationError(str(error.errors)) from None
        return schema

    def clean_argv(self):
        argv = self.cleaned_data["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise forms.ValidationError("argv must be a non-empty list of strings")
        return argv


@admin.register(JobTemplate)
class JobTemplateAdmin(AuditedAdmin):
    """Its argv runs on every node: changing it needs "platform admin" (apps/tenants/roles.py),
    and each change is in the admin log with who and why (apps/tenants/audit.py)."""

    form = JobTemplateForm
    list_display = ["name", "version", "checkpointable", "cacheable", "default_max_runtime_seconds"]
    search_fields = ["name"]


ATTEMPT_FIELDS = ("number", "state", "started_at", "ended_at", "exit_code", "reason", "checkpoint")
EVENT_FIELDS = ("created_at", "from_state", "to_state", "actor", "reason")


class AttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0
    can_delete = False
    fields = readonly_fields = ATTEMPT_FIELDS


PROGRESS = "progress"  # JobEvent.kind of a progress sample (apps/jobs/services.py `_progress`)


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


@admin.display(description="what")
def event_summary(event: JobEvent) -> str:
    """A progress sample has no reason, only its value (data["progress"], for the job page's
    chart): said here as a percent, so its row in the log is not blank."""
    if event.kind == PROGRESS and not event.reason:
        value = event.data.get("progress") if isinstance(event.data, dict) else None
        return f"progress {percent(value)}" if isinstance(value, int | float) else "progress"
    return event.reason


class EventInline(admin.TabularInline):
    """The job's audit log on its page: its changes and notes. Its progress samples (one per 5%
    per attempt, with no text of their own) are left out here: the job page's chart draws them,
    and the JobEvent list shows them with their value."""

    model = JobEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = EVENT_FIELDS

    def get_queryset(self, request):
        return super().get_queryset(request).exclude(kind=PROGRESS)


@admin.action(description="Cancel selected jobs", permissions=["change"])
def cancel_jobs(modeladmin, request, queryset):
    done = 0
    for job in queryset:
        try:
            services.job_cancel(
                job=job,
                actor=f"staff:{request.user.username}",
                reason=action_reason(request, "cancelled by support"),
            )
            done += 1
        except services.ServiceError as error:
            messages.warning(request, f"{job.name}: {error.message}")
    messages.info(request, f"cancelled {done} job(s)")


@admin.action(description="Requeue selected jobs", permissions=["change"])
def requeue_jobs(modeladmin, request, queryset):
    for job in queryset:
        services.job_requeue(
            job=job,
            actor=f"staff:{request.user.username}",
            reason=action_reason(request, "requeued by support"),
        )
    messages.info(request, f"requeued {queryset.count()} job(s)")


@admin.action(
    description="Preempt selected jobs now (checkpoint, then requeue)", permissions=["change"]
)
def preempt_jobs(modeladmin, request, queryset):
    for job in queryset:
        try:
            services.job_preempt(
                job=job,
                actor=f"staff:{request.user.username}",
                reason=action_reason(request, "preempted by support"),
            )
        except services.ServiceError as error:
            messages.warning(request, f"{job.name}: {error.message}")


@admin.action(
    description="Bump priority of selected jobs (+1: an hour ahead in the queue order)",
    permissions=["change"],
)
def bump_priority(modeladmin, request, queryset):
    for job in queryset:
        services.job_bump_priority(job=job, actor=f"staff:{request.user.username}")
        if request.POST.get("reason", "").strip():  # the service records the boost; this, why
            services.record_event(job, actor=f"staff:{request.user.username}", kind="note",
                                  reason=action_reason(request, "priority bump"))  # fmt: skip
    messages.info(request, f"boosted {queryset.count()} job(s)")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    """Jobs change only through the actions (the services, each change a JobEvent with who and
    why): the form is read only for everyone, so "change job" (support's) means the actions."""

    action_form = ReasonActionForm
    list_display = [
        "name",
        "tenant",
        "tier",
        "state",
        "gpus",
        "nodes",
        "gpu_sku",
        "progress_percent",
        "created_at",
    ]
    list_filter = [
        "state",
        "tier",
        "gpu_sku",
        "tenant",
        ("attempts__members__node", admin.RelatedOnlyFieldListFilter),
    ]
    list_select_related = ["tenant", "tier", "gpu_sku"]
    search_fields = ["id", "name", "tenant__slug", "user__username"]
    readonly_fields = ["state", "version", "progress", "reason", "exit_code", "cache_hit", "attempts_count", "preemption_count",
                       "created_at", "started_at", "finished_at"]  # fmt: skip
    raw_id_fields = ["user", "tenant"]
    inlines = [AttemptInline, EventInline]
    actions = [cancel_jobs, requeue_jobs, preempt_jobs, bump_priority]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request, obj=None):
        return [
            "progress_percent" if field.name == "progress" else field.name
            for field in Job._meta.concrete_fields
        ]

    def get_fields(self, request, obj=None):
        return self.get_readonly_fields(request, obj)  # progress as a percent, not also raw

    @admin.display(description="progress", ordering="progress")
    def progress_percent(self, job: Job) -> str:
        return percent(job.progress)


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    list_display = ["__str__", "state", "started_at", "ended_at", "exit_code", "reason"]
    list_filter = ["state"]
    search_fields = ["job__id", "job__name"]
    raw_id_fields = ["job"]
    readonly_fields = ["state", "token", "version", "lease_expires_at", "stop_requested"]


@admin.register(AttemptMember)
class AttemptMemberAdmin(admin.ModelAdmin):
    list_display = ["attempt", "rank", "node", "gpu_indices", "state", "pid", "exit_code"]
    list_filter = ["state", "node"]
    list_select_related = ["attempt", "node"]
    raw_id_fields = ["attempt"]


@admin.register(GpuAllocation)
class GpuAllocationAdmin(admin.ModelAdmin):
    list_display = ["gpu", "attempt", "allocated_at", "released_at"]
    list_select_related = ["gpu__node", "attempt"]
    raw_id_fields = ["attempt", "gpu"]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    """The audit log: read only."""

    list_display = ["created_at", "job", "kind", "from_state", "to_state", "actor", event_summary]
    list_filter = ["to_state", "kind"]
    list_select_related = ["job"]
    search_fields = ["job__id", "actor", "reason"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["name", "job", "size", "created_at"]
    search_fields = ["name", "job__id"]
    raw_id_fields = ["job", "attempt"]
