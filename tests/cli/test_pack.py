"""Packing a working directory (gpuplatform_client.pack): what goes in, what stays out, and the
same bytes (so the same sha256, so no upload) for an unchanged directory."""

import hashlib
import os
import tarfile

import pytest

from gpuplatform import _client_path  # noqa: F401
from gpuplatform_client import pack


def tree(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def members(bundle) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(bundle.path) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.fixture
def project(tmp_path):
    return tree(tmp_path / "proj", {
        "train.py": "print('hi')\n", "data/x.csv": "1,2\n", "pkg/__init__.py": "",
        ".git/HEAD": "ref\n", ".git/objects/ab/cd": "blob", ".venv/bin/python": "#!",
        "venv/lib/site.py": "", "pkg/__pycache__/m.cpython-311.pyc": "pyc", "old.pyc": "pyc",
        "sub/.git/config": "nested repo",
    })  # fmt: skip


def test_default_excludes_leave_out_vcs_venvs_and_bytecode(project):
    bundle = pack.pack(project)
    try:
        names = set(members(bundle))
        assert names == {"train.py", "data", "data/x.csv", "pkg", "pkg/__init__.py", "sub"}
        assert bundle.files == 3 and bundle.unpacked_size == len("print('hi')\n") + 4
        assert bundle.size == os.path.getsize(bundle.path)
        assert bundle.sha256 == hashlib.sha256(bundle.path.read_bytes()).hexdigest()
    finally:
        bundle.path.unlink()


def test_gpuignore_adds_rules_in_gitignore_syntax_and_can_bring_a_file_back(project):
    tree(project, {
        ".gpuignore": "# big things\ndata/\n*.log\n/top-only.txt\n!keep.pyc\nbuild/**/tmp\n",
        "run.log": "x", "logs/deep/a.log": "x", "top-only.txt": "x", "sub/top-only.txt": "kept",
        "keep.pyc": "kept", "build/a/b/tmp": "x", "build/a/b/keep": "kept",
    })  # fmt: skip
    bundle = pack.pack(project)
    try:
        names = set(members(bundle))
    finally:
        bundle.path.unlink()
    assert "data/x.csv" not in names and "data" not in names
    assert not {"run.log", "logs/deep/a.log", "top-only.txt", "build/a/b/tmp"} & names
    assert {"sub/top-only.txt", "keep.pyc", "build/a/b/keep", ".gpuignore", "logs/deep"} <= names
    assert "old.pyc" not in names  # the default exclude still holds beside the negation


def test_an_unchanged_directory_packs_to_the_same_bytes_whatever_its_mtimes_and_modes(
    project, tmp_path
):
    first = pack.pack(project, tmp_path / "a.tar.gz")
    os.utime(project / "train.py", (1, 1))
    os.chmod(project / "data" / "x.csv", 0o600)
    (project / "pkg" / "__pycache__" / "new.pyc").write_text("changes nothing")
    second = pack.pack(project, tmp_path / "b.tar.gz")
    assert first.sha256 == second.sha256 and first.path.read_bytes() == second.path.read_bytes()
    (project / "train.py").write_text("print('changed')\n")
    assert pack.pack(project, tmp_path / "c.tar.gz").sha256 != first.sha256


def test_entries_are_sorted_and_normalised(project, tmp_path):
    (project / "train.py").chmod(0o750)
    bundle = pack.pack(project, tmp_path / "b.tar.gz")
    infos = members(bundle)
    assert list(infos) == sorted(infos, key=lambda n: n.split("/"))  # siblings sorted, depth first
    assert [n.rstrip("/") for n in bundle.names] == list(infos)
    for info in infos.values():
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname) == (
            pack.FIXED_MTIME,
            0,
            0,
            "",
            "",
        )
    assert infos["train.py"].mode == 0o755 and infos["data/x.csv"].mode == 0o644
    assert infos["data"].isdir() and infos["data"].mode == 0o755
    raw = bundle.path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0"  # gzip header: no date
    assert raw[3] & 0x08 == 0  # and no file name


def test_a_link_inside_the_tree_is_kept_as_a_relative_link(project, tmp_path):
    os.symlink("train.py", project / "main.py")
    os.symlink(project / "data", project / "pkg" / "data")  # absolute, but inside
    bundle = pack.pack(project, tmp_path / "b.tar.gz")
    infos = members(bundle)
    assert infos["main.py"].issym() and infos["main.py"].linkname == "train.py"
    assert infos["pkg/data"].issym() and infos["pkg/data"].linkname == "../data"
    assert "pkg/data/x.csv" not in infos  # never followed


@pytest.mark.parametrize("target", ["../../outside.txt", "/etc/passwd", "loop"])
def test_a_link_out_of_the_tree_is_refused_naming_it(project, tmp_path, target):
    (tmp_path / "outside.txt").write_text("secret")
    if target == "loop":
        os.symlink("loop2", project / "loop")
        os.symlink("loop", project / "loop2")
        name = "loop"
    else:
        os.symlink(target, project / "pkg" / "leak")
        name = "pkg/leak"
    out = tmp_path / "b.tar.gz"
    with pytest.raises(pack.PackError) as refused:
        pack.pack(project, out)
    assert name in str(refused.value) and not out.exists()


def test_a_link_out_that_gpuignore_excludes_is_no_error(project, tmp_path):
    os.symlink("/etc/passwd", project / "leak")
    (project / ".gpuignore").write_text("leak\n")
    bundle = pack.pack(project, tmp_path / "b.tar.gz")
    assert "leak" not in members(bundle)


def test_special_files_are_skipped_and_reported(project, tmp_path):
    os.mkfifo(project / "pipe")
    bundle = pack.pack(project, tmp_path / "b.tar.gz")
    assert bundle.skipped == ("pipe",) and "pipe" not in members(bundle)


def test_not_a_directory_is_an_error(tmp_path):
    with pytest.raises(pack.PackError, match="not a directory"):
        pack.pack(tmp_path / "missing")


def test_sizes_are_counted_for_a_larger_tree(tmp_path):
    root = tree(tmp_path / "big", {f"d{i % 7}/f{i}.bin": "x" * i for i in range(200)})
    bundle = pack.pack(root, tmp_path / "b.tar.gz")
    assert bundle.files == 200 and bundle.unpacked_size == sum(range(200))
    assert pack.human(1536) == "1.5 KiB" and pack.human(10) == "10 B"
    assert pack.human(5 * 1024 * 1024) == "5.0 MiB"


def test_the_example_project_packs_without_its_outputs(tmp_path):
    from tests.e2e.platform import ROOT

    example = ROOT / "examples" / "tiny-train"
    bundle = pack.pack(example, tmp_path / "b.tar.gz")
    names = set(bundle.names)
    assert {"train.py", "data.csv", "requirements.txt", ".gpuignore"} <= names
    assert not any(n.startswith(("output", "checkpoints")) for n in names)
