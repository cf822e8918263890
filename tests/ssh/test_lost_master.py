"""A lost master on a 2-node local cluster with its group keeper, driven through the `fab` command line only:
a detached `fab train --managed` run of the built-in job (the offline demo) writes checkpoints; the master is
lost without a notice (`fab local-reclaim node0 --silent`); the keeper brings a new master at the master's
name, as the master's group of one replaces a lost master on AWS (a new machine at a new address, new host keys
on its console), and runs the master's boot script there. No fab command runs after the loss but `fab status`,
polled: the new master finds the run in the run store's double, verifies its spec with the controller's public
key, verifies the worker's host key from its console and continues the run from the newest checkpoint; `fab
status` says when the master was replaced and from which checkpoint the run went on, and the controller verifies
the new master's host key from its console. Against an undisturbed run of the same settings (the independent
reference), every loss the continued job logged equals the undisturbed run's at the same step.

The same for a run of your own program (`--script`): a tiny program that checkpoints; its workdir, which the lost
master took along, is taken back from the worker and checked against the digest the signed spec records (the
program changed on this controller after the launch is not what runs), and the program is restarted with the
newest checkpoint (XEON_CLUSTER_RESUME_FROM and --resume-arg's words).

With the master's spot notice (`fab local-reclaim node0 --notice 15s`) its supervisor leaves the run
master-leaving, not final, and the new master continues it from the checkpoint the job saved at the notice.

Budget: a tiny run (200 examples, 150 steps, a checkpoint every 25 steps) continued once, and its undisturbed
twin; the same with 400 steps and the master's notice; your program's run (150 steps of 0.1 s, a checkpoint
every 10) continued once; about 150 s for the three on 2 shared cores, and the cluster's setup.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from cluster.job.launch import JOBS_DIR
from cluster.node.console import fingerprint, parse_console
from cluster.run import supervision as sv
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
# a loss logged every checkpoint interval: the resumed job's first logged window starts at the checkpoint, as the
# undisturbed run's does, so each of its losses has an undisturbed counterpart to equal
NOTICE_STEPS = 400  # the job checkpoints at the master's notice and ends 75 well before its last step
NOTICE_S = 15  # the notice's lead: the job (its watcher polls every 5 s) and the supervisor (every 5 s) both see it
TRAIN_EXTRA = f"--save_strategy steps --save_steps {SAVE_STEPS} --logging_steps {SAVE_STEPS}"
KEEPER_DELAY_S = 3
STATUS_POLL_S = 5  # each poll a fab process and its SSH (about 0.7 CPU-s): as often as a person would look


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


def status_until_ended(cluster, ran, timeout_s: float) -> dict:
    """`fab status --json` polled (the only fab command after the loss) until the supervised run is final: its
    last `supervised` object. Each poll goes to whichever master the inventory names now."""
    deadline, last = time.time() + timeout_s, None
    while time.time() < deadline:
        polled = fab(cluster, "status", "--json", timeout=120)
        if polled.returncode == 0:
            last = json.loads(polled.stdout).get("supervised") or last
            if last and last.get("status") in sv.FINAL:
                ran(polled)
                return last
        time.sleep(STATUS_POLL_S)
    raise AssertionError(f"the run did not end in {timeout_s:g} s; its last state: {last}")


def lost_master(cluster, out: Path, ran, first_checkpoint, how=("--silent",)
                ) -> tuple[local_state.NodeState, local_state.NodeState, int]:
    """The master lost (`how`: without a notice) once `first_checkpoint()` is there: (the lost master, the keeper's
    new one, the newest checkpoint's step when it was lost, which nothing writes to until a new job runs)."""
    lost = master(cluster)
    wait_for(first_checkpoint, 300, "the run's first checkpoint")
    reclaimed = ran(fab(cluster, "local-reclaim", "node0", *how))
    assert reclaimed.returncode == 0, reclaimed.stdout + reclaimed.stderr
    step = first_checkpoint()
    new = wait_for(lambda: (m := master(cluster)).instance_id != lost.instance_id and local_cluster.node_up(m)
                   and m, 120, "the keeper's new master")
    return lost, new, step


def start_detached(cluster, ran, out: Path, steps: int) -> subprocess.CompletedProcess:
    """A detached managed run of the built-in job's demo, `steps` steps into `out`, started."""
    started = ran(fab(cluster, "train", "--managed", "--detach", "--synthetic-examples", "200", "--max-steps",
                      str(steps), "--output-dir", str(out), "--extra", TRAIN_EXTRA))
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    return started

def test_a_lost_masters_run_is_continued_by_the_new_master_from_its_newest_checkpoint_with_no_fab_command(cluster):
    out = Path(f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/lost-master")
    shutil.rmtree(out, ignore_errors=True)
    transcript: list[str] = []
    ran = recorded(transcript)

    try:
        started = start_detached(cluster, ran, out, STEPS)
        assert "a new master continues the run by itself" in started.stdout
        lost, new, resume_from = lost_master(cluster, out, ran,
                                             lambda: (c := newest_local(str(out))) and c.step)
        assert not (out / "summary.json").exists()  # the master went mid-run, not after it
        supervised = status_until_ended(cluster, ran, 600)
        shown = ran(fab(cluster, "status"))  # what happened while no one watched
        logs = ran(fab(cluster, "logs"))  # the whole run's log, read from the new master
    finally:
        print("\n".join(transcript))
    assert supervised["status"] == sv.COMPLETED and supervised["recoveries"] == 1
    (replaced,) = supervised["replaced"]
    assert replaced["address"] == new.address and replaced["step"] == resume_from
    assert shown.returncode == 0 and (f"master replaced at {time.strftime('%H:%M:%S', time.gmtime(replaced['at']))} "
                                      f"(new address {new.address}); run continued from checkpoint-{resume_from} as "
                                      f"job {replaced['job']}") in shown.stdout, shown.stdout[-2000:]
    assert logs.returncode == 0 and logs.stdout.splitlines()[-1].endswith(": completed"), logs.stdout[-2000:]
    assert f"a new master node0 ({new.instance_id}, {new.address}) takes the run over" in logs.stdout
    summary = json.loads((out / "summary.json").read_text())
    # the resumed job's first step is the checkpoint's + 1: it started at that checkpoint and ran the rest
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["resumed_from"]["step"] == summary["start_step"] == resume_from
    assert summary["steps_this_run"] == STEPS - resume_from
    (record,) = summary["recoveries"]
    assert record["cause"] == sv.MASTER_REPLACED and record["step"] == resume_from
    assert record["nodes_lost"] == ["node0"] and set(record["host_keys"]) == {"node1"}
    # A new machine at the master's name, at an address of its own, with new host keys; the controller
    # recorded its key from its console (a console-verified record carries the instance id).
    assert new.name == lost.name and new.address != lost.address and new.host_key != lost.host_key
    assert fingerprint(new.host_key.split()[1]) in {f.sha256 for f in
                                                    parse_console(console_path(new).read_text()).fingerprints}
    known_hosts = cluster.config_home / "xeon-cluster" / "keys" / cluster.name / "known_hosts"
    assert f"{new.address} {new.host_key} {new.instance_id}" in known_hosts.read_text().splitlines()
    # against the independent reference, an undisturbed run of the same settings on the same nodes: every loss
    # the resumed job logged equals the undisturbed run's at the same step (the continued job is the same job)
    baseline_out = Path(f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/lost-master-baseline")
    shutil.rmtree(baseline_out, ignore_errors=True)
    baseline = fab(cluster, "train", "--synthetic-examples", "200", "--max-steps", str(STEPS), "--output-dir",
                   str(baseline_out), "--extra", TRAIN_EXTRA)
    assert baseline.returncode == 0, baseline.stdout[-3000:] + baseline.stderr
    resumed, undisturbed = logged_losses(logs.stdout), logged_losses(baseline.stdout)
    assert resumed and set(resumed) < set(undisturbed), (resumed, undisturbed)
    assert {epoch: undisturbed[epoch] for epoch in resumed} == resumed
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(baseline_out, ignore_errors=True)


def test_a_masters_spot_notice_leaves_the_run_to_the_new_master_which_continues_from_the_notices_checkpoint(
        cluster):
    """The master's own notice: its supervisor records the run as master-leaving (not final) and ends, the job
    checkpoints at the notice; the new master continues from that checkpoint."""
    out = Path(f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/noticed-master")
    shutil.rmtree(out, ignore_errors=True)
    transcript: list[str] = []
    ran = recorded(transcript)

    try:
        start_detached(cluster, ran, out, NOTICE_STEPS)
        _, new, resume_from = lost_master(cluster, out, ran, lambda: (c := newest_local(str(out))) and c.step,
                                          how=("--notice", f"{NOTICE_S}s"))
        supervised = status_until_ended(cluster, ran, 600)
        logs = ran(fab(cluster, "logs"))
    finally:
        print("\n".join(transcript))
    assert supervised["status"] == sv.COMPLETED and supervised["replaced"][0]["step"] == resume_from
    assert f"from its lost master (last state {sv.MASTER_LEAVING}, " in logs.stdout, logs.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == NOTICE_STEPS
    assert summary["resumed_from"]["step"] == summary["start_step"] == resume_from
    assert resume_from > SAVE_STEPS  # the checkpoint the job saved at the notice, after its first
    shutil.rmtree(out, ignore_errors=True)


def logged_losses(log: str) -> dict[str, str]:
    """Rank 0's logged training losses in a job's log, by the epoch the trainer logged them at."""
    found = {}
    for line in log.splitlines():
        entry = line.partition("] ")[2]
        if entry.startswith("{'loss': "):
            values = ast.literal_eval(entry)
            found[values["epoch"]] = values["loss"]
    return found


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


def test_a_lost_masters_run_of_your_own_program_is_continued_by_the_new_master_with_its_workdir_taken_back(
        cluster, tmp_path):
    out = Path(f"{LOCAL_OUTPUT_ROOT}/{cluster.name}/lost-own")
    shutil.rmtree(out, ignore_errors=True)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(PROGRAM)
    transcript: list[str] = []
    ran = recorded(transcript)

    try:
        started = ran(fab(cluster, "train", "--managed", "--detach", "--script", str(proj / "train.py"),
                          "--output-dir", str(out), "--resume-arg", "--from {checkpoint}"))
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        (proj / "train.py").write_text(PROGRAM + "\nraise SystemExit('changed here after the launch')\n")
        _, new, resume_from = lost_master(cluster, out, ran, lambda: newest_checkpoint(out))
        assert not (out / "result.json").exists()  # the master went mid-run
        supervised = status_until_ended(cluster, ran, 600)
        logs = ran(fab(cluster, "logs"))
    finally:
        print("\n".join(transcript))
    assert supervised["status"] == sv.COMPLETED and supervised["recoveries"] == 1, supervised
    assert supervised["replaced"][0]["step"] == resume_from
    assert logs.returncode == 0 and logs.stdout.splitlines()[-1].endswith(": completed"), logs.stdout[-2000:]
    # the program as the run recorded it (taken back from the worker, its digest checked), not as it is here
    # now, restarted with the newest checkpoint: its first step is that checkpoint's + 1
    result = json.loads((out / "result.json").read_text())
    checkpoint = str(out / f"checkpoint-{resume_from}")
    assert result == {"start_step": resume_from, "steps_this_run": OWN_STEPS - resume_from,
                      "resumed_from": checkpoint, "args": ["--from", checkpoint]}
    assert (home_of(new) / JOBS_DIR / supervised["run"] / "workdir" / "train.py").read_text() == PROGRAM
    shutil.rmtree(out, ignore_errors=True)
