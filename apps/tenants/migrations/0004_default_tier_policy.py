from django.db import migrations


def forwards(apps, schema_editor):
    from apps.tenants.defaults import apply_tier_policy

    apply_tier_policy(apps.get_model("tenants", "Tier"))


class Migration(migrations.Migration):
    dependencies = [("tenants", "0003_tier_policy_settings")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
