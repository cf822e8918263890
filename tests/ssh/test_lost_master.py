"""A lost master on a 2-node local cluster with its group keeper, driven through the `fab` command line only:
a detached `fab train --managed` run of the built-in job (the offline demo) writes checkpoints; the master is
lost without a notice (`fab local-reclaim node0 --silent`); the keeper brings a new master at the master's
name, as `pulumi up` replaces a lost master on AWS (a new machine at a new address, new host keys on its
console); `fab train --managed --resume` verifies its host key from that console, continues the run from the
newest complete checkpoint and the run ends completed, its steps counted from that checkpoint.

The same for a run of your own program (`--script`): a tiny program that checkpoints; after the master is
lost, a resume with its workdir changed here is refused (exit 2, nothing started), and with the workdir as
the run recorded it the workdir is copied again from this controller and the program restarted with the
newest checkpoint (XEON_CLUSTER_RESUME_FROM and --resume-arg's words).

Budget: a tiny run (200 examples, 150 steps, a checkpoint every 25 steps) started twice; your program's run
(150 steps of 0.1 s, a checkpoint every 10) started twice; about a minute on 2 idle cores, two under load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cluster.job.launch import JOBS_DIR
from cluster.node.console import fingerprint, parse_console
from cluster.run.supervision import RUN_ROOT
from node_setup.local import cluster as local_cluster
from node_setup.local import keeper
from node_setup.local import state as local_state
from node_setup.local.console import console_path
from tests.ssh.jobs_on_nodes import wait_for
from training.checkpoints import newest_local

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 150  # the master is lost a second or two after its first checkpoint (step 25): well before the end
SAVE_STEPS = 25
KEEPER_DELAY_S = 3


def fab(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", *args, "--cluster", f"local:{cluster.name}"], cwd=ROOT,
                          env=cluster.env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(local_cluster_factory):
    made = local_cluster_factory(2)
    setup = fab(made, "setup", timeout=900)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr
    keeper.start(made.paths, KEEPER_DELAY_S, env=made.env())
    yield made
    made.destroy()  # ends the keeper too (its recorded pid)


def master(cluster) -> local_state.NodeState:
    return local_state.load_state(cluster.paths).nodes[0]


def group_members(cluster) -> set[str]:
    """The instance ids the keeper's group record lists (it writes the record once a new machine is ready)."""
    try:
        record = json.loads((cluster.paths.data_dir / local_state.GROUP_FILE).read_text())
    except (OSError, ValueError):
        return set()
    return {m.get("instance_id") for m in record.get("members", [])}


