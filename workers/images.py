"""OCI images on the node (docs/images.md): pulled with skopeo, unpacked with umoci, cached by
manifest digest and shared by every job that runs that digest. Pure Python, no Django.

- The digest: the job's `image_digest` where the platform has one (every attempt after the
  first), else the reference's `@sha256:`, else what the registry answers for its tag now
  (`skopeo inspect`); the first pull reports it (the agent API's image endpoint) and runs the
  digest the platform then holds, so a re-tag never changes what a job runs.
- The pull: `skopeo copy docker://HOST/REPO@DIGEST oci:<cache>/oci:<hex>`, into one OCI layout
  whose blobs (layers, configs) are content-addressed and shared across images. Credentials go
  to skopeo in an auth file of mode 0600 in the agent's own 0700 dir, removed after the call:
  never on a command line, in a log or on the job. `--src-tls-verify=false` only for a host in
  GPUPLATFORM_INSECURE_REGISTRIES.
- The unpack: `umoci raw unpack` as root into `<cache>/roots/<hex>/`, once; the root's files
  keep the image's owners (root's, mostly), so a job (never root) cannot change them, and each
  job writes to an overlay of its own (workers/image_root.py).
- One pull per digest however many jobs want it: a lock file per digest (flock); whoever waits
  finds the root ready and logs `image <digest12> cached`.
- In use: every member holds its image's use lock (`locks/<hex>.use`, flock shared) from before
  it looks for the image until it ends (`release`); the agent holds it, and a fenced job dies
  with its agent (the fork server's PDEATHSIG), so no job runs in an image nobody holds.
- The cap (GPUPLATFORM_IMAGE_CACHE_GIB, default 100): after each pull, the least recently used
  images (the mtime of their `ready`, touched at each use) that no member holds (their use lock
  taken exclusively without waiting) go, unpacked root and tag, then `umoci gc` drops the blobs
  no image left names, until the cache fits. An image in use is never evicted, even where the
  cache stays over its cap: the agent's log says so. An eviction never waits for another
  image's download: tags and blobs go when the layout is free (`_drop_pending`).
- After a crash: what a killed agent left half done (an unpack's scratch, a tag never unpacked,
  partial downloads, auth files) is removed when the cache is next made (`sweep`).
- Too big: the manifest's sizes (layers and config, compressed) summed before any layer is
  fetched; over GPUPLATFORM_IMAGE_MAX_GIB (default: the cache's cap) the job fails at once.
- Progress: the job's log gets the image's size and layers at the start, a line per layer as
  skopeo starts it, and the bytes fetched so far every PROGRESS_EVERY seconds.
- A pull that fails for the job's own reason (auth refused, no such image, a corrupt layer) is
  final: the job fails at once, naming the image and why, no retry (too big as well); a registry that does not
  answer is tried RETRIES times with backoff first, then the same.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import logging
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from apps.platform import images as refs
from workers import image_driver
from workers.isolation import env_int

log = logging.getLogger(__name__)

SKOPEO, UMOCI = "skopeo", "umoci"
RETRIES = 3
PULL_TIMEOUT = 3600
PROGRESS_EVERY = 5.0  # seconds between "fetched N of M MB" lines during a pull
GIB, MB = 2**30, 10**6
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")  # fmt: skip
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
UNREACHABLE = ("connection refused", "no such host", "i/o timeout", "timeout", "connection reset")
# Whole words only: a registry on port 34403 or a repository named team/denied-x is not a refusal.
NOT_FOUND = re.compile(r"\b(manifest unknown|not found|name unknown|404)\b")
AUTH = re.compile(r"\b(unauthorized|authentication required|denied|401|403)\b")


class PullFailed(Exception):
    """The image could not be had; `final`: the job's own reason (no retry)."""

    def __init__(self, reason: str, final: bool = True):
        super().__init__(reason)
        self.reason, self.final = reason, final


@dataclass(frozen=True)
class Image:
    """An unpacked image: its root dir (read-only, shared) and what its config says."""

    digest: str
    rootfs: pathlib.Path
    env: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    working_dir: str = ""
    user: str = ""  # recorded, never applied: the job runs as its own uid


