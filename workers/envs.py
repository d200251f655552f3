"""Python environments for jobs, built on the node with uv, cached and shared read-only.

A job asks for one with `"python": {"requirements": [...]}` in its submit body
(Assignment.python_requirements) or a `requirements.txt` at its bundle's root. When it has
both, the body's list wins and the file is ignored (the log says so): the body is what the
submitter chose for this run, and the platform validated it.

One environment per (interpreter, sha256 of the normalised requirements: comments and blank
lines dropped, whitespace stripped, sorted, each once) at `<data dir>/envs/<digest>`, built once
under a file lock (`<digest>.lock`) by `uv venv` + `uv pip install --compile-bytecode` (each
module's bytecode with it, as jobs cannot write it there), then marked complete and
made read-only (files 0444/0555, dirs 0555): every job that wants the same one runs it as is,
and no job can change it for the next. A build that fails is removed and ends the attempt
`failed` with `environment: <why>`; the next job asking for it tries again.

uv installs wheels only (`--no-build`): building a source distribution would run the package's
own code as the agent (root, on a fencing node). The operator's settings: an index
(GPUPLATFORM_PIP_INDEX_URL, an internal mirror), a wheel dir (GPUPLATFORM_PIP_FIND_LINKS), and
GPUPLATFORM_PIP_NO_INDEX=1 for offline nodes (only that dir). Pure Python, no Django.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from workers.isolation import env_int

COMPLETE = ".gpuplatform-complete"
BUILD_ENV_PASSTHROUGH = ("SSL_CERT_FILE", "SSL_CERT_DIR", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY",
                         "https_proxy", "http_proxy", "no_proxy", "TZ")  # fmt: skip
MAX_REQUIREMENTS = 500
MAX_REQUIREMENT_CHARS = 1000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class EnvError(Exception):
    """The environment could not be had; the message is the attempt's reason after `environment: `."""


class Stopped(Exception):
    """The member was stopped (cancelled, fenced, unassigned) while its environment was had."""


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Settings:
    index_url: str
    find_links: str
    no_index: bool
    build_timeout: int

    @classmethod
    def from_env(cls, environ=os.environ) -> Settings:
        return cls(
            index_url=environ.get("GPUPLATFORM_PIP_INDEX_URL", "").strip(),
            find_links=environ.get("GPUPLATFORM_PIP_FIND_LINKS", "").strip(),
            no_index=environ.get("GPUPLATFORM_PIP_NO_INDEX", "").strip().lower() in ("1", "true", "yes"),
            build_timeout=env_int("GPUPLATFORM_ENV_BUILD_TIMEOUT", 1800, minimum=1),
        )  # fmt: skip

    def uv_args(self) -> list[str]:
        args = ["--no-build"]
        if self.no_index:
            args.append("--no-index")
        elif self.index_url:
            args += ["--index-url", self.index_url]
        if self.find_links:
            args += ["--find-links", self.find_links]
        return args