def recorded(transcript: list[str]):
    """A function that appends a finished fab's command and output to `transcript` and returns it."""
    def ran(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
        transcript.append(f"$ fab {' '.join(result.args[3:])}\n{result.stdout}{result.stderr}")
        return result
    return ran


def test_a_lost_master_is_replaced_by_the_keeper_and_the_run_resumed_from_its_newest_checkpoint(cluster):
    out = f"/var/tmp/xc-lost-master-{cluster.name}"
    lost = master(cluster)
    transcript: list[str] = []
    ran = recorded(transcript)

    try:
        started = ran(fab(cluster, "train", "--managed", "--detach", "--synthetic-examples", "200", "--max-steps",
                          str(STEPS), "--output-dir", out, "--extra",
                          f"--save_strategy steps --save_steps {SAVE_STEPS}"))
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        wait_for(lambda: newest_local(out), 300, "the run's first complete checkpoint")
        reclaimed = ran(fab(cluster, "local-reclaim", "node0", "--silent"))
        assert reclaimed.returncode == 0, reclaimed.stdout + reclaimed.stderr
        assert not (Path(out) / "summary.json").exists()  # the master went mid-run, not after it
        new = wait_for(lambda: (m := master(cluster)).instance_id != lost.instance_id and local_cluster.node_up(m)
                       and m, 120, "the keeper's new master")
        wait_for(lambda: new.instance_id in group_members(cluster), 30, "the keeper's record of the new master")
        # As a new master from `pulumi up`: no workers' first-boot script ran there (no cluster key yet)
        cluster_key = (cluster.config_home / "xeon-cluster" / "keys" / cluster.name / "id_ed25519.pub").read_text()
        assert cluster_key.split()[1] not in (Path(new.dir) / "root" / ".ssh" / "authorized_keys").read_text()
        resume_from = newest_local(out)  # what the resumed job must continue: nothing writes there now
        resumed = ran(fab(cluster, "train", "--managed", "--resume", "--detach", "--output-dir", out))
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
        followed = ran(fab(cluster, "logs", "--follow", timeout=600))  # the whole resumed run, to its end
    finally:
        print("\n".join(transcript))
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    assert followed.stdout.splitlines()[-1].endswith(": completed")
    summary = json.loads((Path(out) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["resumed_from"]["step"] == summary["start_step"] == resume_from.step
    assert summary["steps_this_run"] == STEPS - resume_from.step
    # A new machine at the master's name, at an address of its own, with new host keys; the controller
    # recorded its key from its console (a console-verified record carries the instance id).
    assert new.name == lost.name and new.address != lost.address and new.host_key != lost.host_key
    assert fingerprint(new.host_key.split()[1]) in {f.sha256 for f in
                                                    parse_console(console_path(new).read_text()).fingerprints}
    known_hosts = cluster.config_home / "xeon-cluster" / "keys" / cluster.name / "known_hosts"
    assert f"{new.address} {new.host_key} {new.instance_id}" in known_hosts.read_text().splitlines()
    shutil.rmtree(out, ignore_errors=True)


OWN_STEPS, OWN_EVERY = 150, 10
# Your own program: every rank counts the steps, rank 0 saves a checkpoint folder every OWN_EVERY steps
# (written whole, then renamed), and a restarted one continues from XEON_CLUSTER_RESUME_FROM.
PROGRAM = textwrap.dedent(f'''
    import json, os, sys, time
    out, rank = os.environ["XEON_CLUSTER_OUTPUT_DIR"], int(os.environ["RANK"])
    resume = os.environ.get("XEON_CLUSTER_RESUME_FROM")
    start = json.load(open(os.path.join(resume, "state.json")))["step"] if resume else 0
    for step in range(start + 1, {OWN_STEPS} + 1):
        time.sleep(0.1)
        if rank == 0 and step % {OWN_EVERY} == 0:
            part = os.path.join(out, f".part-{{step}}")
            os.makedirs(part, exist_ok=True)
            with open(os.path.join(part, "state.json"), "w") as f:
                json.dump({{"step": step}}, f)
            os.rename(part, os.path.join(out, f"checkpoint-{{step}}"))
    if rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({{"start_step": start, "steps_this_run": {OWN_STEPS} - start, "resumed_from": resume,
                       "args": sys.argv[1:]}}, f)
''')


def newest_checkpoint(out: Path) -> int:
    return max((int(p.name.split("-")[1]) for p in out.glob("checkpoint-*")), default=0)


def home_of(node: local_state.NodeState) -> Path:
    return Path(node.dir) / "root"


def test_a_lost_masters_run_of_your_own_program_is_continued_with_its_workdir_copied_again(cluster, tmp_path):
    out = Path(f"/var/tmp/xc-lost-own-{cluster.name}")
    shutil.rmtree(out, ignore_errors=True)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(PROGRAM)
    lost = master(cluster)
    transcript: list[str] = []
    ran = recorded(transcript)

    try:
        started = ran(fab(cluster, "train", "--managed", "--detach", "--script", str(proj / "train.py"),
                          "--output-dir", str(out), "--resume-arg", "--from {checkpoint}"))
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        wait_for(lambda: newest_checkpoint(out), 120, "the program's first checkpoint")
        reclaimed = ran(fab(cluster, "local-reclaim", "node0", "--silent"))
        assert reclaimed.returncode == 0, reclaimed.stdout + reclaimed.stderr
        assert not (out / "result.json").exists()  # the master went mid-run
        new = wait_for(lambda: (m := master(cluster)).instance_id != lost.instance_id and local_cluster.node_up(m)
                       and m, 120, "the keeper's new master")
        wait_for(lambda: new.instance_id in group_members(cluster), 30, "the keeper's record of the new master")
        resume_from = newest_checkpoint(out)
        worker_jobs = sorted(p.name for p in (home_of(local_state.load_state(cluster.paths).nodes[1]) / JOBS_DIR)
                             .iterdir())

        (proj / "notes.txt").write_text("changed after the launch\n")
        refused = ran(fab(cluster, "train", "--managed", "--resume", "--detach", "--output-dir", str(out)))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        error = refused.stderr.strip().splitlines()
        assert len(error) == 1 and error[0].startswith(f"error: --resume: the workdir {proj.resolve()} is not as run ")
        assert "(added: notes.txt)" in error[0] and "--workdir-changed-ok" in error[0]
        # nothing started: no job or supervisor on the new master, no new job on the worker, nothing written
        assert not (home_of(new) / JOBS_DIR).exists() and not (home_of(new) / RUN_ROOT).exists()
        worker = local_state.load_state(cluster.paths).nodes[1]
        assert sorted(p.name for p in (home_of(worker) / JOBS_DIR).iterdir()) == worker_jobs
        assert newest_checkpoint(out) == resume_from and not (out / "result.json").exists()

        (proj / "notes.txt").unlink()  # the workdir as the run recorded it
        resumed = ran(fab(cluster, "train", "--managed", "--resume", "--detach", "--output-dir", str(out)))
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
        assert "copied again (1 file(s), as the run recorded them)" in resumed.stdout
        followed = ran(fab(cluster, "logs", "--follow", timeout=300))
    finally:
        print("\n".join(transcript))
    assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr
    assert followed.stdout.splitlines()[-1].endswith(": completed")
    result = json.loads((out / "result.json").read_text())
    checkpoint = str(out / f"checkpoint-{resume_from}")
    assert result == {"start_step": resume_from, "steps_this_run": OWN_STEPS - resume_from,
                      "resumed_from": checkpoint, "args": ["--from", checkpoint]}
    shutil.rmtree(out, ignore_errors=True)
