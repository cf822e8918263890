"""The pure rule of which names from the master `fab get` may write here (cluster/job/fetch_paths.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from cluster.job import fetch_paths

from cluster.job.fetch_paths import check_subpath, local_mode, local_parts, refused_name, stays_under


@pytest.mark.parametrize("name", ["result.json", "checkpoint-40", ".hidden", "...", "a b", "é😀", "a\\b", "-rf"])
def test_plain_names_are_allowed(name):
    assert refused_name(name) is None


@pytest.mark.parametrize("name, says", [
    ("", "not a file name"), (".", "not a file name"), ("..", "not a file name"),
    ("/home/user/.bashrc", "`/`"), ("../../x", "`/`"), ("a/b", "`/`"),
    ("p\n", "\\n"), ("x\n..\t5", "\\n"), ("tab\there", "\\t"), ("esc\x1b[2J", "\\x1b"),
    ("del\x7f", "\\x7f"), ("c1\x9b", "\\x9b"), ("nul\x00", "\\x00"), ("cr\r", "\\r"),
    # bidirectional formatting: `model\u202eexe.pt` shows as `modeltp.exe`
    ("model\u202eexe.pt", "\\u202e"), ("a\u202db", "\\u202d"), ("a\u2066b\u2069", "\\u2066"),
    ("a\u200fb", "\\u200f"), ("a\u061cb", "\\u061c"), ("a\u202ab", "\\u202a"),
])
def test_names_that_could_leave_the_destination_or_fool_the_terminal_are_refused(name, says):
    reason = refused_name(name)
    assert reason is not None and says in reason, reason


@pytest.mark.parametrize("dest, parts, under", [
    ("/d", ("a", "b"), True), ("/d", (), True), ("runs/j", ("x",), True), ("/", ("etc",), True),
    ("/d", ("..", "x"), False), ("/d", ("/etc", "passwd"), False), ("/d", ("a", "..", ".."), False),
    ("/d", ("..d",), True), ("/d", ("../d2",), False), ("runs/j", ("../../x",), False),
])
def test_stays_under_is_lexical_containment(dest, parts, under):
    assert stays_under(dest, parts) is under


def test_local_parts_names_the_first_refused_name_or_the_escape():
    assert local_parts(("ckpt", "weights.bin"), "/d") == ("ckpt", "weights.bin")
    with pytest.raises(ValueError, match=r"'\.\.'"):
        local_parts(("ok", "..", "x"), "/d")
    with pytest.raises(ValueError, match=r"formatting characters \(\\n\)"):
        local_parts(("a\nb",), "/d")
    with pytest.raises(ValueError):
        local_parts((), "/d")


@pytest.mark.parametrize("path, expected", [("", "."), (".", "."), ("ckpt/", "ckpt"), ("a/./b", "a/b"),
                                            ("result.json", "result.json")])
def test_get_path_normalised(path, expected):
    assert check_subpath(path) == expected


@pytest.mark.parametrize("path, says", [("/etc", "absolute"), ("..", "`..`"), ("a/../../b", "`..`"),
                                        ("a/..", "`..`"), ("a\nb", "control"), ("nul\x00", "control"),
                                        ("ckpt\u202e/x", "bidirectional")])
def test_get_path_refused(path, says):
    with pytest.raises(ValueError, match=says):
        check_subpath(path)


@pytest.mark.parametrize("remote, umask, local", [
    (0o100600, 0o022, 0o600), (0o100644, 0o022, 0o644), (0o100640, 0o027, 0o640), (0o100666, 0o077, 0o600),
    (0o104755, 0o022, 0o755), (0o102750, 0o022, 0o750), (0o101777, 0o022, 0o755), (0o100400, 0o000, 0o400),
    (None, 0o022, 0o600),
])
def test_a_local_copy_keeps_the_masters_permission_bits_less_the_umask_and_never_setuid(remote, umask, local):
    assert local_mode(remote, umask) == local


@pytest.mark.parametrize("nbytes", [None, 0, 1, 4098])
def test_the_digest_command_prints_the_sha256_hashlib_computes(tmp_path, nbytes):
    """The command the master runs, run here by a shell, against hashlib (the reference), on a name a shell
    would split, expand or read as an option."""
    data = os.urandom(10_000)
    path = tmp_path / "-n $(touch pwned) 'q' *.json"
    path.write_bytes(data)
    out = subprocess.run(["sh", "-c", fetch_paths.digest_command(str(path), nbytes)], capture_output=True, text=True,
                         cwd=tmp_path, check=True).stdout
    assert fetch_paths.parse_digest(out) == hashlib.sha256(data if nbytes is None else data[:nbytes]).hexdigest()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("text", ["", "not a digest  -\n", "ab" * 31 + "  -\n", f"{'ab' * 32}  -\n{'cd' * 32}  -\n"])
def test_output_without_one_digest_gives_none(text):
    assert fetch_paths.parse_digest(text) is None


def test_a_byte_count_that_is_not_one_is_refused():
    for bad in (-1, True, 1.5, "4"):
        with pytest.raises(ValueError):
            fetch_paths.digest_command("/x", bad)
