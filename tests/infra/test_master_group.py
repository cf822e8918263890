"""The master under the Pulumi mocks: an Auto Scaling group of one from a launch template of the workers' shape
(infra/node_group.py), booting the workers' image in their subnet and placement group; no stand-alone instance.
(One subnet decision for both groups: tests/infra/test_lifecycle.py and test_zone.py.)"""

from __future__ import annotations

import base64

import pytest

from cluster.stack.node_replacement import WORKER_TEMPLATE
from cluster.stack.tags import RANK_KEY, ROLE_KEY, ROLE_MASTER, ROLE_WORKER
from node_setup.controller import KEY_STORE_DIR, SPEC_KEY_FILE
from node_setup.ssh import keys
from tests.infra.conftest import (fresh_run, master_group, master_template, minimal_config, worker_group,
                                  worker_template)

# The template's fields (node_replacement's list, camelCase as registered) that differ by role, and how.
ROLE_FIELDS = {"vpcSecurityGroupIds", "networkInterfaces", "instanceMarketOptions", "iamInstanceProfile",
               "tagSpecifications"}


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(w.title() for w in rest)


@pytest.mark.parametrize("config", [{}, {"bake": False}, {"subnetId": "subnet-0private"}],
                         ids=["baked", "no bake", "private subnet"])
