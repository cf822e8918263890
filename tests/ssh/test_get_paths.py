"""`fab get` writes only under `--to`, whatever the job's output folder on the master holds, each job in its
own folder there, and keeps or resumes a file only when its content is the master's.

A one-node local cluster (real sshd, real SFTP): its master records a job whose output folder holds
names built to escape a copy that parses a text listing (a folder `p\\n` whose inside reads as an
absolute path on its own line, a folder `q\\n..` that reads as `../`), a file name with a newline,
symbolic links pointing outside it, a name with a right-to-left override, and plain files, one of
them 0600 and one setuid. On this side the destination already holds a link pointing outside it.
The job's files are written by the test over SSH, as a job (or whoever controls the master) could
write them; `fab get` reads only the job's record and that folder.

The second test: two jobs' output folders whose files have the same sizes, fetched into one `--to`, then
the second job's copy left as a size-trusting copy used to leave it (another job's same-size file, its
own first bytes, another file's first bytes): each comes back byte for byte its own job's.

Budget: a few seconds each on a 2-core machine (one node; two and five `fab get`).
"""

from __future__ import annotations

import json
import os
import random
import shlex
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from cluster.job.launch import job_dir
from tests.ssh.conftest import run_fab

pytestmark = [pytest.mark.ssh]

JOB = "20250101-000000-0bad"

# Run on the master as `python3 -c MAKE OUT JOB_JSON JOB_RECORD BASHRC`: the hostile output folder.
MAKE = r'''
import json, os, sys
out, record, job_json, bashrc = sys.argv[1:]

def put(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(data)

put(f"{out}/result.json", '{"loss": 0.5}')
put(f"{out}/logs/rank0.txt", "rank 0 done\n")
# `find -printf '%P\t%s\n'` prints "p" then "<bashrc>\t7": a line naming the controller's file, and
# "<out>/<bashrc>" exists on the master, so a copy reading that line writes <bashrc> itself
put(f"{out}/p\n{bashrc}", "pwned!\n")
put(f"{out}{bashrc}", "pwned!\n")
# "q" then "../esc\t8": one level above the destination
put(f"{out}/q\n../esc", "escaped\n")
put(f"{out}/../esc", "escaped\n")
# a file whose name holds a newline ("notes" then "more.txt\t3"), and the file that second line names
put(f"{out}/notes\nmore.txt", "abc")
put(f"{out}/more.txt", "abc")
put(f"{out}/ckpt/weights.bin", "weights")  # the destination's "ckpt" is a link pointing outside it
put(f"{out}/model.safetensors", "private weights")
os.chmod(f"{out}/model.safetensors", 0o600)
put(f"{out}/tool", "#!/bin/sh\n")
os.chmod(f"{out}/tool", 0o4755)
put(f"{out}/model\u202eexe.pt", "shows as modeltp.exe")  # U+202E RIGHT-TO-LEFT OVERRIDE
os.symlink("/etc", f"{out}/etc-link")
os.symlink("/etc/hostname", f"{out}/hostname-link")
put(record, json.dumps(json.loads(job_json), indent=2) + "\n")
'''


def snapshot(top: Path, leave_out: Path) -> dict[str, object]:
    """Every entry under `top` but `leave_out`: a file's bytes, a link's target, a folder as None."""
    seen: dict[str, object] = {}
    for folder, dirs, files in os.walk(top):  # never into linked folders
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d != leave_out]
        for name in dirs + files:
            path = here / name
            rel = str(path.relative_to(top))
            seen[rel] = (os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None)
    return seen


