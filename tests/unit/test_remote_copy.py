"""`fab get`'s walk and copy (node_setup/ssh/fetch.py), against a fake SFTP session: a partial local file
continues where it stopped, large files show their progress, the copy is the file; names the master lists
that could leave the destination are refused, remote links skipped, local links never written through."""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
from types import SimpleNamespace

import pytest

from node_setup.ssh.fetch import (CHUNK, PROGRESS_FROM_BYTES, ChangedWhileCopied, LocalTree, UnsafeLocalPath, copy,
                                  first_link, walk)

LINK = object()  # FakeSftp: an entry that is a symbolic link
FIFO = object()  # FakeSftp: an entry that is neither a file nor a folder


class FakeSftp:
    """Test double of paramiko's SFTPClient over an in-memory tree: `open(path, "rb")` on files (recording
    where each read started), `lstat` and `listdir_attr` (entries as the server names them, unchecked,
    the way a compromised master could send them). A dict is a folder, bytes a file (mode 0644 unless
    `modes` gives its name another), LINK a link."""

    def __init__(self, files: dict[str, object], modes: dict[str, int] | None = None):
        self.files, self.modes = files, modes or {}
        self.read_from: list[int] = []
        self.digests: list[tuple[str, int | None]] = []

    def _find(self, path: str):
        if path in self.files:
            return self.files[path]
        head, _, name = path.rpartition("/")
        folder = self._find(head) if head else None
        if not isinstance(folder, dict) or name not in folder:
            raise FileNotFoundError(2, "No such file", path)
        return folder[name]

    def _attr(self, name: str, node) -> SimpleNamespace:
        if isinstance(node, dict):
            return SimpleNamespace(filename=name, st_mode=stat.S_IFDIR | 0o755, st_size=4096)
        if node is LINK:
            return SimpleNamespace(filename=name, st_mode=stat.S_IFLNK | 0o777, st_size=9)
        if node is FIFO:
            return SimpleNamespace(filename=name, st_mode=stat.S_IFIFO | 0o644, st_size=0)
        return SimpleNamespace(filename=name, st_mode=stat.S_IFREG | self.modes.get(name, 0o644), st_size=len(node))

    def lstat(self, path: str):
        return self._attr(path.rsplit("/", 1)[-1], self._find(path))

    def listdir_attr(self, path: str):
        return [self._attr(name, node) for name, node in self._find(path).items()]

    def digest(self, path: str, nbytes: int | None = None) -> str:
        """Test double of fetch.remote_digest (the master's sha256sum): the digest of the in-memory file."""
        self.digests.append((path, nbytes))
        data = self._find(path)
        return hashlib.sha256(data if nbytes is None else data[:nbytes]).hexdigest()

    def open(self, path: str, mode: str = "r"):
        assert mode == "rb", mode
        sftp = self

        class Remote(io.BytesIO):
            def read(self, size=-1):
                sftp.read_from.append(self.tell())
                return super().read(size)

        return Remote(self._find(path))


REMOTE = "/home/ubuntu/xeon-cluster-runs/job/model.safetensors"


def test_a_partial_file_is_resumed_with_progress_and_ends_equal(tmp_path, capsys):
    data = os.urandom(PROGRESS_FROM_BYTES + 3 * CHUNK + 17)  # over the threshold: progress is shown
    have = 2 * CHUNK + 5
    local = tmp_path / "model.safetensors"
    local.write_bytes(data[:have])  # what an interrupted `fab get` left
    sftp = FakeSftp({REMOTE: data})

    with LocalTree(tmp_path) as tree:
        what = copy(sftp, REMOTE, tree, ("model.safetensors",), len(data), digest=sftp.digest)

    assert what.startswith("resumed at 2.0 MB in "), what
    assert sftp.read_from[0] == have  # nothing already here was read again
    assert sftp.digests == [(REMOTE, have), (REMOTE, None)]  # the prefix's digest, then the whole copy's
    assert local.read_bytes() == data
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  model.safetensors: ")]
    assert len(progress) >= 5 and progress[-1].endswith("(100%)"), progress
    percents = [int(re.search(r"\((\d+)%\)$", line).group(1)) for line in progress]
    assert percents == sorted(percents) and percents[0] < 50


def test_a_whole_file_is_left_alone_and_a_longer_one_copied_again(tmp_path, capsys):
    data = b"summary " * 100
    local = tmp_path / "summary.json"
    local.write_bytes(data)
    sftp = FakeSftp({REMOTE: data})
    with LocalTree(tmp_path) as tree:
        assert copy(sftp, REMOTE, tree, ("summary.json",), len(data), digest=sftp.digest) == "unchanged"
        assert sftp.read_from == [] and sftp.digests == [(REMOTE, None)]

        local.write_bytes(data + b"stale tail")
        assert copy(sftp, REMOTE, tree, ("summary.json",), len(data), digest=sftp.digest).startswith("copied in ")
    assert local.read_bytes() == data
    assert capsys.readouterr().out == ""  # under PROGRESS_FROM_BYTES: no progress lines


