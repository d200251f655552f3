"""Images the tests build themselves, without the internet (docs/images.md): a busybox-static root
as an OCI layout (umoci), pushed with skopeo to Debian's docker-registry on a loopback port (its
storage a temporary dir; optionally htpasswd basic auth, bcrypt lines from apache2-utils'
htpasswd). Each skips naming what is missing where the Debian packages are not installed
(`make test` installs them: the Makefile's `images` target)."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

TOOLS = ("skopeo", "umoci", "docker-registry", "htpasswd")
BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "ls", "cat", "env", "echo", "id", "pwd", "touch", "sleep", "true", "stat")


def need_tools() -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing or not os.path.exists(BUSYBOX):
        pytest.skip(
            f"image tests need Debian's skopeo, umoci, docker-registry, apache2-utils and "
            f"busybox-static (`make images`); missing: {', '.join(missing) or BUSYBOX}"
        )


def _tool(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    assert result.returncode == 0, f"{argv[:3]}: {result.stderr}"
    return result.stdout


def build_image(workdir: pathlib.Path, *, marker: str, env: list[str], cmd: list[str],
                working_dir: str = "", user: str = "", setuid_copy: bool = False,
                host_files: list[str] = ()) -> pathlib.Path:  # fmt: skip
    """An OCI layout at workdir/layout with one tag, "v1": busybox's applets in /bin, /MARKER
    holding `marker`; its config's Env, Cmd, WorkingDir and User as given; `host_files` copied
    from the host to the same paths (their symlinks followed), e.g. a glibc for a host tool."""
    layout, bundle = workdir / "layout", workdir / "bundle"
    _tool("umoci", "init", "--layout", str(layout))
    _tool("umoci", "new", "--image", f"{layout}:base")
    _tool("umoci", "unpack", "--image", f"{layout}:base", str(bundle))
    rootfs = bundle / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    (rootfs / "MARKER").write_text(marker)
    (rootfs / "scratch").mkdir(mode=0o777)
    os.chmod(rootfs / "scratch", 0o1777)  # the image's own writable dir: each job its own layer
    (rootfs / "etc").mkdir(exist_ok=True)
    (rootfs / "etc" / "image-release").write_text("test image\n")
    for path in host_files:
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    if setuid_copy:  # a root-owned setuid shell: nosuid and no_new_privs make it nothing
        shutil.copy(BUSYBOX, rootfs / "bin" / "busybox-suid")
        os.chmod(rootfs / "bin" / "busybox-suid", 0o4755)
    _tool("umoci", "repack", "--image", f"{layout}:v1", str(bundle))
    config = [f"--config.env={item}" for item in env] + [f"--config.cmd={part}" for part in cmd]
    if working_dir:
        config.append(f"--config.workingdir={working_dir}")
    if user:
        config.append(f"--config.user={user}")
    _tool("umoci", "config", "--image", f"{layout}:v1", *config)
    return layout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Registry:
    """Debian's docker-registry on 127.0.0.1:<free port>, with basic auth when `user` is given."""

    def __init__(self, workdir: pathlib.Path, *, user: str = "", password: str = ""):
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.creds = f"{user}:{password}" if user else ""
        auth = ""
        if user:
            (workdir / "htpasswd").write_text(_tool("htpasswd", "-Bbn", user, password))
            auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {workdir / 'htpasswd'}\n"
        config = workdir / "registry.yml"
        config.write_text(
            f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {workdir / 'storage'}\n"
            f"http:\n  addr: {self.host}\n{auth}"
        )
        self.log = open(workdir / "registry.log", "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(  # noqa: S603
            ["docker-registry", "serve", str(config)], stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)  # noqa: S310
                break
            except urllib.error.HTTPError:
                break  # 401 with auth: it answers
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"docker-registry did not start: {self.log.name}") from None
                time.sleep(0.1)

    def push(self, layout: pathlib.Path, tag: str, target: str) -> str:
        """Push layout:tag as <registry>/<target>; the pushed manifest's digest."""
        creds = ["--dest-creds", self.creds] if self.creds else []
        _tool("skopeo", "copy", "--quiet", "--dest-tls-verify=false", *creds,
              f"oci:{layout}:{tag}", f"docker://{self.host}/{target}")  # fmt: skip
        creds = ["--creds", self.creds] if self.creds else []
        return _tool("skopeo", "inspect", "--tls-verify=false", *creds, "--format",
                     "{{.Digest}}", f"docker://{self.host}/{target}").strip()  # fmt: skip

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
