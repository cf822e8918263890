"""`fab distribute` on a local cluster: the master reaches every node by alias with host keys verified.

Uses the session's set-up cluster (`installed_cluster`: `fab distribute` already ran) and, for the
controller's host key policy, a 2-node cluster of its own. ~10 s.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from node_setup.ssh import keys
from node_setup.ssh.distribute import DistributionError, distribute
from tests.ssh.conftest import run_fab

pytestmark = pytest.mark.ssh

STRICT = "-o BatchMode=yes -o StrictHostKeyChecking=yes"


@pytest.fixture(scope="module", autouse=True)
def distributed_to_the_whole_cluster(installed_cluster):
    """The session cluster's distribution as `fab setup` leaves it, over all three nodes: a file that ran
    earlier on this worker may have started a job on fewer nodes, and a job's distribution narrows the
    master's hosts, ssh config and known_hosts to the job's nodes."""
    result = run_fab(installed_cluster, "distribute", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def home(cluster, index: int) -> Path:
    return Path(cluster.state.nodes[index].dir) / "root"


def test_master_reaches_every_node_by_alias_and_address_with_strict_host_keys(installed_cluster, setup_runs):
    cluster = installed_cluster
    assert "hostfile on node0: /root/hosts" in setup_runs["distribute"].stdout
    loop = "; ".join(f"ssh {STRICT} {n.name} hostname; ssh {STRICT} {n.address} hostname" for n in cluster.state.nodes)
    result = cluster.ssh(0, loop, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [n for node in cluster.state.nodes for n in (node.name, node.name)]
    assert "Warning: Permanently added" not in result.stderr  # nothing was taken on trust


def test_master_files_hold_the_controllers_view_and_workers_get_no_private_key(installed_cluster):
    cluster, name = installed_cluster, installed_cluster.name
    master = home(cluster, 0)
    assert (master / "hosts").read_text() == "node0\nnode1\nnode2\n"
    key = master / ".ssh" / f"{name}_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600
    config = (master / ".ssh" / "config").read_text()
    assert "StrictHostKeyChecking yes" in config and "StrictHostKeyChecking no" not in config
    # the master's known_hosts holds exactly the host keys the local cluster generated for its nodes
    known = (master / ".ssh" / f"xeon-cluster-{name}.known_hosts").read_text().splitlines()
    assert known == [f"{n.name},{n.address} {n.host_key}" for n in cluster.state.nodes]
    public = (Path(cluster.config_home) / "xeon-cluster" / "keys" / name / "id_ed25519.pub").read_text().strip()
    assert public.endswith(f"xeon-cluster:{name}")
    # the subnet, where the keeper brings a lost master back at an address of its own, less the host's bridge
    sources = f"!{cluster.state.bridge_address},{cluster.state.subnet}"
    for i in range(3):
        authorized = (home(cluster, i) / ".ssh" / "authorized_keys").read_text().splitlines()
        assert [line for line in authorized if line.endswith(f"xeon-cluster:{name}")] == [
            f'from="{sources}",no-agent-forwarding,no-port-forwarding,no-X11-forwarding {public}']
        if i:
            assert not (home(cluster, i) / ".ssh" / f"{name}_ed25519").exists()


def test_the_cluster_key_is_refused_from_outside_the_cluster(installed_cluster):
    """From this machine (the bridge's address, not a node's) the cluster's own key gets no login."""
    cluster = installed_cluster
    key = Path(cluster.config_home) / "xeon-cluster" / "keys" / cluster.name / "id_ed25519"
    node1 = cluster.state.nodes[1]
    result = subprocess.run(
        ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-i", str(key), f"root@{node1.address}", "true"],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 255 and "Permission denied" in result.stderr, result.stderr
    inside = cluster.ssh(0, f"ssh {STRICT} node1 hostname", timeout=30)  # the master, with the same key
    assert inside.stdout.strip() == "node1", inside.stderr


def test_second_distribution_changes_nothing_and_a_tampered_known_hosts_is_refused_then_repaired(
        installed_cluster, monkeypatch):
    cluster = installed_cluster
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cluster.config_home))
    again = distribute(cluster.inventory)
    assert again.ok and set(again.master_files.values()) == {"unchanged"}
    assert [n.detail.split(";")[0] for n in again.nodes] == ["key unchanged"] * 3

    known = home(cluster, 0) / ".ssh" / f"xeon-cluster-{cluster.name}.known_hosts"
    lines = known.read_text().splitlines()
    lines[1] = lines[1].split()[0] + " " + cluster.state.nodes[2].host_key  # node2's key claimed for node1
    known.write_text("\n".join(lines) + "\n")
    refused = cluster.ssh(0, f"ssh {STRICT} node1 hostname", timeout=30)
    assert refused.returncode == 255 and "node1" not in refused.stdout

    repaired = distribute(cluster.inventory)
    assert list(repaired.master_files.values()).count("written") == 1
    assert cluster.ssh(0, f"ssh {STRICT} node1 hostname", timeout=30).stdout.strip() == "node1"


