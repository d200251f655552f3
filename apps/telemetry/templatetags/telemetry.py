"""`{% gpu_charts job as gpu %}`: the job page's GPU charts (apps/telemetry/charts.py)."""

from django import template

from apps.telemetry.charts import efficiency_by_day, job_charts

register = template.Library()


@register.simple_tag
def gpu_charts(job) -> dict:
    return job_charts(job)


@register.simple_tag
def gpu_efficiency(tenant) -> dict:
    return efficiency_by_day(tenant)


@register.simple_tag
def gpu_util_means(jobs) -> dict:
    """`{% gpu_util_means jobs as util %}`: the mean GPU utilisation of each job of a list (one
    query), as text ("" before any sample), for `{% util_of util job.id %}`."""
    from apps.telemetry.models import JobGpuSummary

    ids = [job.pk for job in jobs if getattr(job, "pk", None) is not None]
    rows = JobGpuSummary.objects.filter(job_id__in=ids, gpu_seconds__gt=0)
    return {job_id: f"{100 * used / seconds:.0f}%" for job_id, used, seconds in
            rows.values_list("job_id", "util_gpu_seconds", "gpu_seconds")}  # fmt: skip


@register.simple_tag
def util_of(means: dict, job_id) -> str:
    return means.get(job_id, "")
