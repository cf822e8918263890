"""`fab train --managed` on a 3-node local cluster of its own: a spot reclaim mid-run is recovered
(a replacement, or the survivors with the global batch kept), and a reclaimed master is reported.

One cluster for the module (nodes go down and come back, so never the shared `local_cluster`), in
this order: an uninterrupted reference run; node2 reclaimed and replaced; node2 reclaimed with
replacements off (`--wait-for-capacity 0`), finishing on 2 nodes; the master reclaimed.
Nothing here sends to 169.254.169.254 from this machine: notices are read on the nodes.

Budget: five short runs of the synthetic demo (about three minutes on 2 cores).
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node_setup.local import cluster as lc
from tests.ssh.jobs_on_nodes import act_while_training

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STEPS = "100"


def fab(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster(local_cluster_factory):
    made = local_cluster_factory(3)
    setup = fab(made, "setup", "--cluster", f"local:{made.name}", timeout=900)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr
    dirs: list[str] = []
    made.output_dir = lambda: dirs.append(f"/var/tmp/xc-managed-{secrets.token_hex(3)}") or dirs[-1]
    yield made
    made.destroy()  # its nodes and whatever the interrupted jobs left on them go now, not at session end
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def train_args(cluster, output_dir: str, *extra: str) -> list[str]:
    return ["train", "--nodes", "3", "--cluster", f"local:{cluster.name}", "--synthetic-examples", "1500",
            "--max-steps", STEPS, "--output-dir", output_dir, *extra,
            "--extra", "--spot_poll_seconds 1 --logging_steps 10"]


def managed_with_reclaim(cluster, node: str, output_dir: str, *extra: str, notice: str = "5") -> tuple[str, int, str]:
    """`fab train --managed`; once the spot watcher polls, `fab local-reclaim NODE --notice N`.
    (reclaim's output, fab train's exit code, its output)."""
    acted, code, log = act_while_training(cluster, train_args(cluster, output_dir, "--managed", *extra),
                                          ["local-reclaim", node, "--notice", notice], ("spot watcher polling",),
                                          timeout=400)
    return acted.stdout + acted.stderr, code, log


def managed_lines(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if line.startswith("managed:"))


@pytest.fixture(scope="module")
def reference(cluster) -> dict:
    out = cluster.output_dir()
    run = fab(cluster, *train_args(cluster, out))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr
    return json.loads((Path(out) / "summary.json").read_text())


def test_reclaimed_worker_is_replaced_and_the_run_finishes_as_an_uninterrupted_one(cluster, reference):
    out = cluster.output_dir()
    old_key = lc.load_state(cluster.paths).nodes[2].host_key
    acted, code, log = managed_with_reclaim(cluster, "node2", out)
    assert "node2: reclaimed" in acted, acted
    assert code == 0, log[-5000:]
    said = managed_lines(log)
    assert "lost: node2 (spot notice)" in said, said
    assert "node2: new machine, host key pinned: ssh-ed25519 SHA256:" in said, said
    assert "node2: software checked" in said, said
    assert "recovery 1: lost node2 at step" in said and "resuming on 3 node(s) (node0, node1, node2)" in said, said
    assert lc.load_state(cluster.paths).nodes[2].host_key != old_key  # a new machine
    summary = json.loads((Path(out) / "summary.json").read_text())
    [record] = summary["recoveries"]
    assert record["nodes_lost"] == ["node2"] and record["nodes_after"] == ["node0", "node1", "node2"]
    assert record["exit_code"] == 75 and record["cause"] == "spot notice" and record["step"] > 0
    assert record["seconds_lost"] == 0.0 and record["seconds_waiting"] > 0  # the notice's checkpoint: nothing lost
    assert summary["resumed_from"]["step"] == record["step"]
    assert summary["steps"] == reference["steps"] == int(STEPS)
    assert summary["global_batch_size"] == reference["global_batch_size"]
    assert abs(summary["last_logged_loss"] - reference["last_logged_loss"]) < 0.25, (summary, reference)


def test_without_replacements_the_survivors_finish_with_the_global_batch_kept(cluster, reference):
    out = cluster.output_dir()
    acted, code, log = managed_with_reclaim(cluster, "node2", out, "--wait-for-capacity", "0", "--min-nodes", "2")
    try:
        assert code == 0, log[-5000:]
        said = managed_lines(log)
        assert "--wait-for-capacity 0: not asking for replacements" in said, said
        assert "resuming on 2 node(s) (node0, node1)" in said and "survivors: 2 of 3 node(s)" in said, said
        assert "global batch 48 kept: per-rank batch 16 -> 12, gradient accumulation 1 -> 2 on 2 rank(s)" in said
        summary = json.loads((Path(out) / "summary.json").read_text())
        [record] = summary["recoveries"]
        assert record["nodes_after"] == ["node0", "node1"] and record["batch"].startswith("global batch 48 kept")
        assert summary["world_size"] == 2 and summary["gradient_accumulation_steps"] == 2
        assert summary["global_batch_size"] == reference["global_batch_size"]
        assert summary["steps"] == reference["steps"]
    finally:  # node2 back for the next test
        lc.create(3, cluster.name, paths=cluster.paths)


def test_a_reclaimed_master_is_reported_with_what_can_and_cannot_be_done(cluster):
    # a notice long enough for the job to end (75) while the master still answers, even on a busy machine
    acted, code, log = managed_with_reclaim(cluster, "node0", cluster.output_dir(), notice="15")
    assert code == 75, log[-5000:]
    said = managed_lines(log)
    assert "lost: node0 (spot notice)" in said, said
    assert "the master node0 was reclaimed or stopped answering" in said and "cannot move the job" in said, said
    assert "what survives: on this local cluster" in said, said
    assert f"fab local-up --nodes 3 --name {cluster.name}, then `fab train --managed --resume`" in said, said
    assert "recovery 1" not in said
