from django.db import migrations


def forwards(apps, schema_editor):
    from apps.tenants.defaults import ensure_templates

    ensure_templates(apps.get_model("jobs", "JobTemplate"))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
