"""The Procfile's Flower: `celery -A gpuplatform flower`, never without credentials.

Flower answers anyone who reaches its port unless it is given basic auth (or an OAuth provider).
`FLOWER_BASIC_AUTH` (`user:password[,user:password]`) from the environment is used as it is; a
malformed one refuses to start. Unset, the password is the one `make run` keeps under the data
dir (`<data dir>/flower_password`, made here when missing) for the user "admin". Either way the
password stays in the environment, never on a command line (`ps` shows those to every user).
"""

from __future__ import annotations

import os
import secrets
import sys

from gpuplatform.launch import data_dir, stored_secret

USER = "admin"  # `make run`'s user too (gpuplatform/launch.py)


def basic_auth_problem(value: str) -> str:
    """Why `value` is no usable FLOWER_BASIC_AUTH ("" when it is)."""
    for pair in value.split(","):
        user, colon, password = pair.strip().partition(":")
        if not (user and colon and password):
            return "each entry must be user:password, both non-empty"
    return ""


def flower_environment(environ: dict) -> dict:
    """The environment Flower runs with: credentials checked or made. Raises SystemExit with the
    reason when the ones given cannot be used."""
    env = dict(environ)
    if env.get("FLOWER_AUTH_PROVIDER"):  # OAuth, configured by the operator (Flower's docs)
        return env
    given = env.get("FLOWER_BASIC_AUTH")
    if given is None:
        password = stored_secret(data_dir() / "flower_password", lambda: secrets.token_urlsafe(12))
        env["FLOWER_BASIC_AUTH"] = f"{USER}:{password}"
        print(f"flower: basic auth as {USER!r}, password in {data_dir() / 'flower_password'}",
              file=sys.stderr, flush=True)  # fmt: skip
    elif problem := basic_auth_problem(given):
        raise SystemExit(f"flower: refusing to start: FLOWER_BASIC_AUTH is unusable ({problem})")
    env.setdefault("FLOWER_UNAUTHENTICATED_API", "false")
    return env


def main(argv: list[str]) -> None:
    env = flower_environment(dict(os.environ))
    command = [sys.executable, "-m", "celery", "-A", "gpuplatform", "flower", *argv]
    os.execve(sys.executable, command, env)


if __name__ == "__main__":
    main(sys.argv[1:])
