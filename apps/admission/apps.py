from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "apps.admission"
    label = "admission"
    verbose_name = "Admission: rate limits, quotas, idempotency, result cache"
