import os
from pathlib import Path

import pytest

from cluster.inventory import Inventory, InventoryError
from cluster.stack.tags import ROLE_MASTER, ROLE_WORKER
from tests.fab_run import fab_in_process


def test_hosts_keep_file_order_master_first_and_round_trip():
    inv = Inventory.from_mapping(
        {"user": "ubuntu", "instance_type": "c6i.16xlarge",
         "hosts": [{"name": "m", "address": "192.0.2.10", "private_address": "10.0.0.10"}, "192.0.2.11"]},
        default_name="lab")
    assert [n.name for n in inv.nodes] == ["m", "node1"]
    assert [n.role for n in inv.nodes] == [ROLE_MASTER, ROLE_WORKER]
    assert inv.nodes[1].private_address == "192.0.2.11"
    assert inv.name == "lab" and inv.user == "ubuntu"
    assert Inventory.from_mapping(inv.to_mapping(), default_name="x") == inv


def test_first_cuts_and_names_the_allowed_range():
    inv = Inventory.from_mapping({"hosts": ["a", "b", "c"]}, default_name="lab")
    assert [n.name for n in inv.first(2).nodes] == ["node0", "node1"]
    with pytest.raises(InventoryError, match=r"--nodes: 4 .* allowed 1 to 3"):
        inv.first(4)
    with pytest.raises(InventoryError, match="allowed 1 to 3"):
        inv.first(0)


@pytest.mark.parametrize("data, message", [
    ({}, "'hosts' must be a non-empty list"),
    ({"hosts": [{"name": "x"}]}, r"hosts\[0\] needs an 'address'"),
    ({"hosts": ["a"], "profile": "cuda"}, "profile 'cuda' is unknown; allowed: intel, stock"),
    ({"hosts": [{"name": "n", "address": "a"}, {"name": "n", "address": "b"}]}, "host names repeat"),
    (["a"], "expected a mapping"),
    ({"hosts": ["a"], "usr": "ubuntu"}, "key 'usr' is unknown; did you mean 'user'?"),
    ({"hosts": ["a"], "physical_core": 8}, "key 'physical_core' is unknown; did you mean 'physical_cores'?"),
    ({"hosts": [{"adress": "a"}]}, r"hosts\[0\]: key 'adress' is unknown; did you mean 'address'?"),
    ({"hosts": ["a"], "sockets": "two"}, "sockets: 'two' is not allowed; allowed: a whole number of 1 or more"),
    ({"hosts": ["a"], "physical_cores": 0}, "physical_cores: 0 is not allowed"),
    ({"hosts": ["a"], "user": "root; rm -rf ~"}, r"user: 'root; rm -rf ~' is not allowed; allowed: a login name"),
    ({"hosts": ["10.0.0.1$(touch /tmp/x)"]}, r"host 0 \('node0'\) address: .* is not allowed"),
    ({"hosts": [{"name": "*", "address": "10.0.0.1"}]}, r"host 0 \('\*'\) name: '\*' is not allowed"),
    ({"hosts": [{"address": "a", "private_address": "b`id`"}]}, "private_address: 'b`id`' is not allowed"),
    ({"hosts": ["a"], "gateway": "bastion -oProxyCommand=x"}, "gateway: .* is not allowed"),
    ({"hosts": ["a"], "wheelhouse": "/srv/w; id"}, "wheelhouse: '/srv/w; id' is not allowed"),
    ({"hosts": ["a"], "user": "ubuntu\n"}, r"user: 'ubuntu\\n' is not allowed; allowed: a login name"),
    ({"hosts": ["10.0.0.1\n"]}, r"host 0 \('node0'\) address: '10.0.0.1\\n' is not allowed"),
    ({"hosts": ["node-1.example.org\n"]}, r"address: 'node-1.example.org\\n' is not allowed"),
    ({"hosts": [{"name": "n0\n", "address": "10.0.0.1"}]}, r"name: 'n0\\n' is not allowed"),
    ({"hosts": ["a"], "wheelhouse": "/srv/w\n"}, r"wheelhouse: '/srv/w\\n' is not allowed"),
    # IPv6 zone ids: `ipaddress` takes anything after '%'; it would reach ssh config and known_hosts
    ({"hosts": ["fe80::1%eth0\n  ProxyCommand sh -c id"]}, r"address: 'fe80::1%eth0\\n  ProxyCommand .* allowed: "
                                                          r"an IP address \(no %zone\)"),
    ({"hosts": [{"address": "10.0.0.1", "private_address": 'fe80::1%x"'}]}, "private_address: .* is not allowed"),
    ({"hosts": [{"address": "10.0.0.1", "private_address": "fe80::1%a b"}]}, "private_address: .* is not allowed"),
    ({"hosts": [{"address": "10.0.0.1", "private_address": "fe80::1%eth0"}]}, "private_address: .* is not allowed"),
    ({"hosts": ["a"], "gateway": "fe80::1%eth0\nHost *"}, "gateway: .* is not allowed"),
    # names, users and ports with a quote, a space or a line break
    ({"hosts": [{"name": 'n0"', "address": "10.0.0.1"}]}, "name: .* is not allowed"),
    ({"hosts": [{"name": "n0 n1", "address": "10.0.0.1"}]}, "name: 'n0 n1' is not allowed"),
    ({"hosts": ["a"], "user": 'ubuntu"'}, "user: .* is not allowed; allowed: a login name"),
    ({"hosts": ["a"], "user": "ubuntu root"}, "user: 'ubuntu root' is not allowed"),
    ({"hosts": ["a:22\n"]}, r"address \(port\): '22\\n' is not allowed; allowed: a TCP port"),
    ({"hosts": ["a:2 2"]}, r"address \(port\): '2 2' is not allowed"),
    ({"hosts": ["a:\u00b2"]}, r"address \(port\): '\u00b2' is not allowed; allowed: a TCP port"),
    ({"hosts": ["a"], "gateway": "b:\uff12\uff12"}, r"gateway \(port\): .* is not allowed"),
    # the cluster's name names files on the master (~/.ssh/<name>_ed25519) and the ssh config block
    ({"hosts": ["a"], "name": "../../x"}, r"inventory 'lab': name: '../../x' is not allowed; allowed: letters"),
    ({"hosts": ["a"], "name": "lab\nHost *"}, r"name: 'lab\\nHost \*' is not allowed"),
    ({"hosts": ["a"], "name": "a b"}, "name: 'a b' is not allowed"),
    # types the file may hold that are not the setting's
    ({"hosts": ["a"], "profile": ["stock"]}, r"profile \['stock'\] is unknown; allowed: intel, stock"),
    ({"hosts": ["a"], "instance_type": ["c6i.16xlarge"]}, r"instance_type: \['c6i.16xlarge'\] is not allowed"),
    ({"hosts": ["a"], "instance_type": "c6i.16xlarge\n"}, r"instance_type: 'c6i.16xlarge\\n' is not allowed"),
    ({"hosts": ["a"], "key": {"path": "x"}}, r"key: \{'path': 'x'\} is not allowed; allowed: the path"),
])
def test_bad_inventories_say_what_is_wrong(data, message):
    with pytest.raises(InventoryError, match=message):
        Inventory.from_mapping(data, default_name="lab")


