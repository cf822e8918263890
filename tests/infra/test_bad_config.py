"""Bad stack config stops the program before any resource is registered, naming key, value, allowed."""

from __future__ import annotations

import pytest

from cluster.spec import ConfigError
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
    "workers not a number": ({"workerCount": "three"}, ["workerCount", "'three'", "int"]),
    "unknown instance type": ({"instanceType": "x9z.huge"},
                              ["instanceType", "'x9z.huge'", "r7iz.metal-16xl", "sockets and physicalCores"]),
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
    "spot price not a number": ({"spotMaxPrice": "cheap"}, ["spotMaxPrice", "'cheap'", "float"]),
    "unknown profile": ({"softwareProfile": "cuda"}, ["softwareProfile", "'cuda'", "intel, stock"]),
    "bad volume type": ({"rootVolumeType": "st1"}, ["rootVolumeType", "'st1'", "gp3"]),
    "bad cluster name": ({"clusterName": "My_Cluster"}, ["clusterName", "'My_Cluster'", "lowercase"]),
    "bad tag": ({"tags": ["team"]}, ["tags", "'team'", "key=value"]),
    "bake not a boolean": ({"bake": "yes"}, ["bake", "'yes'", "bool"]),
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