def test_a_missing_file_is_copied_into_new_folders(tmp_path):
    data = os.urandom(CHUNK + 1)
    with LocalTree(tmp_path / "new") as tree:
        sftp = FakeSftp({REMOTE: data})
        assert copy(sftp, REMOTE, tree, ("deep", "er", "rng_state_1.pth"), len(data),
                    digest=sftp.digest).startswith("copied in ")
    assert (tmp_path / "new" / "deep" / "er" / "rng_state_1.pth").read_bytes() == data


def test_a_same_size_file_of_other_content_is_copied_never_kept(tmp_path):
    """Two jobs' files of one size (another job's summary.json in the same place): never "unchanged"."""
    theirs, ours = b'{"job": "A", "loss": 0.5}', b'{"job": "B", "loss": 0.7}'
    local = tmp_path / "summary.json"
    local.write_bytes(theirs)
    sftp = FakeSftp({REMOTE: ours})
    with LocalTree(tmp_path) as tree:
        assert copy(sftp, REMOTE, tree, ("summary.json",), len(ours), digest=sftp.digest).startswith("copied in ")
    assert local.read_bytes() == ours and sftp.read_from[0] == 0


def test_a_shorter_file_that_is_not_the_masters_prefix_is_copied_from_the_start(tmp_path):
    data = os.urandom(3 * CHUNK)
    local = tmp_path / "model.safetensors"
    local.write_bytes(os.urandom(CHUNK + 7))  # another file's first bytes, shorter than this one
    sftp = FakeSftp({REMOTE: data})
    with LocalTree(tmp_path) as tree:
        what = copy(sftp, REMOTE, tree, ("model.safetensors",), len(data), digest=sftp.digest)
    assert what.startswith("copied in "), what
    assert local.read_bytes() == data and sftp.read_from[0] == 0
    assert sftp.digests == [(REMOTE, CHUNK + 7), (REMOTE, None)]


class Rewriting(FakeSftp):
    """A FakeSftp whose file is rewritten (same size, new bytes) right after each of its first `times` opens:
    what a running job's checkpoint or progress record does while it is copied."""

    def __init__(self, files, times: int):
        super().__init__(files)
        self.times = times

    def open(self, path, mode="r"):
        remote = super().open(path, mode)
        if self.times:
            self.times -= 1
            self.files[path] = os.urandom(len(self.files[path]))
        return remote


def test_a_file_rewritten_while_it_is_copied_is_copied_again(tmp_path):
    sftp = Rewriting({REMOTE: os.urandom(CHUNK + 3)}, times=1)
    with LocalTree(tmp_path) as tree:
        what = copy(sftp, REMOTE, tree, ("progress.json",), CHUNK + 3, digest=sftp.digest)
    assert what.startswith("copied in ") and what.endswith("(copied again: it changed while it was read)"), what
    assert (tmp_path / "progress.json").read_bytes() == sftp.files[REMOTE]


def test_a_file_that_keeps_changing_is_named(tmp_path):
    sftp = Rewriting({REMOTE: os.urandom(100)}, times=2)
    with LocalTree(tmp_path) as tree, pytest.raises(ChangedWhileCopied, match="changed on the master"):
        copy(sftp, REMOTE, tree, ("progress.json",), 100, digest=sftp.digest)


# ------------------------------------------------------------------ the walk: what the master lists

ROOT = "/runs/job"


def test_the_walk_gives_plain_files_and_reports_every_entry_left_out():
    hostile = {  # what a job, or a compromised master, could put in (or claim is in) its output folder
        "result.json": b"{}",
        "ckpt": {"weights.bin": b"w" * 10, "nested": {"opt.pt": b"o"}, "p\n": {"home": {"x": b"bashrc"}}},
        "q\n..": {"esc": b"e"},
        "..": {"x": b"up"}, "../../etc": b"x", "/root/.aws/config": b"creds", "tab\tname": b"t",
        "link": LINK, "ckpt-link": LINK, "fifo": FIFO, "model\u202eexe.pt": b"shows as modeltp.exe",
    }
    said: list[str] = []

    files = list(walk(FakeSftp({ROOT: hostile}), ROOT, said.append))

    assert [(f.remote, f.parts, f.size) for f in files] == [  # a folder's files, then its folders, by name
        (f"{ROOT}/result.json", ("result.json",), 2),
        (f"{ROOT}/ckpt/weights.bin", ("ckpt", "weights.bin"), 10),
        (f"{ROOT}/ckpt/nested/opt.pt", ("ckpt", "nested", "opt.pt"), 1)]
    refused = [line for line in said if line.startswith("refused ")]
    skipped = [line for line in said if line.startswith("skipped ")]
    assert len(refused) == 7 and len(skipped) == 3 and len(said) == 10, said
    assert any("'p\\n'" in line and "formatting characters (\\n)" in line for line in refused), refused
    assert any("'model\\u202eexe.pt'" in line and "(\\u202e)" in line for line in refused), refused
    assert all("\u202e" not in line for line in said)
    assert any("'/root/.aws/config'" in line and "`/`" in line for line in refused), refused
    assert any("'..'" in line and "not a file name" in line for line in refused), refused
    assert sum("a symbolic link (fab get never follows one)" in line for line in skipped) == 2, skipped
    assert all("\n" not in line and "\t" not in line for line in said)  # names shown escaped, one line each


