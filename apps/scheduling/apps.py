from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported here, not at the top: models are not loaded yet when this module is.
        from apps.admission import fit
        from apps.platform import events
        from apps.scheduling import autoscaling, handlers

        fit.pools_from(autoscaling.pool_shapes)  # a submit only an autoscaled pool fits is fine
        events.subscribe(events.DispatchWanted, handlers.request_dispatch)
        events.subscribe(events.AttemptPlaced, handlers.publish_start)
        events.subscribe(events.StopRequested, handlers.publish_stop)
