"""`python manage.py create_webhook SLUG URL`: a webhook for the tenant; prints its secret.
Refused when the URL's host is (or resolves now to) a loopback, private, link-local, metadata or
other non-public address, unless GPUPLATFORM_WEBHOOK_ALLOW_NETWORKS covers it."""

from django.core.management.base import BaseCommand, CommandError

from apps.tenants.models import Tenant
from apps.webhooks.guard import WebhookRefused
from apps.webhooks.services import webhook_create


class Command(BaseCommand):
    help = (
        "Add a webhook to a tenant; it is told about every later state change of the tenant's jobs."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("url")

    def handle(self, *args, slug, url, **options):
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"no tenant {slug!r}")
        try:
            webhook = webhook_create(tenant=tenant, url=url)
        except WebhookRefused as refused:
            raise CommandError(f"refused {url!r}: {refused}") from None
        self.stdout.write(f"webhook {webhook.pk} for {slug} -> {url}\nsecret:\n{webhook.secret}")