def test_controller_records_first_seen_host_keys_and_refuses_a_changed_one(local_cluster_factory, tmp_path,
                                                                          monkeypatch):
    """An inventory file (not `local`): nothing pinned in advance, so the controller trusts on
    first use and records; a later different key for that address stops the node with what to do."""
    cluster = local_cluster_factory(2)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    inventory = dataclasses.replace(cluster.inventory, kind="file", name=f"{cluster.name}-file")
    first = distribute(inventory)
    assert first.ok
    recorded = keys.known_hosts_path(inventory.name).read_text().splitlines()
    assert sorted(recorded) == sorted(f"{n.address} {n.host_key}" for n in cluster.state.nodes)

    node0, node1 = cluster.state.nodes  # recorded is in first-connection order, which varies
    forged = [f"{node0.address} {node0.host_key}", f"{node1.address} {node0.host_key}"]  # node0's key for node1
    keys.known_hosts_path(inventory.name).write_text("\n".join(forged) + "\n")
    with pytest.raises(DistributionError) as failure:
        distribute(inventory)
    result = failure.value.result
    assert [n.ok for n in result.nodes] == [True, False]
    assert "host key mismatch" in result.nodes[1].detail and "fab forget --cluster" in result.nodes[1].detail
    assert result.hostfile is None  # the master's files are not written for a partial cluster


def test_unreachable_node_fails_distribution_with_exit_3(local_cluster_factory):
    from tests.ssh.conftest import run_fab

    cluster = local_cluster_factory(2)
    cluster.stop_sshd(1)
    result = run_fab(cluster, "distribute", "--ssh-timeout", "5s", timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr
    assert re.search(r"^node1\s+failed\s+unreachable", result.stdout, re.M), result.stdout
    assert "the master's files were not written" in result.stdout
    assert not (home(cluster, 0) / "hosts").exists()
    assert not (home(cluster, 0) / ".ssh" / "config").exists()


def test_gateway_rule_and_controller_key_files(installed_cluster, monkeypatch):
    """Nodes whose address differs from the gateway go through it (the node sees the gateway as
    its SSH client); the gateway itself is reached directly. The cluster key stays 0600 in 0700."""
    from node_setup.ssh.connections import close_all, connections_for

    cluster = installed_cluster
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cluster.config_home))
    master, worker = cluster.state.nodes[0], cluster.state.nodes[1]
    inventory = dataclasses.replace(cluster.inventory, gateway=master.address)
    conns = connections_for(inventory, load_ssh_configs=False)
    try:
        client_of = {name: conn.run("echo $SSH_CONNECTION", hide=True).stdout.split()[0]
                     for name, conn in conns.items()}
    finally:
        close_all(conns)
    assert client_of[worker.name] == master.address  # tunnelled through node0
    assert client_of[master.name] == cluster.state.bridge_address.split("/")[0]  # straight from the controller
    directory = keys.cluster_dir(cluster.name, create=False)
    assert directory.stat().st_mode & 0o777 == 0o700
    assert (directory / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert "PRIVATE KEY" in (directory / "id_ed25519").read_text()
