from django.apps import AppConfig


class NodesConfig(AppConfig):
    name = "apps.nodes"
    label = "nodes"
    default_auto_field = "django.db.models.BigAutoField"
