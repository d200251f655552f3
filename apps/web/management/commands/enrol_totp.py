from base64 import b32encode

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django_otp.plugins.otp_totp.models import TOTPDevice


class Command(BaseCommand):
    help = (
        "Enrol a TOTP device for a staff user (the admin asks for its code with "
        "GPUPLATFORM_STAFF_REQUIRE_2FA=1); prints the otpauth:// URL as the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--name", default="authenticator", help="the device's name (default: authenticator)"
        )
        parser.add_argument(
            "--replace", action="store_true", help="delete the user's other TOTP devices first"
        )

    def handle(self, username, name, replace, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if replace:
            TOTPDevice.objects.filter(user=user).delete()
        device = TOTPDevice.objects.create(user=user, name=name, confirmed=True)
        self.stdout.write(f"TOTP device {device.name!r} for {user.username}; secret (base32):")
        self.stdout.write(b32encode(device.bin_key).decode())
        self.stdout.write(device.config_url)
