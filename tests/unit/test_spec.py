"""ClusterSpec.from_config: defaults, how Pulumi's string values are read, and every rule."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.node.profiles import PROFILES
from cluster.stack.spec import (MAX_ROOT_VOLUME_GIB, MAX_WORKERS, MIN_ADMIN_PREFIX, ClusterSpec, ConfigError,
                                unique_cidrs)

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int test@xeon-cluster"
# A real ecdsa-sha2-nistp256 public key (made with ssh-keygen for this test).
ECDSA_KEY = ("ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBGvNYx1UfbP2Zm1itdU9F"
             "u6X3UVfKO5kRmUjpDMYI0Y4vdrsrMKHhN+yFormMWQHAYYHuSAXMJHIoS4kdkkgdIk= test@xeon-cluster")


def spec(stack="dev", region="us-east-1", **cfg) -> ClusterSpec:
    base = {"publicKey": KEY, "adminCidrs": ["203.0.113.7/32"]}
    base.update(cfg)
    return ClusterSpec.from_config(base, stack=stack, region=region)


def problems(**cfg) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        spec(**cfg)
    return caught.value.problems


def test_defaults_are_the_recipe_cluster():
    s = spec()
    assert (s.cluster_name, s.instance_type, s.worker_count, s.node_count) == ("xeon-dev", "r7iz.metal-16xl", 3, 4)
    assert s.master_spot and s.worker_spot and s.spot_max_price is None
    assert (s.software_profile, s.bake, s.placement_group, s.destroy_bucket) == ("stock", True, True, False)
    assert (s.root_volume_gib, s.root_volume_type, s.ssh_user) == (100, "gp3", "ubuntu")
    assert s.base_ami is None and s.vpc_id is None and s.subnet_id is None
    assert s.profile is PROFILES["stock"] and s.instance.physical_cores == 32
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.worker_count = 5


def test_cluster_name_from_stack_is_lowercase():
    assert spec(stack="Prod").cluster_name == "xeon-prod"


def test_pulumi_strings_are_read_as_their_types():
    s = spec(workerCount="7", masterSpot="false", workerSpot="True", spotMaxPrice="2.5", rootVolumeGib="200",
             placementGroup="false", bake="false", destroyBucket="true")
    assert (s.worker_count, s.master_spot, s.worker_spot, s.spot_max_price) == (7, False, True, 2.5)
    assert (s.root_volume_gib, s.placement_group, s.bake, s.destroy_bucket) == (200, False, False, True)


@pytest.mark.parametrize("cfg, expected", [
    ({"bake": "yes"}, "bake: 'yes' is not true or false"),
    ({"workerCount": 2.5}, "workerCount: 2.5 is not a whole number"),
    ({"workerCount": True}, "workerCount: True is not a whole number"),
    ({"spotMaxPrice": "cheap"}, "spotMaxPrice: 'cheap' is not a number"),
])
def test_values_of_the_wrong_type_are_named(cfg, expected):
    assert expected in problems(**cfg)[0]


def test_a_single_cidr_string_is_accepted_and_ipv6_too():
    assert spec(adminCidrs="198.51.100.0/24").admin_cidrs == ("198.51.100.0/24",)
    assert spec(adminCidrs=["2001:db8::/48"]).admin_cidrs == ("2001:db8::/48",)


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_open_ssh_needs_the_explicit_override(cidr):
    assert "allowSshFromAnywhere" in problems(adminCidrs=[cidr])[0]
    assert spec(adminCidrs=[cidr], allowSshFromAnywhere="true").admin_cidrs == (cidr,)


@pytest.mark.parametrize("cidrs", [["0.0.0.0/1", "128.0.0.0/1"], ["::/1"], ["10.0.0.0/7"], ["2001:db8::/31"],
                                   ["2001:db8::/48", "::/1", "8000::/1"]])
def test_networks_wider_than_anyone_owns_need_the_override(cidrs):
    found = problems(adminCidrs=cidrs)
    wide = [c for c in cidrs if int(c.split("/")[1]) < MIN_ADMIN_PREFIX[6 if ":" in c else 4]]
    assert len(found) == len(wide)  # one line per too-wide network, each naming it
    for cidr, problem in zip(wide, found):
        assert problem.startswith(f"adminCidrs: {cidr!r} is wider than /") and "allowSshFromAnywhere" in problem
    assert spec(adminCidrs=cidrs, allowSshFromAnywhere=True).admin_cidrs == tuple(cidrs)


def test_the_minimum_prefixes_are_a_slash_8_and_a_slash_32():
    assert MIN_ADMIN_PREFIX == {4: 8, 6: 32}
    assert spec(adminCidrs=["10.0.0.0/8", "2001:db8::/32"]).admin_cidrs == ("10.0.0.0/8", "2001:db8::/32")


def test_networks_that_together_cover_every_address_need_the_override():
    every_v4 = [f"{first}.0.0.0/8" for first in range(256)]
    (problem,) = problems(adminCidrs=every_v4)
    assert "together cover every IPv4 address" in problem and "allowSshFromAnywhere" in problem
    assert len(problem) < 400  # the listing is shortened
    assert len(spec(adminCidrs=every_v4[:-1]).admin_cidrs) == 255  # one /8 short of everything
    assert len(spec(adminCidrs=every_v4, allowSshFromAnywhere=True).admin_cidrs) == 256


def test_a_repeated_network_is_dropped_and_said():
    s = spec(adminCidrs=["203.0.113.7/32", "2001:DB8::/48", "203.0.113.7/32", "2001:db8::/48"])
    assert s.admin_cidrs == ("203.0.113.7/32", "2001:DB8::/48")
    kept, notes = unique_cidrs(["203.0.113.7/32", "2001:DB8::/48", "203.0.113.7/32", "2001:db8::/48", "bad", "bad"])
    assert kept == ("203.0.113.7/32", "2001:DB8::/48", "bad")
    assert notes[0].startswith("adminCidrs: '203.0.113.7/32' is listed more than once; the duplicate is dropped")
    assert "(the same network as '2001:DB8::/48')" in notes[1] and len(notes) == 3
    assert unique_cidrs(["203.0.113.7/32"]) == (("203.0.113.7/32",), [])


@pytest.mark.parametrize("cidr", ["10.0.0.1/33", "example.org", "203.0.113.7/24", ""])
def test_malformed_cidrs_are_refused(cidr):
    (problem,) = problems(adminCidrs=[cidr])
    assert problem.startswith("adminCidrs: ") and repr(cidr) in problem


def test_worker_count_bounds():
    assert spec(workerCount=0).node_count == 1
    assert spec(workerCount=MAX_WORKERS).worker_count == MAX_WORKERS
    for bad in (-1, MAX_WORKERS + 1):
        assert f"allowed 0 to {MAX_WORKERS}" in problems(workerCount=bad)[0]


def test_root_volume_bounds_follow_the_profile():
    for name, profile in PROFILES.items():
        assert spec(softwareProfile=name, rootVolumeGib=profile.min_root_volume_gib).root_volume_gib == \
            profile.min_root_volume_gib
        assert "too small" in problems(softwareProfile=name, rootVolumeGib=profile.min_root_volume_gib - 1)[0]
    assert "EBS maximum" in problems(rootVolumeGib=MAX_ROOT_VOLUME_GIB + 1)[0]


def test_unknown_instance_type_needs_its_core_counts():
    assert "sockets and physicalCores" in problems(instanceType="x9z.huge")[0]
    s = spec(instanceType="x9z.huge", sockets="2", physicalCores="96")
    assert (s.instance.name, s.instance.sockets, s.instance.physical_cores) == ("x9z.huge", 2, 96)
    assert "sockets: -1 must be a positive integer" in problems(sockets=-1)[0]
    assert spec(sockets=0).sockets is None  # 0 is the schema default that means "from the catalog"


SHAPE_OF_THREE = ["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]


def test_instance_types_of_one_shape_are_every_node_s_types_the_first_the_master_s():
    s = spec(instanceTypes=SHAPE_OF_THREE)
    assert s.types == tuple(SHAPE_OF_THREE) and s.instance_type == "m7i.48xlarge"
    assert s.instance == spec(instanceType="m7i.48xlarge").instance  # one rank layout for all three
    assert spec().types == ("r7iz.metal-16xl",) and spec().instance_types == ()
    assert spec(instanceTypes=[]).types == ("r7iz.metal-16xl",)  # Pulumi.yaml's default: not set
    # instanceType alongside: its default, or the same first type, is no conflict
    assert spec(instanceTypes=SHAPE_OF_THREE, instanceType="m7i.48xlarge").types == tuple(SHAPE_OF_THREE)
    assert spec(instanceTypes=SHAPE_OF_THREE, instanceType="r7iz.metal-16xl").instance_type == "m7i.48xlarge"


def test_instance_types_of_two_shapes_are_refused_in_one_line_naming_the_differing_types():
    found = problems(instanceTypes=["m7i.48xlarge", "c7i.48xlarge", "c6i.32xlarge", "c7i.metal-48xl"])
    assert len(found) == 1
    assert found[0].startswith("instanceTypes: m7i.48xlarge, c7i.48xlarge, c6i.32xlarge, c7i.metal-48xl are of "
                               "more than one shape: c6i.32xlarge, c7i.metal-48xl (2 x 32 cores, 128 vCPUs")
    assert "(m7i.48xlarge's: c7i.48xlarge, m7i.48xlarge, r7i.48xlarge)" in found[0]


@pytest.mark.parametrize("cfg, expected", [
    ({"instanceTypes": "m7i.48xlarge"}, "instanceTypes: 'm7i.48xlarge' is not a list of instance type names"),
    ({"instanceTypes": ["m7i.48xlarge", "m7i.48xlarge"]}, "names a type more than once"),
    ({"instanceTypes": ["m7i.48xlarge", "x9z.huge"]}, "instanceTypes: x9z.huge not in the catalog"),
    ({"instanceTypes": SHAPE_OF_THREE, "sockets": 2}, "instanceTypes: set together with sockets/physicalCores"),
    ({"instanceTypes": SHAPE_OF_THREE, "instanceType": "c6i.32xlarge"},
     "instanceType: 'c6i.32xlarge' is set together with instanceTypes"),
])
def test_bad_instance_types_are_named(cfg, expected):
    assert [p for p in problems(**cfg) if expected in p]


def test_on_demand_fallback_is_off_or_a_wait_and_needs_spot_workers():
    assert spec().on_demand_fallback_s is None and spec(onDemandFallback="OFF").on_demand_fallback_s is None
    assert spec(onDemandFallback="20m").on_demand_fallback_s == 1200
    (found,) = problems(onDemandFallback="soon")
    assert found.startswith("onDemandFallback: 'soon' is not a duration") and found.endswith("(or off)")
    assert problems(onDemandFallback="20m", workerSpot=False) == [
        "onDemandFallback: '20m' with workerSpot: false, whose workers are on demand already; allowed: off, or "
        "workerSpot: true"]


def test_catalog_type_layout_can_be_overridden():
    s = spec(instanceType="c6i.32xlarge", sockets=1)
    assert (s.instance.sockets, s.instance.physical_cores) == (1, 64)


@pytest.mark.parametrize("key, ok", [(KEY, True), (ECDSA_KEY, True), ("", False), ("ssh-ed25519", False),
                                     ("ssh-dss AAAAB3NzaC1kc3M= x", False),
                                     (KEY.replace("AAAAC3", "AAAAC4"), False), ("ssh-ed25519 !!!notbase64", False)])
def test_public_key_must_be_an_openssh_public_key(key, ok):
    if ok:
        assert spec(publicKey=key).public_key == key
    else:
        assert problems(publicKey=key)[0].startswith("publicKey: ")


def test_spot_price_must_be_positive():
    assert spec(spotMaxPrice="0.01").spot_max_price == 0.01
    for bad in ("0", "-3"):
        assert "must be a positive hourly price" in problems(spotMaxPrice=bad)[0]


def test_profile_and_volume_type_choices():
    assert "allowed: intel, stock" in problems(softwareProfile="cuda")[0]
    assert "allowed: gp3, gp2" in problems(rootVolumeType="st1")[0]
    assert spec(rootVolumeType="gp2").root_volume_type == "gp2"


@pytest.mark.parametrize("volume_type", ["io1", "io2"])
def test_provisioned_iops_volume_types_are_refused_before_aws_refuses_the_launch(volume_type):
    (problem,) = problems(rootVolumeType=volume_type)
    assert problem == (f"rootVolumeType: {volume_type!r} needs provisioned IOPS, which no setting gives (AWS "
                       "refuses the launch without them); allowed: gp3, gp2")


def test_tags_as_map_or_key_value_list():
    assert spec(tags={"team": "ml"}).tags == {"team": "ml"}
    assert spec(tags=["team=ml", "cost-center = 42", "empty="]).tags == {"team": "ml", "cost-center": "42",
                                                                          "empty": ""}
    assert "'team' is not key=value" in problems(tags=["team"])[0]
    assert "must be a map" in problems(tags={"n": 1})[0]


def test_cluster_name_rules():
    assert spec(clusterName="lab-2").cluster_name == "lab-2"
    for bad in ("A", "2fast", "has_underscore", "x" * 40, "ends-"):
        assert problems(clusterName=bad)[0].startswith("clusterName: ")


def test_region_is_required():
    assert problems(region="")[0].startswith("aws:region: not set")


def test_all_problems_at_once_one_line_each():
    found = problems(workerCount=-1, publicKey="", adminCidrs=[], softwareProfile="x", rootVolumeType="st1")
    assert [p.split(":")[0] for p in found] == ["workerCount", "softwareProfile", "rootVolumeType",
                                                "adminCidrs", "publicKey"]
    message = str(ConfigError(found))
    assert message.count("\n  - ") == len(found)


def test_a_login_user_that_would_reach_a_shell_is_refused():
    assert "sshUser: 'ubuntu; id' is not allowed; allowed: a login name" in problems(sshUser="ubuntu; id")[0]
    assert spec(sshUser="ec2-user").ssh_user == "ec2-user"
