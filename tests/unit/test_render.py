"""cluster/node/render.py: the hostfile, ssh config block and known_hosts text, master first."""

import random

import pytest

from cluster.inventory import InventoryError, Node
from cluster.node.render import (MasterPaths, RenderError, authorized_key_line, hostfile_text, known_hosts_text,
                            replace_managed_block, ssh_config_block, table)
from cluster.stack.tags import ROLE_MASTER

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0ZXN0a2V5Zm9ycmVuZGVyaW5ndGVzdHMxMjM0NTY3"


def nodes(count=4):
    return [Node(name=f"node{i}", address=f"192.0.2.{10 + i}", private_address=f"10.0.0.{10 + i}", rank=i,
                 role=ROLE_MASTER if i == 0 else "worker") for i in range(count)]


def test_hostfile_is_master_first_whatever_the_input_order():
    shuffled = nodes(5)
    random.Random(3).shuffle(shuffled)
    assert hostfile_text(shuffled) == "node0\nnode1\nnode2\nnode3\nnode4\n"
    assert hostfile_text(nodes(2), slots=2) == "node0:2\nnode1:2\n"


def test_hostfile_refuses_repeated_ranks_and_bad_slots():
    dup = nodes(2) + [Node(name="node9", address="x", private_address="x", rank=1)]
    with pytest.raises(RenderError, match="ranks repeat"):
        hostfile_text(dup)
    with pytest.raises(RenderError, match="slots"):
        hostfile_text(nodes(2), slots=0)
    with pytest.raises(RenderError, match="none given"):
        hostfile_text([])


def test_ssh_config_names_every_node_by_alias_and_private_address_with_strict_checking():
    text = ssh_config_block("demo", nodes(3), "ubuntu")
    assert text.startswith("# BEGIN xeon-cluster demo")
    assert text.rstrip().endswith("# END xeon-cluster demo")
    stanzas = text.split("Host ")[1:]
    assert [s.splitlines()[0] for s in stanzas] == ["node0 10.0.0.10", "node1 10.0.0.11", "node2 10.0.0.12"]
    for i, stanza in enumerate(stanzas):
        assert f"HostName 10.0.0.{10 + i}" in stanza  # the private address, not the controller's
        assert f"HostKeyAlias node{i}" in stanza
        assert "User ubuntu" in stanza
        assert "IdentityFile ~/.ssh/demo_ed25519" in stanza
        assert "UserKnownHostsFile ~/.ssh/xeon-cluster-demo.known_hosts" in stanza
        assert "StrictHostKeyChecking yes" in stanza
    assert "StrictHostKeyChecking no" not in text
    assert ssh_config_block("demo", list(reversed(nodes(3))), "ubuntu") == text  # deterministic


def test_managed_block_is_prepended_then_replaced_in_place_keeping_user_text():
    user = "Host github.com\n    User git\n"
    first = replace_managed_block(user, ssh_config_block("demo", nodes(2), "root"), "demo")
    assert first.startswith("# BEGIN xeon-cluster demo") and first.endswith(user)
    second = replace_managed_block(first, ssh_config_block("demo", nodes(3), "root"), "demo")
    assert second.count("# BEGIN xeon-cluster demo") == 1
    assert "Host node2 10.0.0.12" in second and second.endswith(user)
    other = replace_managed_block(second, ssh_config_block("other", nodes(1), "root"), "other")
    assert other.count("# BEGIN xeon-cluster") == 2  # another cluster's block is left alone
    assert replace_managed_block("", "B\n", "demo") == "B\n"


def test_managed_block_without_end_is_refused():
    broken = "# BEGIN xeon-cluster demo\nHost node0\n"
    with pytest.raises(RenderError, match="no '# END xeon-cluster demo'"):
        replace_managed_block(broken, "x\n", "demo")


def test_known_hosts_lines_carry_alias_and_private_address_in_rank_order():
    keys = {f"node{i}": KEY + f" root@node{i}" for i in range(3)}
    text = known_hosts_text(list(reversed(nodes(3))), keys)
    assert text.splitlines() == [f"node{i},10.0.0.{10 + i} {KEY}" for i in range(3)]  # comment dropped


