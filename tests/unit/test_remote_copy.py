"""`fab get`'s copy of one file (node_setup/tasks/remote.py _copy), against a fake SFTP session: a partial
local file continues where it stopped, large files show their progress, and the copy is the file."""

from __future__ import annotations

import io
import os
import re

from node_setup.tasks.remote import CHUNK, PROGRESS_FROM_BYTES, _copy


class FakeSftp:
    """Test double of paramiko's SFTPClient: `open(path, "rb")` on files held in memory, recording
    where each read started."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.read_from: list[int] = []

    def open(self, path: str, mode: str = "r"):
        assert mode == "rb", mode
        sftp = self

        class Remote(io.BytesIO):
            def read(self, size=-1):
                sftp.read_from.append(self.tell())
                return super().read(size)

        return Remote(self.files[path])


REMOTE = "/home/ubuntu/xeon-cluster-runs/job/model.safetensors"


def test_a_partial_file_is_resumed_with_progress_and_ends_equal(tmp_path, capsys):
    data = os.urandom(PROGRESS_FROM_BYTES + 3 * CHUNK + 17)  # over the threshold: progress is shown
    have = 2 * CHUNK + 5
    local = tmp_path / "model.safetensors"
    local.write_bytes(data[:have])  # what an interrupted `fab get` left
    sftp = FakeSftp({REMOTE: data})

    what = _copy(sftp, REMOTE, local, len(data))

    assert what.startswith("resumed at 2.0 MB in "), what
    assert sftp.read_from[0] == have  # nothing already here was read again
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
    assert _copy(sftp, REMOTE, local, len(data)) == "unchanged" and sftp.read_from == []

    local.write_bytes(data + b"stale tail")
    assert _copy(sftp, REMOTE, local, len(data)).startswith("copied in ")
    assert local.read_bytes() == data
    assert capsys.readouterr().out == ""  # under PROGRESS_FROM_BYTES: no progress lines


def test_a_missing_file_is_copied_into_new_folders(tmp_path):
    data = os.urandom(CHUNK + 1)
    local = tmp_path / "deep" / "er" / "rng_state_1.pth"
    assert _copy(FakeSftp({REMOTE: data}), REMOTE, local, len(data)).startswith("copied in ")
    assert local.read_bytes() == data