def test_fab_get_writes_only_under_to_refuses_escaping_names_and_follows_no_link(local_cluster_factory, tmp_path):
    cluster = local_cluster_factory(1)
    runs = f"{LOCAL_OUTPUT_ROOT}/{cluster.name}"
    out = f"{runs}/{JOB}"
    bashrc = tmp_path / "home" / ".bashrc"  # stands for the controller's ~/.bashrc (or ~/.aws/config)
    bashrc.parent.mkdir()
    bashrc.write_text("# the user's own\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    to = tmp_path / "runs" / "got"
    (to / JOB).mkdir(parents=True)  # the job's own folder under --to
    (to / JOB / "ckpt").symlink_to(outside)
    record = {"job_id": JOB, "output_dir": out}
    try:
        made = cluster.ssh(0, "python3 -c " + " ".join(shlex.quote(a) for a in (
            MAKE, out, f"{job_dir(JOB)}/job.json", json.dumps(record), str(bashrc))))
        assert made.returncode == 0, made.stderr
        before = snapshot(tmp_path, to)

        got = run_fab(cluster, "get", "--job", JOB, "--to", str(to), timeout=120)

        text = got.stdout + got.stderr
        assert bashrc.read_text() == "# the user's own\n", text
        assert snapshot(tmp_path, to) == before, text  # nothing outside --to was written, made or removed
        assert not any(outside.iterdir()), text  # the destination's link was not written through
        assert got.returncode == 1, text  # refused entries: the copy is not whole
        assert "Traceback" not in text, text
        lines = got.stdout.splitlines()
        controls = "it holds control or bidirectional formatting characters"
        assert f"refused '{out}' entry 'p\\n': {controls} (\\n)" in lines, text
        assert f"refused '{out}' entry 'q\\n..': {controls} (\\n)" in lines, text
        assert f"refused '{out}' entry 'notes\\nmore.txt': {controls} (\\n)" in lines, text
        assert f"refused '{out}' entry 'model\\u202eexe.pt': {controls} (\\u202e)" in lines, text
        assert "\u202e" not in text
        assert f"skipped '{out}/etc-link': a symbolic link (fab get never follows one)" in lines, text
        assert f"skipped '{out}/hostname-link': a symbolic link (fab get never follows one)" in lines, text
        assert any(line.startswith("refused 'ckpt/weights.bin' in ") and "symbolic link" in line
                   for line in lines), text
        # the plain files arrived, at their own names under --to
        assert (to / JOB / "result.json").read_text() == '{"loss": 0.5}'
        assert (to / JOB / "logs" / "rank0.txt").read_text() == "rank 0 done\n"
        assert (to / JOB / "more.txt").read_text() == "abc"
        assert (to / JOB / str(bashrc).lstrip("/")).read_text() == "pwned!\n"  # a plain path under --to: harmless
        # each file keeps its mode on the master (less the umask): a 0600 file stays 0600, no setuid bit
        umask = os.umask(0o022)
        os.umask(umask)
        assert (to / JOB / "model.safetensors").stat().st_mode & 0o7777 == 0o600, text
        assert (to / JOB / "tool").stat().st_mode & 0o7777 == 0o755 & ~umask, text
        assert lines[-1] == (f"done: 6 copied, 5 refused, 2 skipped; 6 verified (sha256 on the master); "
                             f"in {to / JOB}"), text

        # --to itself a link: refused before anything is read or written
        linked = tmp_path / "linked-to"
        linked.symlink_to(outside)
        refused = run_fab(cluster, "get", "--job", JOB, "--to", str(linked), timeout=60)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"error: --to: {str(linked)!r} is a symbolic link; allowed: a real folder "
            "(fab get never writes through a link)"], refused.stderr
        assert not any(outside.iterdir())
    finally:
        cluster.ssh(0, f"rm -rf {shlex.quote(runs)} {shlex.quote(job_dir(JOB))}")
        cluster.destroy()


JOB_A, JOB_B = "20250101-000000-0aaa", "20250101-000001-0bbb"
SIZES = {"summary.json": 4098 + 37, "progress.json": 300, "ckpt/model.safetensors": 3 * 1024 * 1024 + 5}


def tree_of(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_two_jobs_same_size_files_fetched_into_one_to_come_back_each_its_own(local_cluster_factory, tmp_path):
    cluster = local_cluster_factory(1)
    home = Path(cluster.state.nodes[0].dir) / "root"  # the master's /root, seen from here
    made: dict[str, dict[str, bytes]] = {}
    try:
        for seed, job in enumerate((JOB_A, JOB_B)):
            rng = random.Random(seed)
            made[job] = {name: rng.randbytes(size) for name, size in SIZES.items()}
            for name, data in made[job].items():
                (home / "xc-get-digest" / job / name).parent.mkdir(parents=True, exist_ok=True)
                (home / "xc-get-digest" / job / name).write_bytes(data)
            record = home / job_dir(job) / "job.json"
            record.parent.mkdir(parents=True)
            record.write_text(json.dumps({"job_id": job, "output_dir": f"/root/xc-get-digest/{job}"}))
        to = tmp_path / "got"

        def get(job: str, says: str) -> None:
            got = run_fab(cluster, "get", "--job", job, "--to", str(to), timeout=120)
            text = got.stdout + got.stderr
            assert got.returncode == 0, text
            last = got.stdout.splitlines()[-1]
            assert last == f"done: {says}; 3 verified (sha256 on the master); in {to / job}", text
            assert tree_of(to / job) == made[job], text  # byte for byte the job's own files

        get(JOB_A, "3 copied")
        get(JOB_B, "3 copied")
        assert sorted(p.name for p in to.iterdir()) == [JOB_A, JOB_B]
        # B's copy as a size-trusting fetch could have left it: A's same-size summary, B's own first MB of the
        # model (a true prefix), A's progress record cut short (a prefix of another file)
        mine = to / JOB_B
        (mine / "summary.json").write_bytes(made[JOB_A]["summary.json"])
        (mine / "ckpt" / "model.safetensors").write_bytes(made[JOB_B]["ckpt/model.safetensors"][:1024 * 1024])
        (mine / "progress.json").write_bytes(made[JOB_A]["progress.json"][:100])
        get(JOB_B, "2 copied, 1 resumed")
        get(JOB_B, "3 unchanged")
        assert tree_of(to / JOB_A) == made[JOB_A]
    finally:
        cluster.ssh(0, "rm -rf /root/xc-get-digest " + " ".join(shlex.quote(job_dir(j)) for j in (JOB_A, JOB_B)))
        cluster.destroy()
