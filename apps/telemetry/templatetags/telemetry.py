"""`{% gpu_charts job as gpu %}`: the job page's GPU charts (apps/telemetry/charts.py)."""

from django import template

from apps.telemetry.charts import job_charts

register = template.Library()


@register.simple_tag
def gpu_charts(job) -> dict:
    return job_charts(job)
