"""A local node's host key verified from its console before the controller trusts it (real sshd, ~20 s).

Each local node writes its host key fingerprints and keys into its console file at start-up, in
cloud-init's shape (node_setup/local/console.py); the controller reads that file for a node it has
never seen (node_setup/ssh/connections.py), as it reads an AWS node's console output. One 2-node
cluster of its own: first both nodes are verified and recorded; then node1's console is made to show
another key than its sshd presents, and node1 is refused with the line; then node1 is taken down and
brought back as a new machine, whose new key is verified from its new console, with no `fab forget`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cluster.node.console import fingerprint, parse_console
from node_setup.local import cluster as lc
from node_setup.local.console import console_path
from node_setup.ssh import keys
from node_setup.ssh.distribute import distribute

pytestmark = pytest.mark.ssh


def recorded(name: str) -> list[str]:
    return keys.known_hosts_path(name).read_text().splitlines()


def test_new_nodes_are_verified_from_their_consoles_and_another_key_is_refused(local_cluster_factory, monkeypatch,
                                                                              tmp_path):
    from tests.ssh.conftest import run_fab

    cluster = local_cluster_factory(2)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cluster.config_home))
    node0, node1 = cluster.state.nodes

    # each node wrote its console at boot: the key its sshd presents, in cloud-init's blocks
    for node in (node0, node1):
        shown = parse_console(console_path(node).read_text())
        assert [f.sha256 for f in shown.fingerprints] == [fingerprint(node.host_key.split()[1])]
        assert shown.keys == (node.host_key,)
        assert "ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----" in console_path(node).read_text()

    assert recorded(cluster.name) == []
    first = distribute(cluster.inventory)
    assert first.ok
    assert sorted(recorded(cluster.name)) == sorted(f"{n.address} {n.host_key} {n.instance_id}" for n in (node0, node1))

    # node1's console shows another key than its sshd presents: refused, nothing recorded
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "root@node1", "-f", str(other)], check=True)
    listed = subprocess.run(["ssh-keygen", "-l", "-f", f"{other}.pub"], check=True, capture_output=True,
                            text=True).stdout.strip()
    console_path(node1).write_text(
        f"ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----\nec2: {listed}\nec2: -----END SSH HOST KEY FINGERPRINTS-----\n"
        f"-----BEGIN SSH HOST KEY KEYS-----\n{Path(f'{other}.pub').read_text().strip()}\n"
        "-----END SSH HOST KEY KEYS-----\n")
    keys.forget_host(cluster.name, node1.address)
    refused = run_fab(cluster, "distribute", timeout=120)
    assert refused.returncode == 3, refused.stdout + refused.stderr
    line = next(line for line in refused.stdout.splitlines() if re.match(r"^node1\s+failed", line))
    assert f"host key of {node1.address} (instance {node1.instance_id}) refused" in line, line
    assert f"presents ssh-ed25519 SHA256:{fingerprint(node1.host_key.split()[1])[7:]}" in line, line
    assert f"console file {console_path(node1)} shows {listed.split()[1]} (ED25519)" in line, line
    assert "do not connect" in line
    assert not any(r.startswith(f"{node1.address} ") for r in recorded(cluster.name))
    assert "the master's files were not written" in refused.stdout

    # node1 goes down and comes back as a new machine (new host key, instance id and console):
    # its old record is dropped and the new key verified from the new console
    lc.reclaim(cluster.paths, "node1", notice_seconds=0)
    state = lc.create(2, cluster.name, paths=cluster.paths)
    new1 = state.nodes[1]
    assert new1.host_key != node1.host_key and new1.instance_id != node1.instance_id
    again = distribute(cluster.inventory)
    assert again.ok, [n.detail for n in again.nodes]
    assert sorted(recorded(cluster.name)) == sorted(f"{n.address} {n.host_key} {n.instance_id}"
                                                    for n in (node0, new1))
