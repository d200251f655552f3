"""The node's bundle cache (workers/bundles.py): verified, least recently used entries evicted
past its cap, never one in use, and one download for concurrent fetches of one digest."""

import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import time

import pytest

from workers.bundles import BundleCache, FetchError

KIB = 1024


def blob(tag: str, size: int = 10 * KIB) -> tuple[str, bytes]:
    data = (tag.encode() * size)[:size]
    return hashlib.sha256(data).hexdigest(), data


class Source:
    """Counts its downloads; optionally slow, so that two fetches overlap."""

    def __init__(self, data: bytes, delay: float = 0.0):
        self.data, self.delay, self.calls = data, delay, 0

    def __call__(self):
        self.calls += 1
        time.sleep(self.delay)
        yield self.data[: len(self.data) // 2]
        time.sleep(self.delay)
        yield self.data[len(self.data) // 2 :]


def test_a_fetched_bundle_is_verified_kept_read_only_and_then_cached(tmp_path):
    cache = BundleCache(tmp_path / "bundles", cap_bytes=100 * KIB)
    digest, data = blob("a")
    source = Source(data)
    first = cache.acquire(digest, source)
    assert first.fetched == len(data) and first.path.read_bytes() == data
    assert os.stat(first.path).st_mode & 0o777 == 0o400  # no job can change it
    first.release()
    again = cache.acquire(digest, source)
    assert again.fetched is None and source.calls == 1
    again.release()


def test_a_bundle_that_is_not_its_digest_is_not_kept(tmp_path):
    cache = BundleCache(tmp_path / "bundles", cap_bytes=100 * KIB)
    digest, _ = blob("a")
    with pytest.raises(FetchError, match="has sha256"):
        cache.acquire(digest, Source(b"something else"))
    assert cache.entries() == [] and not [
        p for p in cache.root.iterdir() if p.name.startswith(".download")
    ]
    with pytest.raises(FetchError, match="bad bundle digest"):
        cache.acquire("../../etc/passwd", Source(b""))


def test_least_recently_used_entries_go_first_past_the_cap(tmp_path):
    cache = BundleCache(tmp_path / "bundles", cap_bytes=30 * KIB)  # three 10 KiB bundles fit
    digests = {}
    for index, tag in enumerate("abc"):
        digest, data = blob(tag)
        digests[tag] = digest
        cache.acquire(digest, Source(data)).release()
        os.utime(cache.path(digest), (1000 + index, 1000 + index))  # a, then b, then c
    cache.acquire(digests["a"], Source(b"")).release()  # a used again: b is now the oldest
    digest_d, data_d = blob("d")
    cache.acquire(digest_d, Source(data_d)).release()
    names = {path.name for path in cache.entries()}
    assert names == {digests["a"], digests["c"], digest_d}
    assert cache.size() <= 30 * KIB


def test_an_entry_in_use_is_never_evicted(tmp_path):
    cache = BundleCache(tmp_path / "bundles", cap_bytes=15 * KIB)  # one fits
    digest_a, data_a = blob("a")
    held = cache.acquire(digest_a, Source(data_a))  # a running member holds it
    os.utime(held.path, (1, 1))  # and it is the oldest by far
    digest_b, data_b = blob("b")
    lease_b = cache.acquire(digest_b, Source(data_b))
    # Over the cap, but both are in use (b by the member that fetched it): neither goes.
    assert {p.name for p in cache.entries()} == {digest_a, digest_b}
    lease_b.release()
    assert held.path.exists()
    held.release()
    digest_c, data_c = blob("c")
    cache.acquire(digest_c, Source(data_c)).release()
    assert {p.name for p in cache.entries()} == {digest_c}  # released: now it may go


def test_two_concurrent_fetches_of_one_digest_download_once(tmp_path):
    cache = BundleCache(tmp_path / "bundles", cap_bytes=100 * KIB)
    digest, data = blob("a")
    source = Source(data, delay=0.2)
    leases = []

    def fetch():
        leases.append(cache.acquire(digest, source))

    threads = [threading.Thread(target=fetch, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert source.calls == 1
    assert sorted(lease.fetched is None for lease in leases) == [False, True]
    assert all(lease.path.read_bytes() == data for lease in leases)


def test_a_fetch_never_waits_for_another_user_of_the_entry(tmp_path):
    """Another fetch of the digest holds the entry's use lock shared from before it looks for the
    entry until its member ends; a fetch must wait for a download in flight only, never for that.
    (Before the fetch lock of its own, two fetches that both found the entry missing could leave
    the second waiting for the first one's member to end, which in a test that never releases is
    forever.)"""
    cache = BundleCache(tmp_path / "bundles", cap_bytes=100 * KIB)
    digest, data = blob("a")
    other = os.open(cache.locks / f"{digest}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_SH)  # another member, between its lock and its look
    got = []
    fetcher = threading.Thread(target=lambda: got.append(cache.acquire(digest, Source(data))),
                               daemon=True)  # fmt: skip
    fetcher.start()
    fetcher.join(5)
    os.close(other)
    assert got and got[0].fetched == len(data) and got[0].path.read_bytes() == data


def test_another_process_waits_for_the_download_in_flight(tmp_path):
    """The lock is the file system's (fcntl.flock), so two agents sharing a data dir, or a
    restarted one, download once too."""
    root = tmp_path / "bundles"
    cache = BundleCache(root, cap_bytes=100 * KIB)
    digest, data = blob("a")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), digest], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "fetching"  # the child holds the lock, mid-download
    lease = cache.acquire(digest, Source(b"never asked"))
    assert lease.fetched is None and lease.path.read_bytes() == data
    assert child.communicate(timeout=10)[0].strip() == str(len(data))


_CHILD = """
import sys, time, pathlib
from workers.bundles import BundleCache
from tests.unit.test_bundle_cache import blob
def slow():
    print("fetching", flush=True)
    time.sleep(1.0)
    yield blob("a")[1]
lease = BundleCache(pathlib.Path(sys.argv[1]), cap_bytes=100 * 1024).acquire(sys.argv[2], slow)
print(lease.fetched)
"""