def normalise(requirements: list[str]) -> list[str]:
    """Each requirement checked and stripped, comments and blanks dropped, sorted, each once.
    Options (`-r`, `--index-url`, `-e`...) and local paths are refused: where packages come from
    is the operator's choice, and a path would read the node's files."""
    found: set[str] = set()
    for number, raw in enumerate(requirements, 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if len(line) > MAX_REQUIREMENT_CHARS:
            raise EnvError(
                f"requirement {number} is longer than {MAX_REQUIREMENT_CHARS} characters"
            )
        if line.startswith("-"):
            raise EnvError(
                f"requirement {number} ({line[:60]!r}) is an option; only requirements are allowed"
            )
        if not _NAME.match(line):
            raise EnvError(f"requirement {number} ({line[:60]!r}) is not a package requirement")
        if "@" in line and not re.search(r"@\s*https://", line.split(";", 1)[0]):
            raise EnvError(f"requirement {number} ({line[:60]!r}): only https URLs are allowed")
        found.add(line)
    if len(found) > MAX_REQUIREMENTS:
        raise EnvError(f"more than {MAX_REQUIREMENTS} requirements")
    return sorted(found)


def read_requirements_file(path: pathlib.Path) -> list[str]:
    """A bundle's requirements.txt (in the unpacked tree, opened without following a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        raise EnvError(f"requirements.txt cannot be read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise EnvError("requirements.txt is not a file")
        data = handle.read((1 << 20) + 1)
    if len(data) > 1 << 20:
        raise EnvError("requirements.txt is over 1 MiB")
    return data.decode("utf-8", errors="replace").splitlines()


def interpreter() -> pathlib.Path:
    """The Python jobs' environments are built on: the agent's own."""
    return pathlib.Path(sys.executable)


def digest_of(requirements: list[str], python: pathlib.Path) -> str:
    identity = f"{python.resolve()} {sys.version_info[:3]}\n" + "\n".join(requirements)
    return hashlib.sha256(identity.encode()).hexdigest()


@dataclass(frozen=True)
class Env:
    digest: str
    path: pathlib.Path
    reused: bool

    @property
    def bin(self) -> pathlib.Path:
        return self.path / "bin"

    @property
    def python(self) -> pathlib.Path:
        return self.bin / "python"


class EnvCache:
    def __init__(self, root: pathlib.Path, settings: Settings | None = None):
        self.root = root
        self.settings = settings or Settings.from_env()
        root.mkdir(parents=True, exist_ok=True)
        # Jobs reach an environment through a bind mount of its own dir (workers/jail.py), or,
        # unfenced, as the agent: its parents need not be open to them.
        root.chmod(0o711)

    def get(
        self, requirements: list[str], log: BinaryIO, stopped: Callable[[], bool] = _never
    ) -> Env:
        """The environment for these (normalised) requirements, built unless it is here; what
        the build prints (as it prints it), or one line saying it was reused, goes to `log`.
        `stopped()` true (the member was stopped meanwhile): the wait or the build ends, Stopped."""
        python = interpreter()
        digest = digest_of(requirements, python)
        path = self.root / digest
        with open(self.root / f"{digest}.lock", "a") as lock:
            # One build at a time; the others wait, then reuse it.
            while not _try_lock(lock):
                if stopped():
                    raise Stopped("stopped while waiting for another build")
                time.sleep(0.2)
            if (path / COMPLETE).exists():
                log.write(f"gpuplatform: environment {digest[:12]} reused\n".encode())
                log.flush()
                return Env(digest=digest, path=path, reused=True)
            self._build(path, digest, requirements, python, log, stopped)
        return Env(digest=digest, path=path, reused=False)

    def _build(self, path: pathlib.Path, digest: str, requirements: list[str], python: pathlib.Path,
               log: BinaryIO, stopped: Callable[[], bool]) -> None:  # fmt: skip
        import uv

        if path.exists():  # a build that died half way
            _make_writable(path)
            shutil.rmtree(path)
        log.write(
            f"gpuplatform: building environment {digest[:12]} ({len(requirements)} requirements)\n".encode()
        )
        log.flush()
        began = time.monotonic()
        uv_bin = uv.find_uv_bin()
        (self.root / ".uv-cache").mkdir(exist_ok=True, mode=0o700)
        env = {k: os.environ[k] for k in BUILD_ENV_PASSTHROUGH if k in os.environ}
        env.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=str(self.root), LANG="C.UTF-8",
                   UV_CACHE_DIR=str(self.root / ".uv-cache"), UV_NO_CONFIG="1",
                   UV_PYTHON_DOWNLOADS="never", NO_COLOR="1")  # fmt: skip
        requirements_file = self.root / f".{digest}.requirements.txt"
        requirements_file.write_text("".join(line + "\n" for line in requirements))
        steps = [
            [uv_bin, "venv", "--python", str(python), "--no-project", str(path)],
            # Compiled as it is installed: the environment is read-only to its jobs, which
            # could never write the bytecode themselves (each import would compile again).
            [uv_bin, "pip", "install", "--python", str(path / "bin" / "python"), "--compile-bytecode",
             *self.settings.uv_args(), "-r", str(requirements_file)],
        ]  # fmt: skip
        if not requirements:
            steps.pop()
        try:
            for step in steps:
                self._run(step, env, log, began, stopped)
        except BaseException:
            if path.exists():
                _make_writable(path)
                shutil.rmtree(path, ignore_errors=True)
            raise
        finally:
            requirements_file.unlink(missing_ok=True)
        (path / COMPLETE).write_text(" ".join(requirements) + "\n")
        _make_read_only(path)
        log.write(
            f"gpuplatform: environment {digest[:12]} built in {time.monotonic() - began:.1f}s\n".encode()
        )
        log.flush()

    def _run(self, argv: list[str], env: dict[str, str], log: BinaryIO, began: float,
             stopped: Callable[[], bool]) -> None:  # fmt: skip
        """One uv step, its output copied to the log as it comes; killed when the member is
        stopped or the build passes its time."""
        process = subprocess.Popen(argv, env=env, cwd=self.root, stdin=subprocess.DEVNULL,  # noqa: S603
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        assert process.stdout is not None
        output: list[bytes] = []
        reader = threading.Thread(target=_copy, args=(process.stdout, log, output), daemon=True)
        reader.start()
        try:
            while process.poll() is None:
                try:
                    process.wait(0.2)
                except subprocess.TimeoutExpired:
                    pass
                if stopped():
                    raise Stopped("stopped while its environment was built")
                if time.monotonic() - began > self.settings.build_timeout:
                    raise EnvError(f"the build took over {self.settings.build_timeout}s")
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            reader.join(5)
        if process.returncode != 0:
            raise EnvError(_cause(b"".join(output).decode(errors="replace")))


def _copy(pipe: BinaryIO, log: BinaryIO, output: list[bytes]) -> None:
    with pipe:
        for line in pipe:
            output.append(line)
            log.write(line)
            log.flush()


def _try_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _cause(output: str) -> str:
    """uv's own words, shortened: its error and the sentence that explains it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith(("error:", "×")):
            words = [line.removeprefix("error:").lstrip("× ").strip()]
            for more in lines[index + 1 :]:
                words.append(more.lstrip("╰─▶│ ").strip())
                if more.endswith(".") or sum(map(len, words)) > 240:
                    break
            return _short(" ".join(words))
    return _short(lines[-1] if lines else "uv failed")


def _short(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _make_read_only(path: pathlib.Path) -> None:
    for directory, _, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            target = os.path.join(directory, name)
            info = os.lstat(target)
            if stat.S_ISREG(info.st_mode):
                os.chmod(target, 0o555 if info.st_mode & 0o111 else 0o444)
        os.chmod(directory, 0o555)


def _make_writable(path: pathlib.Path) -> None:
    for directory, _, _ in os.walk(path, followlinks=False):
        os.chmod(directory, 0o755)
