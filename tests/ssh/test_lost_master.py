"""A lost master on a 2-node local cluster with its group keeper, driven through the `fab` command line only:
a detached `fab train --managed` run of the built-in job (the offline demo) writes checkpoints; the master is
lost without a notice (`fab local-reclaim node0 --silent`); the keeper brings a new master at the master's
name, as `pulumi up` replaces a lost master on AWS (a new machine at a new address, new host keys on its
console); `fab train --managed --resume` verifies its host key from that console, continues the run from the
newest complete checkpoint and the run ends completed, its steps counted from that checkpoint.

Budget: a tiny run (200 examples, 300 steps, a checkpoint every 25 steps) started twice; about two minutes
on 2 shared cores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.node.console import fingerprint, parse_console
from node_setup.local import cluster as local_cluster
from node_setup.local import keeper
from node_setup.local import state as local_state
from node_setup.local.console import console_path
from tests.ssh.jobs_on_nodes import wait_for
from training.checkpoints import newest_local

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 300
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


def test_a_lost_master_is_replaced_by_the_keeper_and_the_run_resumed_from_its_newest_checkpoint(cluster):
    out = f"/var/tmp/xc-lost-master-{cluster.name}"
    lost = master(cluster)
    transcript = []

    def ran(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
        transcript.append(f"$ fab {' '.join(result.args[3:])}\n{result.stdout}{result.stderr}")
        return result

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
