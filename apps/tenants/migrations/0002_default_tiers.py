from django.db import migrations


def forwards(apps, schema_editor):
    from apps.tenants.defaults import ensure_tiers

    ensure_tiers(apps.get_model("tenants", "Tier"), with_policy=False)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
