from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "apps.telemetry"
    label = "telemetry"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Imported here, not at the top: models are not loaded yet when this module is.
        from apps.platform import events
        from apps.telemetry.read import new_samples

        # The job's event stream carries its GPU samples (apps/jobs/event_hub.py).
        events.subscribe(events.GpuSamplesWanted, new_samples, in_transaction=True)
