"""Bad stack config stops the program before any resource is registered, naming key, value, allowed."""

from __future__ import annotations

import pytest

from cluster.stack.spec import ConfigError
from tests.infra.conftest import PUBLIC_KEY, minimal_config

# (config overrides, phrases the message must contain: the key, the value, what is allowed)
BAD_CONFIGS = {
    "ssh from anywhere v4": ({"adminCidrs": ["0.0.0.0/0"]},
                             ["adminCidrs", "'0.0.0.0/0'", "allowSshFromAnywhere"]),
    "ssh from anywhere v6": ({"adminCidrs": ["::/0"]}, ["adminCidrs", "'::/0'", "allowSshFromAnywhere"]),
    "malformed cidr": ({"adminCidrs": ["10.0.0.300/32"]}, ["adminCidrs", "'10.0.0.300/32'", "203.0.113.7/32"]),
    "cidr with host bits": ({"adminCidrs": ["203.0.113.7/24"]}, ["adminCidrs", "'203.0.113.7/24'", "allowed"]),
    "no admin cidrs": ({"adminCidrs": []}, ["adminCidrs", "not set", "pulumi config set"]),
    "negative workers": ({"workerCount": -1}, ["workerCount", "-1", "0 to 128"]),
    "absurd workers": ({"workerCount": 5000}, ["workerCount", "5000", "0 to 128"]),
    "workers not a number": ({"workerCount": "three"}, ["workerCount", "'three'", "whole number"]),
    "unknown instance type": ({"instanceType": "x9z.huge"},
                              ["instanceType", "'x9z.huge'", "r7iz.metal-16xl", "sockets and physicalCores"]),
    "instance types of two shapes": ({"instanceTypes": ["m7i.48xlarge", "c7i.48xlarge", "c6i.32xlarge"]},
                                     ["instanceTypes", "c6i.32xlarge (2 x 32 cores", "m7i.48xlarge (2 x 48 cores",
                                      "allowed: types of one shape"]),
    "root volume too small": ({"rootVolumeGib": 20}, ["rootVolumeGib", "20", "'stock'", "40"]),
    "root volume too small for intel": ({"rootVolumeGib": 50, "softwareProfile": "intel"},
                                        ["rootVolumeGib", "50", "'intel'", "60"]),
    "missing public key": ({"publicKey": ""}, ["publicKey", "not set", "pulumi config set publicKey"]),
    "malformed public key": ({"publicKey": "ssh-ed25519"}, ["publicKey", "'ssh-ed25519'", "ssh-rsa"]),
    "damaged public key": ({"publicKey": PUBLIC_KEY.replace("ssh-ed25519", "ssh-rsa")},
                           ["publicKey", "damaged"]),
    "private key pasted as public": ({"publicKey": "-----BEGIN OPENSSH PRIVATE KEY----- abc"},
                                     ["publicKey", "not an OpenSSH public key"]),
    "spot price zero": ({"spotMaxPrice": "0"}, ["spotMaxPrice", "0.0", "positive"]),
    "spot price negative": ({"spotMaxPrice": "-1.5"}, ["spotMaxPrice", "-1.5", "positive"]),
    "spot price not a number": ({"spotMaxPrice": "cheap"}, ["spotMaxPrice", "'cheap'", "a number"]),
    "unknown profile": ({"softwareProfile": "cuda"}, ["softwareProfile", "'cuda'", "intel, stock"]),
    "bad volume type": ({"rootVolumeType": "st1"}, ["rootVolumeType", "'st1'", "gp3"]),
    "volume type needing iops": ({"rootVolumeType": "io2"}, ["rootVolumeType", "'io2'", "provisioned IOPS",
                                                             "allowed: gp3, gp2"]),
    "half the internet v6": ({"adminCidrs": ["::/1"]}, ["adminCidrs", "'::/1'", "/32", "allowSshFromAnywhere"]),
    "wider than /8": ({"adminCidrs": ["10.0.0.0/7"]}, ["adminCidrs", "'10.0.0.0/7'", "/8", "allowSshFromAnywhere"]),
    "bad cluster name": ({"clusterName": "My_Cluster"}, ["clusterName", "'My_Cluster'", "lowercase"]),
    "bad tag": ({"tags": ["team"]}, ["tags", "'team'", "key=value"]),
    "bake not a boolean": ({"bake": "yes"}, ["bake", "'yes'", "true or false"]),
    "unknown key (typo)": ({"workercount": 4}, ["xeon-cluster:workercount", "not a setting", "workerCount"]),
}


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_bad_config_names_key_value_and_allowed_and_registers_nothing(harness, name):
    overrides, phrases = BAD_CONFIGS[name]
    with pytest.raises(ConfigError) as caught:
        harness.run(minimal_config(**overrides))
    message = str(caught.value)
    assert len(caught.value.problems) == 1, message  # one message for the one bad key
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} missing from: {message}"
    assert harness.monitor.registrations == []
    assert harness.fake.calls == []  # not even a lookup ran