def insecure_registries() -> list[str]:
    # Registries reached over plain HTTP (tests use one on loopback): hosts or host:port.
    raw = os.environ.get("GPUPLATFORM_INSECURE_REGISTRIES", "")
    return [item.strip() for item in raw.split(",") if item.strip()]


def _run(argv: list[str], *, timeout: float = PULL_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 (an argv list, no shell; no secret in it)
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False
    )


def _why(stderr: str, auth: str | None) -> str:
    """skopeo's or umoci's last line, without anything of the credentials."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    text = lines[-1] if lines else "no output"
    if auth:
        for part in {auth, *auth.split(":", 1)}:
            if len(part) >= 3:
                text = text.replace(part, "***")
    text = re.sub(r'time="[^"]*" level=\w+ msg=', "", text)
    return text[:200]


def _without_names(text: str, ref: refs.ImageRef) -> str:
    """skopeo's words without the image's own names, which may hold "403" or "denied"."""
    for name in sorted({str(ref), ref.host, ref.repository}, key=len, reverse=True):
        text = text.replace(name.lower(), "<image>")
    return text


def _say(head: BinaryIO, line: str) -> None:
    head.write(f"gpuplatform: {line}\n".encode())
    head.flush()


def _watched(argv: list[str], watch: Callable[[str], None], every: float = 1.0
             ) -> subprocess.CompletedProcess:  # fmt: skip
    """`_run`, with `watch(stdout so far)` called about every `every` seconds while it runs."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)  # noqa: S603
        deadline = time.monotonic() + PULL_TIMEOUT
        while True:
            try:
                process.wait(timeout=every)
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise
            out.seek(0)
            watch(out.read().decode(errors="replace"))
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        watch(stdout)
        return subprocess.CompletedProcess(argv, process.returncode, stdout,
                                           err.read().decode(errors="replace"))  # fmt: skip


class Progress:
    """A pull's lines in the job's log: each layer as skopeo starts it (its size from the
    manifest), and every PROGRESS_EVERY seconds the bytes fetched into the layout so far."""

    BLOB = re.compile(r"^Copying blob (sha256:[0-9a-f]{64})(.*)$", re.MULTILINE)

    def __init__(self, head: BinaryIO, short: str, blobs: dict[str, int], layout: pathlib.Path):
        self.head, self.short, self.layout = head, short, layout
        self.layers = list(blobs)[1:]  # the config's first
        self.sizes, self.total = blobs, sum(blobs.values())
        self.said: set[str] = set()
        self.before, self.last = _layout_bytes(layout), time.monotonic()

    def __call__(self, stdout: str) -> None:
        for match in self.BLOB.finditer(stdout):
            digest, rest = match.group(1), match.group(2)
            if digest in self.said:
                continue
            self.said.add(digest)
            number = self.layers.index(digest) + 1 if digest in self.layers else 0
            had = ", already here" if "skipped" in rest else ""
            _say(self.head, f"image {self.short} layer {number}/{len(self.layers)} "
                            f"{digest[7:19]} ({self.sizes.get(digest, 0) / MB:.1f} MB{had})")  # fmt: skip
        if time.monotonic() - self.last >= PROGRESS_EVERY:
            self.last = time.monotonic()
            fetched = max(0, _layout_bytes(self.layout) - self.before)
            _say(self.head, f"image {self.short} fetched {fetched / MB:.1f} of "
                            f"{self.total / MB:.1f} MB")  # fmt: skip


def _layout_bytes(layout: pathlib.Path) -> int:
    """The layout's blobs, and the partial downloads skopeo writes beside them."""
    total = 0
    for where in (layout, layout / "blobs" / "sha256"):
        with contextlib.suppress(FileNotFoundError), os.scandir(where) as entries:
            for entry in entries:
                with contextlib.suppress(FileNotFoundError):
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
    return total


