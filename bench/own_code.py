"""Own code figures through the whole stack (real processes, one fake-GPU node):

1. upload time of a 50 MiB bundle (POST /api/v1/bundles/, client to the platform's storage);
2. the node's fetch and unpack of it (the agent's own lines at the head of the job's log);
3. submit-to-succeeded of a job from that bundle with a requirements.txt: cold (bundle fetched,
   environment built with uv from a local wheel dir, offline) and cached (both reused);
4. beside them, a job with no bundle (submit-to-running and submit-to-succeeded).

`python -m bench.own_code` writes docs/bench/55-own-code.md.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
import re
import statistics
import sys
import tarfile
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "bench" / "55-own-code.md"
BUNDLE_MIB = 50
MAIN = b"import gpuplatform_tinydep, pathlib; print('ok', len(pathlib.Path('blob.bin').read_bytes()))\n"


def ts(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def make_bundle() -> bytes:
    """50 MiB of archive: a random (incompressible) blob, the script and its requirements."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, data in {"main.py": MAIN, "requirements.txt": b"gpuplatform-tinydep==1.0\n",
                           "blob.bin": os.urandom(BUNDLE_MIB * 2**20 - 64 * 1024)}.items():  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def run_job(platform, **body) -> dict:
    job = platform.submit("bob", gpus=1, gpu_sku="H100-80GB", **body)
    done = platform.wait_for_state(job["id"], ["succeeded", "failed"], timeout=300)
    log = platform.get("bob", f"/api/v1/jobs/{job['id']}/logs/").text
    if done["state"] != "succeeded":
        raise SystemExit(f"job {job['id']} {done['state']}: {done['reason']}\n{log}")
    attempt = done["attempts"][-1]
    figures = {
        "to_running": ts(attempt["started_at"]) - ts(done["created_at"]),
        "to_succeeded": ts(attempt["ended_at"]) - ts(done["created_at"]),
    }
    if match := re.search(r"bundle unpacked: \d+ entries in ([\d.]+)s \(fetch ([\d.]+)s\)", log):
        figures["unpack"], figures["fetch"] = float(match[1]), float(match[2])
    if match := re.search(r"environment \w+ built in ([\d.]+)s", log):
        figures["env_build"] = float(match[1])
    figures["reused"] = "reused" in log and "cached" in log
    return figures


def measure(data_dir: pathlib.Path) -> dict:
    os.environ.setdefault("SECRET_KEY", "bench-only")
    from tests.e2e.platform import Platform
    from tests.unit.test_envs import write_wheel

    wheels = data_dir / "wheels"
    write_wheel(wheels)

    class OfflineAgents(Platform):
        def agent_environment(self, node: str) -> dict[str, str]:
            env = super().agent_environment(node)
            env.update(GPUPLATFORM_PIP_NO_INDEX="1", GPUPLATFORM_PIP_FIND_LINKS=str(wheels))
            return env

    platform = OfflineAgents(
        data_dir / "platform", name="gpuplatform_bench_own_code", own_redis=True
    )
    (data_dir / "platform").mkdir(parents=True, exist_ok=True)
    platform.env["GPUPLATFORM_HEARTBEAT_SECONDS"] = "2"
    platform.start({"oc-h1": ("H100-80GB", 4, "")})
    try:
        plain = [run_job(platform, command=["true"]) for _ in range(3)]
        archive = make_bundle()
        began = time.monotonic()
        response = platform.api("bob").post(platform.url + "/api/v1/bundles/", data=archive, timeout=300,
                                            headers={"Content-Type": "application/gzip"})  # fmt: skip
        upload = time.monotonic() - began
        assert response.status_code in (200, 201), response.text
        digest = response.json()["sha256"]
        assert digest == hashlib.sha256(archive).hexdigest()
        body = {"command": ["python", "main.py"], "bundle": digest}
        cold = run_job(platform, **body)
        cached = [run_job(platform, **body) for _ in range(2)]
    finally:
        platform.stop()
    return {"size": len(archive), "upload": upload, "plain": plain, "cold": cold, "cached": cached}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def write(result: dict) -> None:
    cold, cached, plain = result["cold"], result["cached"], result["plain"]
    rows = [
        (f"upload of a {result['size'] / 2**20:.1f} MiB bundle (POST /api/v1/bundles/)", f"{result['upload']:.2f} s"),
        ("node fetch of it (agent API, into the cache, sha256 checked)", f"{cold['fetch']:.2f} s"),
        ("unpack into the work dir (checked entry by entry)", f"{cold['unpack']:.2f} s cold, "
                                                              f"{median(cached, 'unpack'):.2f} s cached"),
        ("environment build (uv, 1 local wheel, offline)", f"{cold['env_build']:.2f} s"),
        ("job with no bundle: submit to running, median of 3", f"{median(plain, 'to_running'):.2f} s"),
        ("job with no bundle: submit to succeeded, median of 3", f"{median(plain, 'to_succeeded'):.2f} s"),
        ("job from the bundle, cold (fetch + unpack + env build): submit to succeeded",
         f"{cold['to_succeeded']:.2f} s"),
        ("job from the bundle, cached bundle and environment: submit to succeeded, median of 2",
         f"{median(cached, 'to_succeeded'):.2f} s (reused: {all(c['reused'] for c in cached)})"),
    ]  # fmt: skip
    lines = [
        "## Own code: bundles and environments on the node\n",
        "Command: `nice python -m bench.own_code` (SQLite (embedded default), its own Redis, gunicorn "
        "2x4, one dispatcher, one fake-GPU agent building environments offline from a local wheel "
        "dir; all on the 2-core machine shared with other work).\n",
        "| figure | value |",
        "|---|---|",
        *[f"| {name} | {value} |" for name, value in rows],
        "",
        "The bundle is incompressible (random bytes), so its archive is 50 MiB on the wire and "
        "unpacked. Fetch, unpack and build times are the agent's own, from the lines it writes at "
        "the head of the job's log; submit-to-* figures are the server's timestamps (`created_at` "
        "to the attempt's `started_at` / `ended_at`). A member with own code is reported running "
        "when its preparation starts, so submit-to-succeeded is the figure to compare.\n",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-own-code-") as tmp:
        write(measure(pathlib.Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
