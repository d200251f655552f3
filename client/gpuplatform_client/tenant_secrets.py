"""`gpuplatform secrets list|set|delete`: the tenant's secrets (values are write-only: never
printed, never read back)."""

from __future__ import annotations

import getpass
import json
import sys

from .api import Client, ConfigError


def cmd_secrets_list(client: Client, args) -> int:
    secrets = client.secrets()
    if args.json:
        print(json.dumps(secrets, indent=2))
        return 0
    for secret in secrets:
        print(
            f"{secret['name']:<32} updated {secret.get('updated_at') or secret.get('created_at') or ''}"
        )
    return 0


def cmd_secrets_set(client: Client, args) -> int:
    if args.from_file:
        try:
            with open(args.from_file, encoding="utf-8") as handle:
                value = handle.read()
        except OSError as error:
            raise ConfigError(f"--from-file: {error}") from None
    elif sys.stdin.isatty():
        value = getpass.getpass(f"value of {args.name} (not echoed): ")
    else:
        value = sys.stdin.read()
        value = value[:-1] if value.endswith("\n") else value  # `echo x |` adds one
        value = value[:-1] if value.endswith("\r") else value
    if not value:
        raise ConfigError(f"no value for secret {args.name} (give it on stdin or with --from-file)")
    secret = client.set_secret(args.name, value)
    _out(args, secret or {"name": args.name}, f"secret {args.name} set")
    return 0


def cmd_secrets_delete(client: Client, args) -> int:
    client.delete_secret(args.name)
    _out(args, {"name": args.name, "deleted": True}, f"secret {args.name} deleted")
    return 0


def _out(args, data: dict, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text, flush=True)