def _tree_bytes(root: pathlib.Path) -> int:
    """The bytes an unpacked root takes on disk (its blocks; a hard link once per name)."""
    total = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _entry_bytes(bundle: pathlib.Path) -> int:
    try:
        return int((bundle / "size").read_text())
    except (FileNotFoundError, ValueError):
        return _tree_bytes(bundle)


def _marker_bytes(marker: pathlib.Path) -> int:
    try:
        return int(marker.read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def _last_used(bundle: pathlib.Path) -> float:
    try:
        return (bundle / "ready").stat().st_mtime
    except FileNotFoundError:
        return 0.0


class ImageCache:
    def __init__(self, root: pathlib.Path, *, insecure: list[str] | None = None,
                 cap_bytes: int | None = None, max_bytes: int | None = None):  # fmt: skip
        self.root = root
        self.insecure = insecure_registries() if insecure is None else insecure
        # The cache's cap in GiB (unpacked roots and blobs): least recently used images no job
        # uses go past it after each pull; one in use never does.
        cap = env_int("GPUPLATFORM_IMAGE_CACHE_GIB", 100, minimum=1)
        self.cap = cap_bytes if cap_bytes is not None else cap * GIB
        # The largest image a job may pull in GiB (compressed, as its manifest says; 0: the
        # cache's cap): a job with a bigger one fails at once, "too big".
        largest = env_int("GPUPLATFORM_IMAGE_MAX_GIB", 0)
        self.max = (max_bytes if max_bytes is not None else largest * GIB) or self.cap
        self.layout = root / "oci"
        for path in (root, root / "roots", root / "locks", root / "auth", root / "jobs"):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        # All 0700, root's: a job reaches its image only through the mounts its fence makes.
        self.sweep()  # what an agent killed half-way through a pull or an unpack left

    # --- the steps --------------------------------------------------------------------------

    def resolve(self, ref: refs.ImageRef, auth: str | None) -> str:
        """The manifest digest the reference's tag names at the registry now."""
        with self._auth_file(ref, auth) as authfile:
            argv = [SKOPEO, "inspect", "--retry-times", "0", "--format", "{{.Digest}}",
                    *self._tls(ref, "--tls-verify"), *authfile, f"docker://{ref}"]  # fmt: skip
            result = self._tried(argv, ref, auth)
        digest = result.stdout.strip()
        if not refs.DIGEST.fullmatch(digest):
            raise PullFailed(f"image {ref}: the registry gave no sha256 digest ({digest[:80]!r})")
        return digest

    def acquire(
        self, ref: refs.ImageRef, digest: str, auth: str | None, head: BinaryIO
    ) -> tuple[Image, int]:
        """The unpacked image of `digest` (pulled and unpacked here if no job did it before) and
        the fd of its use lock, held (shared) until `release(fd)`: no eviction takes it before."""
        hexa = digest.split(":", 1)[1]
        fd = os.open(self.root / "locks" / f"{hexa}.use", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)  # fmt: skip
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use from here: eviction passes it by
            image, pulled = self._get(ref, digest, auth, head)
        except BaseException:
            os.close(fd)
            raise
        if pulled:
            self.evict()
        return image, fd

    @staticmethod
    def release(fd: int) -> None:
        os.close(fd)  # drops the shared lock: the image may be evicted from now on

    def _get(self, ref: refs.ImageRef, digest: str, auth: str | None, head: BinaryIO
             ) -> tuple[Image, bool]:  # fmt: skip
        hexa = digest.split(":", 1)[1]
        bundle = self.root / "roots" / hexa
        with self._locked(f"{hexa}.lock"):
            if (bundle / "ready").exists():
                os.utime(bundle / "ready")  # used now: the last to be evicted
                _say(head, f"image {hexa[:12]} cached")
                return self._image(digest, bundle), False
            began = time.monotonic()
            layers = self._sizes(ref, digest, auth)
            total = sum(layers.values())
            if total > self.max:
                raise PullFailed(f"image {ref}: too big: {total / MB:.1f} MB, over the node's "
                                 f"limit of {self.max / MB:.1f} MB (GPUPLATFORM_IMAGE_MAX_GIB)")  # fmt: skip
            _say(head, f"image {hexa[:12]} pulling {ref.pinned(digest)} ({total / MB:.1f} MB "
                       f"in {len(layers) - 1} layer(s))")  # fmt: skip
            with self._locked("layout.lock"), self._auth_file(ref, auth) as authfile:
                self._drop_marker(hexa).unlink(missing_ok=True)  # evicted before: its tag stays
                argv = [SKOPEO, "copy", "--retry-times", "0",
                        *self._tls(ref, "--src-tls-verify"), *authfile,
                        f"docker://{ref.pinned(digest)}", f"oci:{self.layout}:{hexa}"]  # fmt: skip
                progress = Progress(head, hexa[:12], layers, self.layout)
                try:
                    self._tried(argv, ref, auth, watch=progress)
                finally:
                    self._drop_pending()  # what evictions left while this download held the lock
            pulled = time.monotonic()
            scratch = bundle.with_name(f".{hexa}.{secrets.token_hex(4)}")
            scratch.mkdir(mode=0o700)
            result = _run([UMOCI, "raw", "unpack", "--image", f"{self.layout}:{hexa}",
                           str(scratch / "rootfs")])  # fmt: skip
            if result.returncode != 0:
                shutil.rmtree(scratch, ignore_errors=True)
                raise PullFailed(f"image {ref}: could not unpack: {_why(result.stderr, None)}")
            self._write_config(hexa, scratch / "image.json")
            (scratch / "size").write_text(str(_tree_bytes(scratch / "rootfs")))
            (scratch / "ready").touch()
            shutil.rmtree(bundle, ignore_errors=True)  # an unpack a crash left unfinished
            scratch.rename(bundle)
            _say(head, f"image {hexa[:12]} pulled in {pulled - began:.2f}s, "
                       f"unpacked in {time.monotonic() - pulled:.2f}s")  # fmt: skip
            return self._image(digest, bundle), True

    # --- the cap ----------------------------------------------------------------------------

    def size(self) -> int:
        """The cache's bytes: the unpacked roots, and the layout's blobs (shared by images), less
        the blobs of evicted images whose tags wait for the layout (`_drop_pending`)."""
        pending = sum(_marker_bytes(path) for path in (self.root / "locks").glob("*.drop"))
        roots = sum(_entry_bytes(path) for path in self._entries())
        return max(0, roots + _layout_bytes(self.layout) - pending)

    def evict(self) -> list[str]:
        """Drop the least recently used images no member holds until the cache fits its cap;
        the digests (hex) it dropped. One in use stays, whatever the cap: the log says so.

        It never waits for another image's download: the roots go at once, and their tags and
        blobs (`umoci rm`, `umoci gc`, which need the layout that a download holds) go now if the
        layout is free, else when that download ends (`_drop_pending`)."""
        evicted: list[str] = []
        with self._locked("evict.lock"):
            total = self.size()
            if total <= self.cap:
                return evicted
            in_use: list[str] = []
            for path in sorted(self._entries(), key=_last_used):
                if total <= self.cap:
                    break
                if self._remove_unless_used(path.name):
                    evicted.append(path.name)
                    total = self.size()
                else:
                    in_use.append(path.name)
        if evicted:
            with self._locked("layout.lock", wait=False) as free:
                if free:
                    self._drop_pending()
        for hexa in evicted:
            log.info("image cache: evicted %s (over %.1f GiB)", hexa[:12], self.cap / GIB)
        if total > self.cap:
            log.warning("image cache: %.2f GiB, over its cap of %.2f GiB: the images left are "
                        "in use by running jobs and are kept (%s)", total / GIB, self.cap / GIB,
                        ", ".join(hexa[:12] for hexa in in_use) or "none")  # fmt: skip
        return evicted

    def _entries(self) -> list[pathlib.Path]:
        roots = self.root / "roots"
        return [
            path
            for path in roots.iterdir()
            if re.fullmatch(r"[0-9a-f]{64}", path.name) and (path / "ready").exists()
        ]

    def _remove_unless_used(self, hexa: str) -> bool:
        fd = os.open(self.root / "locks" / f"{hexa}.use", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)  # fmt: skip
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a member runs in it, or waits for its pull
            # Its tag goes later, with the layout: the marker says so and what that frees.
            self._drop_marker(hexa).write_text(str(self._own_blob_bytes(hexa)))
            gone = self.root / "roots" / f".evicted-{hexa}-{secrets.token_hex(4)}"
            (self.root / "roots" / hexa).rename(gone)  # no longer `ready`: a later use pulls it
            shutil.rmtree(gone, ignore_errors=True)
            return True
        finally:
            os.close(fd)

    def _drop_marker(self, hexa: str) -> pathlib.Path:
        return self.root / "locks" / f"{hexa}.drop"

    def _drop_pending(self) -> None:
        """The tags of evicted images, then the blobs no tag names. Only with the layout's lock
        held (a download writes the layout; `umoci gc` must not see its blobs half there). A tag
        pulled again since its eviction lost its marker then and stays."""
        markers = sorted((self.root / "locks").glob("*.drop"))
        for marker in markers:
            hexa = marker.name.removesuffix(".drop")
            if not (self.root / "roots" / hexa / "ready").exists():
                _run([UMOCI, "rm", "--image", f"{self.layout}:{hexa}"], timeout=600)
        if markers:
            _run([UMOCI, "gc", "--layout", str(self.layout)], timeout=600)
        for marker in markers:
            marker.unlink(missing_ok=True)

    def _own_blob_bytes(self, hexa: str) -> int:
        """The bytes of the blobs only the image tagged `hexa` names in the layout (what its
        drop frees); 0 where the layout cannot say now (a download rewriting its index)."""
        try:
            tags = self._tags()
            own = self._blobs_of(tags.pop(hexa))
            for manifest in tags.values():
                own -= self._blobs_of(manifest)
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        total = 0
        for digest in own:
            with contextlib.suppress(OSError):
                total += (self.layout / "blobs" / "sha256" / digest.split(":", 1)[1]).stat().st_size
        return total

    def _tags(self) -> dict[str, str]:
        """The layout's tags (an image's hex) and the manifest digest each names."""
        index = json.loads((self.layout / "index.json").read_text())
        return {
            (m.get("annotations") or {}).get("org.opencontainers.image.ref.name", ""): m["digest"]
            for m in index.get("manifests") or []
        }

    def _blobs_of(self, manifest_digest: str) -> set[str]:
        manifest = json.loads(self._blob(manifest_digest))
        return {manifest_digest, manifest["config"]["digest"],
                *(layer["digest"] for layer in manifest.get("layers") or [])}  # fmt: skip

    # --- after a crash ----------------------------------------------------------------------

    def sweep(self) -> None:
        """Remove what an agent killed half-way through a pull, an unpack or an eviction left,
        none of which is ever taken for an image (only `roots/<hex>` with its `ready` is): an
        unpack's scratch (`roots/.<hex>.<random>`), an eviction's half-removed root, a root with
        no `ready`, a tag pulled but never unpacked (its blobs with it), skopeo's partial
        downloads in the layout, an auth file. Each only where its lock says nobody works on it
        now: whatever is busy is left to the next start."""
        roots = self.root / "roots"
        for path in roots.iterdir():
            half = re.fullmatch(r"\.?([0-9a-f]{64})(\.[0-9a-f]+)?", path.name)
            if path.name.startswith(".evicted-"):
                shutil.rmtree(path, ignore_errors=True)
            elif half and (path.name.startswith(".") or not (path / "ready").exists()):
                with self._locked(f"{half.group(1)}.lock", wait=False) as free:
                    if free:  # nobody pulls or unpacks it now
                        log.info("image cache: removing %s, left half done", path.name[:16])
                        shutil.rmtree(path, ignore_errors=True)
        for path in (self.root / "auth").iterdir():
            self._remove_unlocked(path)
        self._sweep_layout()

    def _sweep_layout(self) -> None:
        if not (self.layout / "index.json").exists():
            return
        with self._locked("layout.lock", wait=False) as free:
            if not free:
                return  # a download runs: its partial blobs are its own
            for path in self.layout.iterdir():
                if path.is_file() and path.name not in ("index.json", "oci-layout"):
                    path.unlink(missing_ok=True)  # skopeo's partial downloads
            try:
                unpacked = [tag for tag in self._tags() if re.fullmatch(r"[0-9a-f]{64}", tag)]
            except (OSError, ValueError, KeyError, TypeError):
                return
            for hexa in unpacked:
                if not (self.root / "roots" / hexa / "ready").exists():
                    with self._locked(f"{hexa}.lock", wait=False) as idle:
                        if idle:  # pulled, never unpacked: its tag goes, its blobs with gc
                            self._drop_marker(hexa).write_text("0")
            self._drop_pending()

    @staticmethod
    def _remove_unlocked(path: pathlib.Path) -> None:
        """An auth file whose call is over (each call holds its file's lock while it runs)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)

    # --- helpers ----------------------------------------------------------------------------

    def _tls(self, ref: refs.ImageRef, option: str) -> list[str]:
        if ref.host in self.insecure or ref.hostname in self.insecure:
            return [f"{option}=false"]
        return []

    def _sizes(self, ref: refs.ImageRef, digest: str, auth: str | None) -> dict[str, int]:
        """The image's blobs and their sizes as its manifest says (the config's too), before
        anything is fetched; for an index, those of the entry for this node's platform."""
        manifest = self._raw(ref, digest, auth)
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            entries = [
                entry for entry in manifest.get("manifests") or []
                if (entry.get("platform") or {}).get("os", "linux") == "linux"
                and (entry.get("platform") or {}).get("architecture", ARCH) == ARCH
            ]  # fmt: skip
            if not entries or not refs.DIGEST.fullmatch(str(entries[0].get("digest"))):
                raise PullFailed(f"image {ref}: no linux/{ARCH} image in its index")
            manifest = self._raw(ref, entries[0]["digest"], auth)
        try:
            blobs = [manifest["config"], *manifest["layers"]]
            return {str(blob["digest"]): int(blob["size"]) for blob in blobs}
        except (KeyError, TypeError, ValueError):
            raise PullFailed(f"image {ref}: its manifest names no layers with sizes") from None

    def _raw(self, ref: refs.ImageRef, digest: str, auth: str | None) -> dict:
        with self._auth_file(ref, auth) as authfile:
            argv = [SKOPEO, "inspect", "--retry-times", "0", "--raw",
                    *self._tls(ref, "--tls-verify"), *authfile,
                    f"docker://{ref.pinned(digest)}"]  # fmt: skip
            result = self._tried(argv, ref, auth)
        try:
            manifest = json.loads(result.stdout)
        except ValueError:
            raise PullFailed(f"image {ref}: its manifest is not JSON") from None
        if not isinstance(manifest, dict):
            raise PullFailed(f"image {ref}: its manifest is not a JSON object")
        return manifest

    def _tried(self, argv: list[str], ref: refs.ImageRef, auth: str | None,
               watch: Callable[[str], None] | None = None) -> subprocess.CompletedProcess:  # fmt: skip
        """Run skopeo; a registry that does not answer is tried again (backoff 1, 2 s...)."""
        for attempt in range(RETRIES):
            try:
                result = _run(argv) if watch is None else _watched(argv, watch)
            except subprocess.TimeoutExpired:
                raise PullFailed(f"image {ref}: the registry took too long") from None
            if result.returncode == 0:
                return result
            why = _why(result.stderr, auth)
            low = _without_names(result.stderr.lower(), ref)
            if AUTH.search(low):
                raise PullFailed(f"image {ref}: the registry refused the credentials: {why}")
            if NOT_FOUND.search(low):
                raise PullFailed(f"image {ref}: not found: {why}")
            if not any(word in low for word in UNREACHABLE):
                raise PullFailed(f"image {ref}: {why}")  # a corrupt layer, a bad manifest...
            if attempt < RETRIES - 1:
                time.sleep(2**attempt)
        raise PullFailed(f"image {ref}: the registry does not answer ({why})")

    @contextlib.contextmanager
    def _auth_file(self, ref: refs.ImageRef, auth: str | None) -> Iterator[list[str]]:
        """`--authfile PATH` for skopeo (0600, in the agent's own dir, gone after), or none."""
        if not auth:
            yield []
            return
        path = self.root / "auth" / f"{secrets.token_hex(8)}.json"
        encoded = base64.b64encode(auth.encode()).decode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # in use: a sweep passes it by
            os.write(fd, json.dumps({"auths": {ref.host: {"auth": encoded}}}).encode())
            yield ["--authfile", str(path)]
        finally:
            path.unlink(missing_ok=True)
            os.close(fd)

    @contextlib.contextmanager
    def _locked(self, name: str, *, wait: bool = True) -> Iterator[bool]:
        """The lock file `name` held; with wait=False, False (and not held) where it is busy."""
        fd = os.open(self.root / "locks" / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # closing drops the lock

    def _blob(self, digest: str) -> bytes:
        algorithm, hexa = digest.split(":", 1)
        return (self.layout / "blobs" / algorithm / hexa).read_bytes()

    def _write_config(self, hexa: str, target: pathlib.Path) -> None:
        """The image config's `config` part (Env, Entrypoint, Cmd, WorkingDir, User) beside the
        root, read from the layout: the manifest tagged `hexa`, then its config blob."""
        index = json.loads((self.layout / "index.json").read_text())
        manifest = next(
            m for m in index["manifests"]
            if (m.get("annotations") or {}).get("org.opencontainers.image.ref.name") == hexa
        )  # fmt: skip
        config = json.loads(
            self._blob(json.loads(self._blob(manifest["digest"]))["config"]["digest"])
        )
        target.write_text(json.dumps(config.get("config") or {}))

    def _image(self, digest: str, bundle: pathlib.Path) -> Image:
        config = json.loads((bundle / "image.json").read_text())
        return Image(
            digest=digest, rootfs=bundle / "rootfs", env=list(config.get("Env") or []),
            entrypoint=list(config.get("Entrypoint") or []), cmd=list(config.get("Cmd") or []),
            working_dir=config.get("WorkingDir") or "", user=config.get("User") or "",
        )  # fmt: skip


# --- the member's side: prepare (workers/prepare.py), spawn and fence (workers/runner.py) -----

_overlay: dict[str, bool] = {}


def overlay_works(root: pathlib.Path) -> bool:
    """Whether this kernel mounts an overlay here (tried once per cache, in a throwaway mount
    namespace): where it does not, each member gets a private copy of the root instead."""
    if str(root) not in _overlay:
        probe = root / "jobs" / f".probe-{secrets.token_hex(4)}"
        for name in ("lower", "upper", "work", "mount"):
            (probe / name).mkdir(parents=True)
        options = f"lowerdir={probe / 'lower'},upperdir={probe / 'upper'},workdir={probe / 'work'}"
        try:
            result = _run(["unshare", "--mount", "mount", "-t", "overlay", "overlay", "-o", options,
                           str(probe / "mount")], timeout=30)  # fmt: skip
            _overlay[str(root)] = result.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            _overlay[str(root)] = False
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    return _overlay[str(root)]


def prepare_member(cache: ImageCache, reporter, run, head: BinaryIO, *, jailed: bool) -> None:
    """Pull (or find) the member's image, fix its digest with the platform, make its own layer's
    dirs; the runner then runs it in that root (`command`, `environment`, `fence`)."""
    a = run.assignment
    if not jailed:
        raise PullFailed("images run only on a node that fences jobs (a root agent with cgroups)")
    try:
        ref = refs.parse(a.image)
    except refs.BadReference as error:
        raise PullFailed(f"image {a.image[:100]!r}: {error}") from None
    auth = reporter.image_auth(run) if getattr(a, "image_auth", False) else None
    digest = getattr(a, "image_digest", "") or ref.digest or cache.resolve(ref, auth)
    if not getattr(a, "image_digest", ""):
        fixed = reporter.image_digest(run, digest)  # the first member's report wins
        digest = fixed if fixed and refs.DIGEST.fullmatch(fixed) else digest
    image, held = cache.acquire(ref, digest, auth, head)
    run.extra["image_use"] = held  # until the member ends (`release`): never evicted before
    scratch = scratch_dir(cache.root, run.key)
    clear_scratch(scratch)
    for name in ("upper", "work", "mount"):
        (scratch / name).mkdir(mode=0o700, parents=True)
    os.chmod(scratch / "upper", os.stat(image.rootfs).st_mode & 0o7777)  # the root's own mode
    if not overlay_works(cache.root):
        shutil.copytree(image.rootfs, scratch / "copy", symlinks=True)
        head.write(b"gpuplatform: no overlayfs here: the job runs in a private copy of the image\n")
    run.extra["image"], run.extra["image_scratch"] = image, scratch
    driver = image_driver.mounts(bool(a.gpu_indices))  # the host's NVIDIA driver, read-only
    if driver:
        _say(head, f"the node's NVIDIA driver in the image: {len(driver)} files in "
                   f"{image_driver.LIB_DIR} and {image_driver.BIN_DIR}")  # fmt: skip
    run.extra["image_driver"] = driver


def command(image: Image, argv: list[str]) -> list[str]:
    """Docker's rule: the image's Entrypoint, then the submit's command or else its Cmd."""
    return [*image.entrypoint, *(argv or image.cmd)]


def environment(image: Image, env: dict[str, str]) -> dict[str, str]:
    """The image's Env under the job's (its variables, secrets and the platform's win), but the
    image's PATH where it sets one; no PYTHONPATH to the node's SDK (not in the image)."""
    merged: dict[str, str] = {}
    for item in image.env:
        name, _, value = item.partition("=")
        if name:
            merged[name] = value
    image_path = merged.get("PATH")
    merged.update(env)
    merged.pop("PYTHONPATH", None)
    merged["PATH"] = image_path or merged.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return merged


def for_job(run, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The member's argv and environment: as they are without an image, else the image's."""
    image = run.extra.get("image")
    if image is None:
        return argv, env
    argv = command(image, list(run.assignment.argv))
    if not argv:
        run.failure = "final"  # the job's own input: no retry changes it
        raise ValueError("the image has no Entrypoint or Cmd and the submit no command")
    env = environment(image, env)
    return argv, image_driver.environment(env) if run.extra.get("image_driver") else env


def fence(run, spec: dict, own_gpus: list[pathlib.Path]) -> None:
    """The fence's spec for a member with an image (workers/image_root.py reads it)."""
    image, scratch = run.extra.get("image"), run.extra.get("image_scratch")
    if image is None or scratch is None:
        return
    working_dir = image.working_dir if not run.assignment.bundle else ""
    spec["image"] = {
        "rootfs": str(image.rootfs), "upper": str(scratch / "upper"), "work": str(scratch / "work"),
        "mount": str(scratch / "mount"),
        "copy": str(scratch / "copy") if (scratch / "copy").is_dir() else "",
        "devices": [str(path) for path in own_gpus] + (image_driver.control_devices(own_gpus)
                                                       if run.extra.get("image_driver") else []),
        "driver": [list(pair) for pair in run.extra.get("image_driver") or []],
        "binds": [str(run.workdir), str(run.checkpoint_dir)], "working_dir": working_dir,
    }  # fmt: skip
    if working_dir:
        spec["cwd"] = working_dir


def scratch_dir(cache_root: pathlib.Path, key: tuple[int, int]) -> pathlib.Path:
    """The member's own overlay dirs (upper, work) and mount point, in the agent's dir."""
    return cache_root / "jobs" / f"{key[0]}-{key[1]}"


def clear_scratch(path: pathlib.Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def release(run) -> None:
    """The member ended: its own layer goes, and its hold on its image (evictable from now)."""
    scratch = run.extra.pop("image_scratch", None)
    if scratch is not None:
        clear_scratch(scratch)
    held = run.extra.pop("image_use", None)
    if held is not None:
        ImageCache.release(held)
