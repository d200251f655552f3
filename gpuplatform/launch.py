"""`make run`: set up and start the whole platform on this machine.

Generates a secret key (kept under the data dir) if none is given, starts the embedded Redis
when there is no REDIS_URL, migrates, bootstraps the demo, collects static files, prints the
URLs and demo tokens (the same ones each run, kept under the data dir: `--rotate-demo-tokens`,
or `make run ROTATE_DEMO_TOKENS=1`, makes new ones), then runs every Procfile process under
honcho until Ctrl-C.
"""

import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def data_dir() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("GPUPLATFORM_DATA_DIR") or ROOT / "var").resolve()
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)  # the database, the secret key, storage: the control plane's alone
    return path


def stored_secret(path: pathlib.Path, make) -> str:
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def manage(*args: str, env: dict, capture: bool = False) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True, text=True,
        stdout=subprocess.PIPE if capture else None,
    )  # fmt: skip
    return result.stdout or ""


def main() -> int:
    data = data_dir()
    env = dict(os.environ, GPUPLATFORM_DATA_DIR=str(data))
    env["PATH"] = f"{pathlib.Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.setdefault(
        "SECRET_KEY", stored_secret(data / "secret_key", lambda: secrets.token_urlsafe(50))
    )
    env.setdefault(
        "FLOWER_BASIC_AUTH",
        "admin:" + stored_secret(data / "flower_password", lambda: secrets.token_urlsafe(12)),
    )
    port, flower_port = env.setdefault("PORT", "8000"), env.setdefault("FLOWER_PORT", "5555")
    # The Procfile's agents get only this URL and their own credential file (`env -i`: none of
    # this process's secrets). They run unprivileged here, isolation "none": this developer
    # machine's operator opts them in to run the demo's command jobs (docs/architecture.md).
    env.setdefault("GPUPLATFORM_URL", f"http://127.0.0.1:{port}")
    env.setdefault("GPUPLATFORM_TRUST_UNISOLATED_NODES", "1")
    # The example projects' requirements that are not on PyPI (examples/packages/): built into a
    # wheel directory the agents' environment builds look in, beside PyPI (no
    # GPUPLATFORM_PIP_NO_INDEX: real packages still come from the index when online).
    if "GPUPLATFORM_PIP_FIND_LINKS" not in env:
        try:
            env["GPUPLATFORM_PIP_FIND_LINKS"] = str(build_example_wheels(data / "wheels"))
        except subprocess.CalledProcessError as error:  # offline, no build backend: run without
            print(f"launch: the example wheels were not built ({error}); examples/tiny-train "
                  "will not find its requirement", file=sys.stderr)  # fmt: skip
    redis = None
    if not env.get("REDIS_URL"):
        from gpuplatform import embedded_redis

        redis = embedded_redis.start(data / "redis")
        env["REDIS_URL"] = redis.url
    try:
        manage("migrate", "--noinput", env=env)
        manage("collectstatic", "--noinput", "-v", "0", env=env)
        rotate = ["--rotate-tokens"] if "--rotate-demo-tokens" in sys.argv[1:] else []
        demo = manage("bootstrap_demo", *rotate, env=env, capture=True)
        issue_agent_credentials(data, env)
        print(banner(port, flower_port, env, demo), flush=True)
        honcho = subprocess.Popen(
            [str(pathlib.Path(sys.executable).parent / "honcho"), "-f", "Procfile", "start", "-p", port],
            cwd=ROOT, env=env,
        )  # fmt: skip
        signal.signal(signal.SIGTERM, lambda *_: honcho.send_signal(signal.SIGTERM))
        try:
            return honcho.wait()
        except KeyboardInterrupt:
            honcho.send_signal(signal.SIGINT)
            return honcho.wait()
    finally:
        if redis is not None:
            redis.stop()


def build_example_wheels(directory: pathlib.Path) -> pathlib.Path:
    """A wheel of each package under examples/packages/ in `directory`, built once per version
    by `pip wheel` (its build backend from the index pip is set up with) from a copy, so the
    source tree gets no build/ or egg-info."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in sorted((ROOT / "examples" / "packages").glob("*/pyproject.toml")):
        name = source.parent.name.replace("-", "_")  # a wheel's file name spells it so
        version = re.search(r'^version = "([^"]+)"', source.read_text(), flags=re.M)
        if version and list(directory.glob(f"{name}-{version.group(1)}-*.whl")):
            continue
        with tempfile.TemporaryDirectory() as scratch:
            copy = pathlib.Path(scratch) / name
            shutil.copytree(source.parent, copy)
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                 "-w", str(directory), str(copy)],
                check=True,
            )  # fmt: skip
    return directory


def procfile_agents() -> list[str]:
    text = (ROOT / "Procfile").read_text()
    return re.findall(r"^agent-[\w-]+:.*?--node (\S+)", text, flags=re.M)


def issue_agent_credentials(data: pathlib.Path, env: dict) -> None:
    """A fresh node credential for each Procfile agent (the last ones revoked), in a file only
    this user can read: `<data dir>/agents/<node>/credential`."""
    for node in procfile_agents():
        directory = data / "agents" / node
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        manage("create_node_credential", node, "--revoke", env=env, capture=True)
        credential = (
            manage("create_node_credential", node, env=env, capture=True).strip().splitlines()[-1]
        )
        path = directory / "credential"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(credential + "\n")


def redacted(url: str) -> str:
    """The URL with its password masked: the banner may end up in a terminal log or a ticket."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    return urllib.parse.urlunsplit(
        parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
    )


def banner(port: str, flower_port: str, env: dict, demo: str) -> str:
    database = env.get("DATABASE_URL") or f"SQLite at {env['GPUPLATFORM_DATA_DIR']}/db.sqlite3"
    return f"""
gpuplatform is starting.
  Web UI      http://127.0.0.1:{port}/            (sign in with a demo user below)
  Admin       http://127.0.0.1:{port}/admin/      (user "staff")
  API         http://127.0.0.1:{port}/api/v1/     (Authorization: Token <token>)
  API schema  http://127.0.0.1:{port}/api/schema/
  Health      http://127.0.0.1:{port}/healthz     Metrics http://127.0.0.1:{port}/metrics
  Flower      http://127.0.0.1:{flower_port}/            (basic auth {env["FLOWER_BASIC_AUTH"]})
  Redis       {redacted(env["REDIS_URL"])}
  Database    {database}

Demo users and API tokens:
{demo}
Try:  curl -H "Authorization: Token <token of bob>" -H "Content-Type: application/json" \\
        -d '{{"template": "demo-train", "params": {{"steps": 20}}, "gpus": 2, "gpu_sku": "H100-80GB"}}' \\
        http://127.0.0.1:{port}/api/v1/jobs/
"""


if __name__ == "__main__":
    sys.exit(main())
