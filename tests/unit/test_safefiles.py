"""open_job_file: a job's file is read only if it is a regular, singly linked file of the job's,
reached with no link on the way."""

import os

from workers.safefiles import open_job_file, tree_size


def test_a_plain_file_inside_the_root_opens(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.txt").write_text("mine")
    with open_job_file(tmp_path / "out" / "a.txt", root=tmp_path, owner=os.geteuid()) as handle:
        assert handle.read() == b"mine"


def test_links_fifos_strangers_and_escapes_do_not(tmp_path):
    root = tmp_path / "work"
    (root / "out").mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("s")
    os.symlink(secret, root / "out" / "symlink")
    os.symlink(tmp_path, root / "linked-dir")
    (root / "out" / "one").write_text("x")
    os.link(root / "out" / "one", root / "out" / "two")
    os.mkfifo(root / "out" / "fifo")
    (root / "out" / "dir").mkdir()
    for path in (
        "out/symlink",
        "linked-dir/secret",
        "out/one",
        "out/two",
        "out/fifo",
        "out/dir",
        "../secret",
        "out/nope",
    ):
        assert open_job_file(root / path, root=root) is None, path
    (root / "out" / "mine").write_text("m")
    assert (
        open_job_file(root / "out" / "mine", root=root, owner=os.geteuid() + 1) is None
    )  # not the job's
    assert open_job_file(secret, root=root) is None  # outside the root


def test_a_root_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    os.symlink(tmp_path / "real", tmp_path / "output")
    assert open_job_file(tmp_path / "output" / "f", root=tmp_path / "output") is None


def test_tree_size_counts_links_as_themselves(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    os.symlink("/dev/zero", tmp_path / "zero")
    assert 100 <= tree_size(tmp_path) < 200