def test_the_master_is_a_group_of_one_from_a_template_of_the_workers_shape(harness, config):
    harness.run(minimal_config(**config))
    monitor = harness.monitor
    assert not monitor.of_type("aws:ec2/instance:Instance")
    master, workers = master_template(monitor), worker_template(monitor)
    group, worker = master_group(monitor), worker_group(monitor)
    assert group.inputs["minSize"] == group.inputs["maxSize"] == group.inputs["desiredCapacity"] == 1
    assert group.inputs["launchTemplate"] == {"id": master.id, "version": str(master.state["latestVersion"])}
    # Field by field, what is not the role's is the workers': the image, the type, the key, the placement
    # group, IMDSv2, the encrypted root volume, the shutdown behaviour; and the same subnet.
    fields = {_camel(f) for f in WORKER_TEMPLATE}
    for field in sorted(fields - ROLE_FIELDS) + ["imageId"]:
        assert master.inputs.get(field) == workers.inputs.get(field), field
    assert master.inputs["metadataOptions"]["httpTokens"] == "required"
    assert master.inputs["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"
    assert master.inputs["instanceInitiatedShutdownBehavior"] == "terminate"
    assert group.inputs["vpcZoneIdentifiers"] == worker.inputs["vpcZoneIdentifiers"]
    for key in ("healthCheckType", "capacityRebalance", "forceDelete", "waitForCapacityTimeout",
                "ignoreFailedScalingActivities"):
        assert group.inputs[key] == worker.inputs[key], key
    assert group.delete_before_replace and group.ignore_changes == [] and master.ignore_changes == []
    # What is the role's: its tags (rank 0), the ssh group besides the cluster group, the master's profile,
    # and no first-boot user data (the workers' cluster key).
    tags = {t["resourceType"]: t["tags"] for t in master.inputs["tagSpecifications"]}
    worker_tags = {t["resourceType"]: t["tags"] for t in workers.inputs["tagSpecifications"]}
    assert (tags["instance"][ROLE_KEY], tags["instance"][RANK_KEY]) == (ROLE_MASTER, "0") and tags["volume"] == tags[
        "instance"]
    assert worker_tags["instance"][ROLE_KEY] == ROLE_WORKER
    assert {k: v for k, v in tags["instance"].items() if k not in (ROLE_KEY, RANK_KEY, "Name")} == {
        k: v for k, v in worker_tags["instance"].items() if k not in (ROLE_KEY, "Name")}
    if master.inputs.get("networkInterfaces"):
        (ours,), (theirs,) = master.inputs["networkInterfaces"], workers.inputs["networkInterfaces"]
        assert ours["associatePublicIpAddress"] == theirs["associatePublicIpAddress"] == "true"
        ours_groups, their_groups = ours["securityGroups"], theirs["securityGroups"]
    else:
        assert not workers.inputs.get("networkInterfaces")
        ours_groups, their_groups = master.inputs["vpcSecurityGroupIds"], workers.inputs["vpcSecurityGroupIds"]
    assert set(their_groups) < set(ours_groups) and len(ours_groups) == 2
    assert master.inputs["iamInstanceProfile"] != workers.inputs["iamInstanceProfile"]
    assert master.inputs["iamInstanceProfile"]["name"].startswith("xeon-dev-node-master")
    assert master.inputs["userData"] != workers.inputs["userData"]  # each role's own boot (below)
    assert master.inputs["instanceMarketOptions"] == workers.inputs["instanceMarketOptions"]  # both spot by default
    assert group.replacement_trigger["template"]["instance_type"] == worker.replacement_trigger["template"][
        "instance_type"]


@pytest.mark.parametrize("master_spot, worker_spot", [(False, True), (True, False), (False, False)])
def test_each_group_s_market_is_its_own_setting(harness, master_spot, worker_spot):
    harness.run(minimal_config(masterSpot=master_spot, workerSpot=worker_spot))
    master, workers = master_template(harness.monitor), worker_template(harness.monitor)
    assert bool(master.inputs.get("instanceMarketOptions")) is master_spot
    assert bool(workers.inputs.get("instanceMarketOptions")) is worker_spot
    assert master_group(harness.monitor).replacement_trigger["market"] == ("spot" if master_spot else "on-demand")


def test_with_instance_types_the_master_takes_the_first_with_its_own_market_and_no_policy(harness):
    harness.run(minimal_config(instanceTypes=["m7i.48xlarge", "c7i.48xlarge"], masterSpot=False))
    group, master = master_group(harness.monitor), master_template(harness.monitor)
    assert group.inputs.get("launchTemplate") and not group.inputs.get("mixedInstancesPolicy")
    assert master.inputs["instanceType"] == "m7i.48xlarge" and not master.inputs.get("instanceMarketOptions")
    assert worker_group(harness.monitor).inputs.get("mixedInstancesPolicy")



def test_a_master_group_that_cannot_be_filled_names_the_master_and_masterspot(harness, monkeypatch, caplog):
    """The master group's error hook as the program binds it: AWS's reason in one line, naming the master and
    the setting of its market (not the workers')."""
    import asyncio
    import logging

    import pulumi

    hooks, real = {}, pulumi.ErrorHook

    def kept(name, func):  # the engine's hook as the program builds it, its callback kept to run here
        hooks[name] = func
        return real(name, func)

    monkeypatch.setattr(pulumi, "ErrorHook", kept)
    harness.run(minimal_config())
    (hook,) = master_group(harness.monitor).error_hooks
    error = ("creating Auto Scaling Group (xeon-dev-master-5a6b7c): waiting for capacity satisfied: scaling activity "
             "(0f1e-77aa): Failed: Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot "
             "capacity available that matches your request.")
    args = pulumi.ErrorHookArgs(urn="urn", id="", name="xeon-dev-master", type="aws:autoscaling/group:Group",
                                failed_operation="create", new_inputs={}, errors=[error])
    caplog.set_level(logging.INFO)
    assert asyncio.run(hooks[hook](args)) is False  # never retried: the group keeps trying
    line = caplog.records[-1].getMessage()
    assert line.startswith("xeon-dev-master: AWS could not launch the 1 master of the group: Could not launch Spot")
    assert "masterSpot: false" in line and "workerSpot" not in line and "\n" not in line


def test_the_master_boots_the_run_continuing_step_with_this_controller_s_run_spec_key(controller_config):
    """The master's user data is its boot script (a lost master's supervised run continued by the new one), which
    verifies a spec only with the controller's run-spec public key; the private half is in no input; a new key
    pair makes a new template version and replaces neither group."""
    monitor, _ = fresh_run(minimal_config())
    public = (controller_config / "xeon-cluster" / KEY_STORE_DIR / f"{SPEC_KEY_FILE}.pub").read_text().split()
    script = base64.b64decode(master_template(monitor).inputs["userData"]).decode()
    assert script.startswith("#!/bin/sh\n") and "-m node_setup.supervisor.boot" in script
    assert f"SIGNER='{public[0]} {public[1]}'\n" in script and "KIND=aws\n" in script, script
    private = (controller_config / "xeon-cluster" / KEY_STORE_DIR / SPEC_KEY_FILE).read_text().splitlines()[1]
    assert private not in repr([r.inputs for r in monitor.registrations])
    groups = master_group(monitor).replacement_trigger, worker_group(monitor).replacement_trigger
    keys.rotate_spec_key()
    again, _ = fresh_run(minimal_config())
    rotated = base64.b64decode(master_template(again).inputs["userData"]).decode()
    assert rotated != script and "-m node_setup.supervisor.boot" in rotated
    assert (master_group(again).replacement_trigger, worker_group(again).replacement_trigger) == groups