def test_a_single_file_is_named_after_itself_and_a_linked_root_is_skipped():
    sftp = FakeSftp({ROOT: {"summary.json": b"{}", "out": LINK}})
    assert [(f.remote, f.parts) for f in walk(sftp, f"{ROOT}/summary.json")] == [(f"{ROOT}/summary.json",
                                                                                  ("summary.json",))]
    said: list[str] = []
    assert list(walk(sftp, f"{ROOT}/out", said.append)) == []
    assert said == [f"skipped '{ROOT}/out': a symbolic link (fab get never follows one)"]


def test_a_path_through_a_linked_folder_on_the_master_is_found():
    sftp = FakeSftp({ROOT: {"ckpt": {"inner": {"w.bin": b"w"}}, "etc": LINK}})
    assert first_link(sftp, ROOT, "ckpt/inner/w.bin") is None
    assert first_link(sftp, ROOT, "etc/passwd") == f"{ROOT}/etc"
    assert first_link(sftp, ROOT, ".") is None


# ------------------------------------------------------------------ here: never through a link

def test_a_destination_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dest").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeLocalPath, match="symbolic link"):
        LocalTree(tmp_path / "dest")


@pytest.mark.parametrize("parts", [("sub", "file"), ("sub", "deeper", "file"), ("flink",)])
def test_a_link_under_the_destination_is_never_written_through(tmp_path, parts):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_bytes(b"precious")
    (outside / "target").write_bytes(b"precious")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside)  # a folder link
    (dest / "flink").symlink_to(outside / "target")  # a file link
    sftp = FakeSftp({REMOTE: b"attacker"})

    with LocalTree(dest) as tree, pytest.raises(UnsafeLocalPath, match="symbolic link"):
        copy(sftp, REMOTE, tree, parts, len(b"attacker"), digest=sftp.digest)

    assert sorted(p.name for p in outside.iterdir()) == ["file", "target"]
    assert (outside / "file").read_bytes() == (outside / "target").read_bytes() == b"precious"
    assert sftp.read_from == []  # refused before anything was read


@pytest.mark.parametrize("parts", [("..", "x"), ("/abs",), ("a\nb",), ()])
def test_names_that_would_escape_are_refused_here_too(tmp_path, parts):
    with LocalTree(tmp_path / "dest") as tree, pytest.raises(ValueError):
        sftp = FakeSftp({REMOTE: b"x"})
        copy(sftp, REMOTE, tree, parts, 1, digest=sftp.digest)
    assert [p.name for p in tmp_path.iterdir()] == ["dest"] and not any((tmp_path / "dest").iterdir())


# ------------------------------------------------------------------ here: the master's mode, never wider

@pytest.mark.parametrize("remote, local", [(0o600, 0o600), (0o640, 0o640), (0o644, 0o644), (0o4755, 0o755),
                                           (0o2770, 0o750), (0o1777, 0o755), (0o666, 0o644)])
def test_a_copied_file_keeps_the_masters_mode_less_the_umask_never_setuid(tmp_path, remote, local):
    old = os.umask(0o022)
    try:
        sftp = FakeSftp({ROOT: {"model.safetensors": b"weights"}}, modes={"model.safetensors": remote})
        (file,) = walk(sftp, ROOT)
        assert stat.S_IMODE(file.mode) == remote
        with LocalTree(tmp_path / "dest") as tree:
            copy(sftp, file.remote, tree, file.parts, file.size, file.mode, digest=sftp.digest)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "dest" / "model.safetensors").stat().st_mode) == local


def test_a_file_already_here_gets_the_masters_mode_and_is_never_wider_while_written(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    whole, partial = dest / "summary.json", dest / "model.safetensors"
    whole.write_bytes(b"{}")
    partial.write_bytes(b"wei")
    for path in (whole, partial):
        path.chmod(0o644)  # what an earlier `fab get` wrote for the master's 0600 files
    seen: list[int] = []

    class Watching(FakeSftp):
        def open(self, path, mode="r"):
            remote = super().open(path, mode)
            read = remote.read

            def watched(size=-1):
                seen.append(stat.S_IMODE(partial.stat().st_mode))  # the local file's, while it is written
                return read(size)

            remote.read = watched
            return remote

    sftp = Watching({ROOT: {"summary.json": b"{}", "model.safetensors": b"weights"}},
                    modes={"summary.json": 0o600, "model.safetensors": 0o600})
    with LocalTree(dest) as tree:
        results = [copy(sftp, f.remote, tree, f.parts, f.size, f.mode, digest=sftp.digest) for f in walk(sftp, ROOT)]
    assert results[0].startswith("resumed at ") and results[1] == "unchanged", results
    assert seen and set(seen) == {0o600}
    assert stat.S_IMODE(whole.stat().st_mode) == stat.S_IMODE(partial.stat().st_mode) == 0o600
    assert partial.read_bytes() == b"weights"
