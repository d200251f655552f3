"""Unpacking a job's bundle without trusting it (workers/unpack.py): every attack is refused with
a reason naming the entry, and nothing is written outside the work dir."""

import io
import os
import stat
import tarfile
import zipfile

import pytest

from workers.unpack import Caps, Refused, archive_kind, unpack

CAPS = Caps(max_bytes=1 << 20, max_files=50)


def tar_gz(path, entries):
    """entries: (name, kind, data-or-target); kind: file, dir, sym, lnk, chr, fifo."""
    with tarfile.open(path, "w:gz") as tar:
        for name, kind, data in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]  # fmt: skip
            if kind in ("sym", "lnk"):
                info.linkname = data
            if kind == "chr":
                info.devmajor, info.devminor = 1, 3
            tar.addfile(info)
    return path


def a_zip(path, entries):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, kind, data in entries:
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            if kind == "sym":
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                bundle.writestr(info, data)
            elif kind == "fifo":
                info.external_attr = (stat.S_IFIFO | 0o644) << 16
                bundle.writestr(info, b"")
            else:
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                bundle.writestr(info, data)
    return path


@pytest.fixture
def place(tmp_path):
    """(parent, work dir): the parent holds only the work dir and the archives' dir."""
    parent = tmp_path / "parent"
    work = parent / "work"
    work.mkdir(parents=True)
    (tmp_path / "archives").mkdir()
    return parent, work


def everything_below(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def refused(archive, work, match):
    with pytest.raises(Refused, match=match):
        unpack(archive, work, CAPS)


GOOD = [("train.py", "file", b"print('hi')\n"), ("data", "dir", b""),
        ("data/x.csv", "file", b"1,2\n"), ("run.sh", "file", b"#!/bin/sh\n"),
        ("link-to-data", "sym", "data/x.csv"), ("data/up", "sym", "../train.py")]  # fmt: skip


def test_a_good_tar_gz_unpacks_whole(tmp_path, place):
    parent, work = place
    archive = tar_gz(tmp_path / "archives" / "b", GOOD + [("copy.py", "lnk", "train.py")])
    assert archive_kind(archive) == "tar.gz"
    assert unpack(archive, work, CAPS) == 7
    assert (work / "train.py").read_bytes() == b"print('hi')\n"
    assert (work / "link-to-data").read_bytes() == b"1,2\n"
    assert (work / "data" / "up").read_bytes() == b"print('hi')\n"
    assert os.stat(work / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(work / "train.py").st_mode & 0o777 == 0o644
    # a hard link is a copy: no file of the tree has a second name
    assert (work / "copy.py").read_bytes() == b"print('hi')\n"
    assert os.stat(work / "copy.py").st_nlink == 1
    assert everything_below(parent) == ["work"] + [f"work/{p}" for p in everything_below(work)]


def test_a_good_zip_unpacks_whole(tmp_path, place):
    parent, work = place
    archive = a_zip(tmp_path / "archives" / "b", [(n, k, d) for n, k, d in GOOD if k != "dir"])
    assert archive_kind(archive) == "zip"
    unpack(archive, work, CAPS)
    assert (work / "data" / "x.csv").read_bytes() == b"1,2\n"
    assert os.readlink(work / "link-to-data") == "data/x.csv"
    assert everything_below(parent) == ["work"] + [f"work/{p}" for p in everything_below(work)]


def test_setuid_bits_never_survive(tmp_path, place):
    _, work = place
    path = tmp_path / "archives" / "b"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("suid")
        info.mode, info.size = 0o4777, 1
        tar.addfile(info, io.BytesIO(b"x"))
    unpack(path, work, CAPS)
    assert os.stat(work / "suid").st_mode & 0o7777 == 0o755


@pytest.mark.parametrize("fmt", ["tar", "zip"])
@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ([("../x", "file", b"evil")], r"entry '\.\./x' leaves the work dir"),
        ([("a/../../x", "file", b"evil")], "leaves the work dir"),
        ([("/tmp/x-gpuplatform-test", "file", b"evil")], "is an absolute path"),
        ([("out", "sym", "../outside")], r"entry 'out' is a link out of the work dir"),
        ([("out", "sym", "/etc")], "is a link out of the work dir"),
        # a link inside the tree, then an entry written through it: never followed
        ([("d", "sym", "."), ("d/x", "file", b"x")], "passes through a link"),
        ([("fifo", "fifo", b"")], "is a FIFO"),
    ],
)
def test_each_attack_is_refused_and_nothing_lands_outside(tmp_path, place, fmt, entries, match):
    parent, work = place
    make = tar_gz if fmt == "tar" else a_zip
    refused(make(tmp_path / "archives" / "b", entries), work, match)
    assert everything_below(parent) == ["work"] + [f"work/{p}" for p in everything_below(work)]
    assert not (tmp_path / "x").exists() and not (parent / "x").exists()
    assert not os.path.exists("/tmp/x-gpuplatform-test")