def test_every_problem_is_reported_at_once(harness):
    with pytest.raises(ConfigError) as caught:
        harness.run(minimal_config(workerCount=-2, adminCidrs=["0.0.0.0/0"], softwareProfile="cuda"))
    keys = sorted(p.split(":")[0] for p in caught.value.problems)
    assert keys == ["adminCidrs", "softwareProfile", "workerCount"]
    assert harness.monitor.registrations == []


def test_missing_region_is_reported(harness):
    with pytest.raises(ConfigError, match=r"aws:region: not set.*pulumi config set aws:region"):
        harness.run(minimal_config(), region=None)
    assert harness.monitor.registrations == []


@pytest.mark.parametrize("overrides", [
    {"adminCidrs": ["0.0.0.0/0"], "allowSshFromAnywhere": True},
    {"instanceType": "x9z.huge", "sockets": 2, "physicalCores": 96},
    {"rootVolumeGib": 40},
    {"spotMaxPrice": "0.75"},
    {"workerCount": 128},
])
def test_overrides_and_boundaries_are_accepted(harness, overrides):
    outputs = harness.run(minimal_config(**overrides))
    assert outputs["clusterName"] == "xeon-dev"


INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EVERY_SLASH_8 = [f"{first}.0.0.0/8" for first in range(256)]


def ssh_sources(monitor) -> list[str]:
    return sorted(r.inputs.get("cidrIpv4") or r.inputs.get("cidrIpv6") for r in monitor.of_type(INGRESS)
                  if not r.inputs.get("referencedSecurityGroupId"))


@pytest.mark.parametrize("cidrs, phrases", [
    (["0.0.0.0/1", "128.0.0.0/1"], ["'0.0.0.0/1'", "'128.0.0.0/1'", "wider than /8"]),
    (["203.0.113.7/32", "::/1"], ["'::/1'", "wider than /32"]),
    (EVERY_SLASH_8, ["'0.0.0.0/8'", "(256 networks)", "together cover every IPv4 address"]),
], ids=["two halves of IPv4", "one good, one open IPv6", "every /8"])
def test_networks_that_open_ssh_to_the_internet_register_no_ssh_rule(harness, cidrs, phrases):
    with pytest.raises(ConfigError) as caught:
        harness.run(minimal_config(adminCidrs=cidrs))
    message = str(caught.value)
    for phrase in phrases:
        assert phrase in message, f"{phrase!r} missing from: {message}"
    assert all(p.startswith("adminCidrs: ") and "allowSshFromAnywhere: true" in p for p in caught.value.problems)
    assert harness.monitor.registrations == []  # so no SSH rule either


def test_the_override_admits_them_and_the_widest_own_networks_need_none(harness):
    harness.run(minimal_config(adminCidrs=["0.0.0.0/1", "128.0.0.0/1"], allowSshFromAnywhere=True))
    assert ssh_sources(harness.monitor) == ["0.0.0.0/1", "128.0.0.0/1"]


def test_the_widest_accepted_networks_are_a_slash_8_and_a_slash_32(harness):
    harness.run(minimal_config(adminCidrs=["10.0.0.0/8", "2001:db8::/32"]))
    assert ssh_sources(harness.monitor) == ["10.0.0.0/8", "2001:db8::/32"]


def test_a_repeated_network_gets_one_rule_and_a_warning(harness, caplog):
    import logging

    caplog.set_level(logging.WARNING)
    harness.run(minimal_config(adminCidrs=["203.0.113.7/32", "2001:DB8::/48", "203.0.113.7/32", "2001:db8::/48"]))
    assert ssh_sources(harness.monitor) == ["2001:DB8::/48", "203.0.113.7/32"]
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("adminCidrs: ")]
    assert warnings == [
        ("adminCidrs: '203.0.113.7/32' is listed more than once; the duplicate is dropped "
         "(a security group cannot hold two identical rules)"),
        ("adminCidrs: '2001:db8::/48' is listed more than once (the same network as '2001:DB8::/48'); the duplicate "
         "is dropped (a security group cannot hold two identical rules)")]


@pytest.mark.parametrize("half", ["id_ed25519", "id_ed25519.pub"])
def test_a_half_cluster_key_pair_stops_the_program_in_one_line_and_registers_nothing(harness, half):
    """Only one half of the cluster key pair in the controller's key store: a RunError (Pulumi shows its
    message alone, no traceback) naming the file to remove; the missing half is not made."""
    import pulumi

    from cluster.stack.spec import ClusterSpec
    from node_setup.ssh import keys
    from tests.infra.conftest import REGION, STACK

    name = ClusterSpec.from_config(minimal_config(), stack=STACK, region=REGION).cluster_name
    there = keys.cluster_dir(name) / half
    there.write_text("one half\n")
    with pytest.raises(pulumi.RunError) as caught:
        harness.run(minimal_config())
    line = str(caught.value)
    assert line.startswith(f"cluster key of {name!r}: ") and f"remove {there} and rerun" in line
    assert "\n" not in line
    assert harness.monitor.registrations == []
    assert sorted(p.name for p in there.parent.iterdir()) == [half]
