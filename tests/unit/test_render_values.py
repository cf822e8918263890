"""The files `fab distribute` writes on the master and the nodes (cluster/node/render.py, the job's
hostfile in cluster/job/launch.py, a local node's /etc/hosts) refuse a value that would add a line or
an option, however the nodes were made.

`unchecked_node` is a test double: a Node made without its own checks (as a bug elsewhere, a
future source of nodes or a direct `object.__setattr__` could), so what is tested here is the
renderers' own check, not the one in cluster/inventory.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from cluster.inventory import Node
from cluster.job.launch import LaunchError, hostfile_text as job_hostfile_text
from cluster.node.render import (MasterPaths, RenderError, authorized_key_line, hostfile_text, key_comment,
                            known_hosts_text, replace_managed_block, ssh_config_block)
from node_setup.local.state import hosts_text

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKey0"
PUBLIC = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClusterKey xeon-cluster:demo"
BAD = ["x\nProxyCommand sh -c id", 'x"', "x y", "x\r", "x\tStrictHostKeyChecking=no", "fe80::1%eth0\nHost *",
       "fe80::1%eth0"]


def unchecked_node(rank: int, **fields) -> Node:
    """A Node whose fields are set without Node.__post_init__'s checks (a test double, see above)."""
    node = object.__new__(Node)
    values = {f.name: f.default for f in dataclasses.fields(Node) if f.default is not dataclasses.MISSING}
    values.update(name=f"node{rank}", address=f"10.0.0.{rank + 10}", private_address=f"10.0.0.{rank + 10}", rank=rank)
    values.update(fields)
    for key, value in values.items():
        object.__setattr__(node, key, value)
    return node


def renderers(nodes):
    return {
        "hostfile": lambda: hostfile_text(nodes),
        "ssh config": lambda: ssh_config_block("demo", nodes, "ubuntu"),
        "known_hosts": lambda: known_hosts_text(nodes, {n.name: KEY for n in nodes}),
        "authorized_keys": lambda: authorized_key_line(PUBLIC, nodes),
    }


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("field, file", [("name", "hostfile"), ("name", "ssh config"), ("name", "known_hosts"),
                                         ("name", "authorized_keys"), ("private_address", "ssh config"),
                                         ("private_address", "known_hosts"), ("private_address", "authorized_keys")])
def test_a_node_value_that_would_break_a_line_is_refused_by_every_renderer(field, value, file):
    nodes = [unchecked_node(0), unchecked_node(1, **{field: value})]
    with pytest.raises(RenderError, match=f"node 1 {field}: .* is not allowed; allowed: "):
        renderers(nodes)[file]()


def test_the_same_nodes_checked_render_one_line_per_entry():
    """The good case of the test above: the renderers still write what they wrote."""
    nodes = [unchecked_node(0), unchecked_node(1, private_address="2001:db8::11")]
    out = renderers(nodes)
    assert out["hostfile"]() == "node0\nnode1\n"
    assert out["known_hosts"]().splitlines() == [f"node0,10.0.0.10 {KEY}", f"node1,2001:db8::11 {KEY}"]
    assert "\n" not in out["authorized_keys"]() and 'from="10.0.0.10,2001:db8::11"' in out["authorized_keys"]()
    assert "    HostName 2001:db8::11" in out["ssh config"]().splitlines()


@pytest.mark.parametrize("user", ["ubuntu\nProxyCommand id", 'ubuntu"', "ubuntu root", "Ubuntu"])
def test_the_ssh_config_refuses_a_user_that_is_not_a_login_name(user):
    with pytest.raises(RenderError, match="user: .* is not allowed; allowed: a login name"):
        ssh_config_block("demo", [unchecked_node(0)], user)


@pytest.mark.parametrize("cluster", ["../../x", "demo\nHost *", "de mo", 'demo"'])
def test_a_cluster_name_that_would_climb_out_of_ssh_or_break_a_line_is_refused(cluster):
    for render in (lambda: MasterPaths(cluster), lambda: ssh_config_block(cluster, [unchecked_node(0)], "ubuntu"),
                   lambda: replace_managed_block("", "", cluster), lambda: key_comment(cluster)):
        with pytest.raises(RenderError, match="cluster name: .* is not allowed; allowed: letters"):
            render()


@pytest.mark.parametrize("public", [
    PUBLIC + "\ncommand=\"sh\" ssh-ed25519 AAAAother x",  # a second authorized_keys line
    'command="id" ' + PUBLIC,  # an option before the key
    "ssh-ed25519 AAAA xeon-cluster:demo extra words",
    "ssh-ed25519 AAAA\"x xeon-cluster:demo",
])
def test_the_authorized_keys_line_refuses_a_key_that_is_not_one_plain_key(public):
    with pytest.raises(RenderError, match="cluster key: .* is not allowed; allowed: one line"):
        authorized_key_line(public, [unchecked_node(0)])
    assert authorized_key_line(PUBLIC + "\n", [unchecked_node(0)]).endswith(PUBLIC)  # its own newline is fine


def test_a_host_key_with_a_trailing_line_break_is_still_one_line():
    text = known_hosts_text([unchecked_node(0)], {"node0": KEY + "\n"})
    assert text == f"node0,10.0.0.10 {KEY}\n"


@pytest.mark.parametrize("slots", [True, "2", 0])
def test_the_hostfile_slots_are_a_whole_number(slots):
    with pytest.raises(RenderError, match="slots"):
        hostfile_text([unchecked_node(0)], slots=slots)


@pytest.mark.parametrize("host", BAD)
def test_the_jobs_hostfile_refuses_a_host_that_would_break_a_line(host):
    for flavour in ("intel-mpi", "openmpi"):
        with pytest.raises(LaunchError, match="hostfile host: .* is not allowed"):
            job_hostfile_text(["node0", host], flavour, 2)
    assert job_hostfile_text(["node0", "node1"], "openmpi", 2) == "node0 slots=2\nnode1 slots=2\n"


@pytest.mark.parametrize("hostname, address", [("node0\n10.0.0.9 bastion", "10.200.0.2"), ("node0 x", "10.200.0.2"),
                                               ("node0", "10.200.0.2\n10.0.0.9 bastion"), ("node0", "fe80::1%eth0")])
def test_a_local_nodes_hosts_file_refuses_a_value_that_would_add_a_name_or_a_line(hostname, address):
    with pytest.raises(ValueError, match="local node (name|address): .* is not allowed"):
        hosts_text(hostname, address)
    assert hosts_text("node0", "10.200.0.2").splitlines()[1] == "10.200.0.2\tnode0"
