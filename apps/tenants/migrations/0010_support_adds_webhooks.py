"""Support staff may add a tenant's webhook (apps/tenants/roles.py): the groups made again with
their permissions as roles.py has them now."""

from django.db import migrations

from apps.tenants.roles import ensure_groups


def groups_again(apps, schema_editor):
    ensure_groups(apps)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0009_bundle_caps")]

    operations = [migrations.RunPython(groups_again, migrations.RunPython.noop)]