def test_a_link_through_a_link_to_dotdot_is_refused(tmp_path, place):
    """Each link points inside on its own (lexically), but `d/up/..` after the link
    `d/up -> ..` is the work dir's parent: the finished tree's links are resolved again."""
    _, work = place
    archive = tar_gz(tmp_path / "archives" / "b",
                     [("d", "dir", b""), ("d/up", "sym", ".."), ("e", "sym", "d/up/../..")])  # fmt: skip
    refused(archive, work, r"entry 'e' is a link out of the work dir")


def test_a_hard_link_out_of_the_tree_is_refused(tmp_path, place):
    parent, work = place
    secret = parent.parent / "secret"
    secret.write_text("do not copy")
    for target in ("../secret", "/etc/passwd", "not-there"):
        refused(tar_gz(tmp_path / "archives" / "b", [("h", "lnk", target)]), work,
                "is a hard link out of the work dir")  # fmt: skip
        assert not (work / "h").exists()


def test_a_device_file_is_refused(tmp_path, place):
    _, work = place
    refused(tar_gz(tmp_path / "archives" / "b", [("null", "chr", b"")]), work,
            r"entry 'null' is a device file")  # fmt: skip


def test_a_size_bomb_stops_at_the_cap(tmp_path, place):
    """64 MiB of zeros in a tiny archive: refused by its header, before a byte is written."""
    _, work = place
    path = tmp_path / "archives" / "b"
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("zeros")
        info.size = 64 << 20
        tar.addfile(info, _Zeros(64 << 20))
    refused(path, work, r"unpacks to more than 1 MiB \(at 'zeros'\)")
    assert not (work / "zeros").exists() or (work / "zeros").stat().st_size == 0


def test_a_zip_bomb_is_refused_before_a_byte_is_written(tmp_path, place):
    """8 MiB of zeros deflate to ~8 KiB; zipfile itself never reads past an entry's stated size
    (a smaller lie fails its CRC), so the stated size is checked first."""
    _, work = place
    path = a_zip(tmp_path / "archives" / "b", [("zeros", "file", b"\0" * (8 << 20))])
    with zipfile.ZipFile(path) as bundle:
        assert bundle.getinfo("zeros").file_size == 8 << 20
    refused(path, work, "unpacks to more than 1 MiB")
    assert path.stat().st_size < 64 << 10
    assert not (work / "zeros").exists()


def test_a_count_bomb_stops_at_the_cap(tmp_path, place):
    _, work = place
    archive = tar_gz(tmp_path / "archives" / "b", [(f"f{i}", "file", b"") for i in range(500)])
    refused(archive, work, r"more than 50 entries \(at 'f50'\)")
    assert len(list(work.iterdir())) == 50  # stopped there, not after unpacking all


def test_not_an_archive_is_refused(tmp_path, place):
    _, work = place
    path = tmp_path / "archives" / "b"
    path.write_bytes(b"#!/bin/sh\necho hi\n")
    refused(path, work, r"not a \.tar\.gz or \.zip")
    path.write_bytes(b"\x1f\x8b garbage")
    refused(path, work, r"not a valid \.tar\.gz")


def test_a_duplicate_entry_is_refused(tmp_path, place):
    _, work = place
    refused(tar_gz(tmp_path / "archives" / "b", [("a", "file", b"1"), ("a", "sym", "b")]), work,
            "appears twice")  # fmt: skip


class _Zeros(io.RawIOBase):
    def __init__(self, size):
        self.left = size

    def readable(self):
        return True

    def readinto(self, buffer):
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def test_a_name_too_long_for_the_file_system_is_refused_as_the_bundles_fault(tmp_path, place):
    _, work = place
    refused(tar_gz(tmp_path / "archives" / "b", [("x" * 300, "file", b"")]), work,
            "cannot be written: File name too long")  # fmt: skip
