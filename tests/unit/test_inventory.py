import pytest

from cluster.inventory import Inventory, InventoryError
from cluster.tags import ROLE_MASTER, ROLE_WORKER


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