def test_machine_from_catalog_or_from_given_core_counts():
    assert Inventory.from_mapping({"hosts": ["a"], "instance_type": "r7iz.metal-16xl"},
                                  default_name="x").machine().sockets == 2
    custom = Inventory.from_mapping({"hosts": ["a"], "sockets": 1, "physical_cores": 2}, default_name="x").machine()
    assert (custom.sockets, custom.physical_cores) == (1, 2)
    with pytest.raises(InventoryError, match="give sockets and physical_cores"):
        Inventory.from_mapping({"hosts": ["a"], "instance_type": "z9.huge"}, default_name="x").machine()


def test_addresses_may_be_ips_host_names_or_user_host_port():
    inv = Inventory.from_mapping({"user": "ubuntu", "gateway": "ops@bastion.example.org:2222", "hosts": [
        "2001:db8::10", {"address": "admin@node-1.lab.example.org:22", "private_address": "10.0.0.11"}]},
        default_name="lab")
    assert [n.address for n in inv.nodes] == ["2001:db8::10", "admin@node-1.lab.example.org:22"]


def test_nodes_from_any_source_are_checked(monkeypatch):
    from cluster.inventory import Node

    with pytest.raises(InventoryError, match="private_address"):
        Node(name="node0", address="10.0.0.1", private_address="10.0.0.1 *", rank=0)
    with pytest.raises(InventoryError, match="user"):
        Inventory(name="c", kind="aws", user="Ubuntu$(id)", nodes=())


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("line, message", [
    ('name: "../../x"', "inventory 'lab': name: '../../x' is not allowed; allowed: letters, digits"),
    ('hosts: ["fe80::1%eth0\\nProxyCommand id"]', r"address: 'fe80::1%eth0\nProxyCommand id' is not allowed"),
])
def test_a_bad_inventory_value_is_one_line_and_exit_2_through_fab(tmp_path, line, message):
    """The real `fab` (python -m fabric) with --cluster naming the file: one line, exit 2, before connecting."""
    path = tmp_path / "lab.yaml"
    path.write_text(f"user: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10]\n{line}\n")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = fab_in_process("train", "--dry-run", "--cluster", str(path), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "config").exists()  # nothing was made for the cluster on this machine either
