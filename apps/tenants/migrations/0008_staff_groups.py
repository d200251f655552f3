"""The staff groups "support" and "platform admin" (apps/tenants/roles.py). Existing accounts
are left as they are (a superuser made by createsuperuser is an operator); running
`create_user NAME --staff` again for a support account made before makes it a support user."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

from apps.tenants.roles import ensure_groups


def make_groups(apps, schema_editor):
    # Permissions are made after migrations (post_migrate); make them now so the groups get them.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    ensure_groups(apps)


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0007_hash_drf_tokens"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("jobs", "0008_fewer_job_indexes"),
        ("nodes", "0003_node_drain_deadline"),
        ("scheduling", "0001_initial"),
        ("webhooks", "0001_initial"),
    ]

    operations = [migrations.RunPython(make_groups, migrations.RunPython.noop)]
