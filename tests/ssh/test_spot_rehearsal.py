"""The spot rehearsal on the local cluster: each node's own metadata service, `fab local-reclaim`,
and `fab local-up` bringing a reclaimed node back as a new machine.

Nothing here sends to 169.254.169.254 from this machine's own namespace: the service is asked only
from inside a node's namespace (`ip netns exec`), and the host is checked with `ip route get`,
which sends nothing.

Budget: a 1-node cluster (under a second), then a 2-node cluster with two short training runs of
the synthetic demo (under a minute).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from node_setup.local import cluster as lc
from node_setup.local import system as local_system
from tests.ssh.jobs_on_nodes import act_while_training
from training.imds import METADATA_ADDRESS

pytestmark = [pytest.mark.ssh]

ROOT = Path(__file__).resolve().parents[2]

# Runs inside a node's namespace: what a job's client sees (status codes and bodies).
_ASK = """
import json, sys, urllib.request, urllib.error
base = "http://169.254.169.254"
def call(method, path, headers):
    try:
        request = urllib.request.Request(base + path, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=3) as r:
            return [r.status, r.read().decode()]
    except urllib.error.HTTPError as e:
        return [e.code, ""]
out = {"v1": call("GET", "/latest/meta-data/instance-id", {})}
status, token = call("PUT", "/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "60"})
out["token"] = [status, bool(token)]
out["bad_token"] = call("GET", "/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": "forged"})
for name in ("instance-id", "instance-type", "placement/availability-zone", "spot/instance-action",
             "events/recommendations/rebalance"):
    out[name] = call("GET", "/latest/meta-data/" + name, {"X-aws-ec2-metadata-token": token})
from training import imds
out["watch_auto"] = imds.watch_enabled("auto", env={})
print(json.dumps(out))
"""


def ask(node) -> dict:
    result = subprocess.run(["ip", "netns", "exec", node.namespace, sys.executable, "-c", _ASK], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_metadata_service_speaks_imdsv2_and_a_notice_stays_until_the_node_goes(local_cluster_factory):
    cluster = local_cluster_factory(1)
    node = cluster.state.nodes[0]
    before = ask(node)
    assert before["v1"][0] == 401 and before["bad_token"][0] == 401  # IMDSv1 and forged tokens refused
    assert before["token"] == [200, True]
    assert before["instance-id"] == [200, node.instance_id] and node.instance_id.startswith("i-")
    assert before["instance-type"][0] == 200 and before["placement/availability-zone"][0] == 200
    assert before["spot/instance-action"][0] == 404 and before["events/recommendations/rebalance"][0] == 404
    assert before["watch_auto"] is True  # the job's `--spot_watch auto` watches here, with no endpoint set

    lc.reclaim(cluster.paths, "node0", rebalance=True)
    assert json.loads(ask(node)["events/recommendations/rebalance"][1])["noticeTime"].endswith("Z")

    seen = []
    lc.reclaim(cluster.paths, "node0", notice_seconds=30, sleep=lambda s: seen.extend([ask(node), ask(node)]))
    notices = [json.loads(s["spot/instance-action"][1]) for s in seen]
    assert notices[0] == notices[1] and notices[0]["action"] == "terminate"  # it appears, and stays
    assert notices[0]["time"].endswith("Z")
    assert local_system.namespace_pids(node.namespace) == []  # every process of the node is gone
    assert not local_system.port_open(node.address)


def test_metadata_address_exists_only_inside_the_nodes(local_cluster):
    route = json.loads(subprocess.run(["ip", "-j", "route", "get", METADATA_ADDRESS], capture_output=True,
                                      text=True).stdout or "[{}]")[0]  # a lookup: sends nothing
    assert route.get("dev") != local_cluster.state.bridge
    host_addresses = {a["local"] for link in local_system.ip_json("-4", "addr", "show") for a in link["addr_info"]}
    assert METADATA_ADDRESS not in host_addresses
    for node in local_cluster.state.nodes:
        on_lo = {a["local"] for link in local_system.ip_json("-n", node.namespace, "-4", "addr", "show", "dev", "lo")
                 for a in link["addr_info"]}
        assert METADATA_ADDRESS in on_lo


# ---------------------------------------------------------------- reclaim during a job

def fab(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=ROOT, env=cluster.env(),
                          capture_output=True, text=True, timeout=timeout)


def train_with(cluster, action: list[str], output_dir: str,
               *length: str) -> tuple[subprocess.CompletedProcess, int, str]:
    """`fab train` on 2 nodes for `length` (its --max-steps or --epochs); once the spot watcher polls,
    `fab <action>` runs. (action run, train rc, log)."""
    argv = ["train", "--nodes", "2", "--cluster", f"local:{cluster.name}", "--synthetic-examples", "1500", *length,
            "--output-dir", output_dir, "--extra", "--spot_poll_seconds 1"]
    return act_while_training(cluster, argv, action, ("spot watcher polling", "'loss'"))


@pytest.mark.mpi
@pytest.mark.slow
def test_reclaim_during_a_job_checkpoints_exits_75_and_local_up_brings_a_new_machine(installed_cluster,
                                                                                      local_cluster_factory):
    cluster = local_cluster_factory(2)
    setup = fab(cluster, "setup", "--cluster", f"local:{cluster.name}", timeout=900)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr

    # a run that goes on well past the recommendation (the watcher polls every second) and then ends by itself
    acted, code, log = train_with(cluster, ["local-reclaim", "node1", "--rebalance"], "xc-rebalance",
                                  "--max-steps", "200")
    assert acted.returncode == 0, acted.stderr
    assert code == 0, log[-4000:]
    assert "recommends rebalancing" in log, log[:6000]

    home = Path(cluster.state.nodes[1].dir) / "root"
    (home / "left-behind").write_text("from the old machine\n")
    old_key = cluster.state.nodes[1].host_key
    acted, code, log = train_with(cluster, ["local-reclaim", "node1", "--notice", "5s"], "xc-reclaim",
                                  "--epochs", "15")  # far longer than the notice: the reclaim ends it
    assert acted.returncode == 0, acted.stdout + acted.stderr
    assert "node1: reclaimed" in acted.stdout
    assert code == 75, log[-4000:]
    assert re.search(r"^job \S+ interrupted: exit code 75 \(a spot notice\)$", log, re.M), log[-4000:]
    assert "announces spot interruption" in log, log[-4000:]
    node1 = cluster.state.nodes[1]
    assert local_system.namespace_pids(node1.namespace) == [] and not local_system.port_open(node1.address)

    again = fab(cluster, "local-up", "--nodes", "2", "--name", cluster.name, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "node1: was down; bringing it back as a new machine" in again.stdout
    state = lc.load_state(cluster.paths)
    assert state.nodes[1].host_key != old_key and state.nodes[0].host_key == cluster.state.nodes[0].host_key
    assert not (Path(state.nodes[1].dir) / "root" / "left-behind").exists()  # an empty home
    cluster.state = state
    cluster.write_known_hosts(cluster.known_hosts)
    assert cluster.ssh(1, "hostname").stdout.strip() == "node1"
