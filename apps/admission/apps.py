from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AdmissionConfig(AppConfig):
    name = "apps.admission"
    label = "admission"
    verbose_name = "Admission: rate limits, quotas, idempotency, result cache"

    def ready(self):
        from apps.admission import cache
        from apps.platform import events

        post_migrate.connect(_install_queued_count_triggers, sender=self)
        # A cached job's followers end with their origin, in the origin's transaction.
        events.subscribe(events.JobEnded, cache.on_job_ended, in_transaction=True)
        # An origin requeued by support staff is its key's active origin again, where free.
        events.subscribe(events.JobRequeued, cache.on_job_requeued, in_transaction=True)


def _install_queued_count_triggers(sender, using="default", plan=None, **kwargs):
    """After every migrate: the triggers that keep QueuedCount (apps/admission/queued.py),
    once both tables exist (a migrate back to before them leaves nothing to install on)."""
    from django.db import connections

    from apps.admission import queued
    from apps.admission.models import QueuedCount
    from apps.jobs.models import Job

    if using != "default" or not queued.supported():
        return
    tables = set(connections[using].introspection.table_names())
    if Job._meta.db_table in tables and QueuedCount._meta.db_table in tables:
        queued.install()
