from django.apps import AppConfig


class SecretsConfig(AppConfig):
    name = "apps.secrets"
    label = "secrets"
    default_auto_field = "django.db.models.BigAutoField"
