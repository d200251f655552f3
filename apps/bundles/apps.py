from django.apps import AppConfig


class BundlesConfig(AppConfig):
    name = "apps.bundles"
    label = "bundles"
    default_auto_field = "django.db.models.BigAutoField"
