from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "apps.jobs"
    label = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported here, not at the top: models are not loaded yet when this module is.
        from apps.jobs import arrays, dependencies, handlers
        from apps.platform import events

        # A node's change and what it means for its attempts commit together.
        events.subscribe(events.NodeAlive, handlers.renew_leases, in_transaction=True)
        events.subscribe(events.NodeLost, handlers.lose_attempts_on_node, in_transaction=True)
        events.subscribe(
            events.DrainOverdue, handlers.preempt_on_drained_nodes, in_transaction=True
        )
        # A job array ends with its last task (its `array` event: the webhooks' array.ended).
        events.subscribe(events.JobEnded, arrays.on_job_ended, in_transaction=True)
        events.subscribe(events.JobRequeued, arrays.on_job_requeued, in_transaction=True)
        # A parent's end decides its dependents, in the parent's transaction (docs/pipelines.md).
        events.subscribe(events.JobEnded, dependencies.on_job_ended, in_transaction=True)
        events.subscribe(events.ArrayEnded, dependencies.on_array_ended, in_transaction=True)
        # A parent requeued after its end: its dependents that have not started wait again.
        events.subscribe(events.JobRequeued, dependencies.on_job_requeued, in_transaction=True)