def test_known_hosts_refuses_missing_or_malformed_keys():
    with pytest.raises(RenderError, match="node1: no host key"):
        known_hosts_text(nodes(2), {"node0": KEY})
    with pytest.raises(RenderError, match="not 'type base64'"):
        known_hosts_text(nodes(1), {"node0": "ssh-ed25519 not;base64"})


def test_alias_with_spaces_cannot_even_be_a_node():
    with pytest.raises(InventoryError, match="name: 'node 0' is not allowed"):
        Node(name="node 0", address="a", private_address="a", rank=0)


def test_master_paths_and_table():
    paths = MasterPaths("c1")
    assert (paths.private_key, paths.hostfile) == ("~/.ssh/c1_ed25519", "~/hosts")
    text = table([("node0", "ok"), ("node10", "failed")], ("node", "result"))
    assert text.splitlines() == ["node    result", "------  ------", "node0   ok", "node10  failed"]


def _nodes(*addresses):
    return [Node(name=f"node{i}", address=a, private_address=a, rank=i) for i, a in enumerate(addresses)]


def test_the_cluster_key_line_is_limited_to_the_nodes_addresses_when_they_are_ips():
    key = "ssh-ed25519 AAAAkey xeon-cluster:demo"
    assert authorized_key_line(key, _nodes("10.0.0.11", "10.0.0.10")) == (
        'from="10.0.0.11,10.0.0.10",no-agent-forwarding,no-port-forwarding,no-X11-forwarding ' + key)
    # host names match only with sshd's UseDNS: no from= then, forwarding still refused
    assert authorized_key_line(key, _nodes("n1.lab", "10.0.0.10")).startswith("no-agent-forwarding,")


def test_with_the_clusters_network_the_line_names_its_subnet_less_the_addresses_outside_the_cluster():
    """A new master comes up at an address of its own in the subnet: the workers accept it; the local cluster's
    bridge (this machine) does not get in with the cluster key."""
    key = "ssh-ed25519 AAAAkey xeon-cluster:demo"
    line = authorized_key_line(key, _nodes("10.0.0.2", "10.0.0.3"), ("10.0.0.0/24", ("10.0.0.1",)))
    assert line == 'from="!10.0.0.1,10.0.0.0/24",no-agent-forwarding,no-port-forwarding,no-X11-forwarding ' + key
    for bad in (("10.0.0.1/24", ()), ("10.0.0.0/24", ("10.0.0.1,*",)), ("10.0.0.0/24\"", ())):
        with pytest.raises((RenderError, ValueError)):
            authorized_key_line(key, _nodes("10.0.0.2"), bad)


def test_authorize_script_replaces_an_older_line_of_the_key_and_keeps_the_rest(tmp_path):
    import subprocess

    from cluster import shell

    ssh_dir = tmp_path / ".ssh"
    ssh_dir.mkdir()
    keys = ssh_dir / "authorized_keys"
    keys.write_text("ssh-ed25519 AAAAuser admin@laptop\nssh-ed25519 AAAAold xeon-cluster:demo\n"
                    "ssh-ed25519 AAAAother xeon-cluster:demo2\n")
    line = 'from="10.0.0.10",no-agent-forwarding ssh-ed25519 AAAAnew xeon-cluster:demo'

    def run():
        script = shell.render("authorize-key.sh", {"FILE": ".ssh/authorized_keys", "LINE": line,
                                                   "MARK": "xeon-cluster:demo"})
        return subprocess.run(["sh", "-c", script], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, check=True).stdout.strip()

    assert run() == "written"
    assert keys.read_text().splitlines() == ["ssh-ed25519 AAAAuser admin@laptop",
                                             "ssh-ed25519 AAAAother xeon-cluster:demo2", line]
    assert run() == "unchanged" and oct(keys.stat().st_mode & 0o777) == "0o600"
