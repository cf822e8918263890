"""The workers as one Auto Scaling group under the Pulumi mocks: the launch template and the group with
every property the workers need, a new image that never runs more than `workerCount` workers, and the
one line a group that cannot be filled ends with (the master's permission on the group:
tests/infra/test_node_roles.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pulumi
import pytest

from cluster.node import profiles
from cluster.stack import node_replacement
from cluster.stack import worker_group as rules
from infra import node_group as infra_groups
from infra.image import ImageReleaseProvider
from tests.infra.conftest import (BUILT, GROUP, RELEASE, fresh_run, master_template, minimal_config, worker_group,
                                  worker_template)


def template_and_group(monitor):
    template, group = worker_template(monitor), worker_group(monitor)
    return template, group


@pytest.mark.parametrize("config", [{}, {"workerSpot": False, "workerCount": 5}, {"bake": False}],
                         ids=["spot", "on-demand", "no bake"])
def test_workers_are_one_group_of_the_launch_template_and_never_stand_alone_instances(harness, config):
    harness.run(minimal_config(**config))
    monitor = harness.monitor
    template, group = template_and_group(monitor)
    count = config.get("workerCount", 3)
    assert not monitor.of_type("aws:ec2/instance:Instance")  # no stand-alone instance, the master's neither
    assert group.inputs["minSize"] == group.inputs["maxSize"] == group.inputs["desiredCapacity"] == count
    # the template's latest version
    assert group.inputs["launchTemplate"] == {"id": template.id, "version": str(template.state["latestVersion"])}
    assert template.urn in group.dependencies
    assert template.inputs["instanceInitiatedShutdownBehavior"] == "terminate"
    assert template.inputs["updateDefaultVersion"] is True
    market = template.inputs.get("instanceMarketOptions")
    assert bool(market) is config.get("workerSpot", True)
    # `pulumi up` waits for the instances in service, through failed launches (the group keeps trying them).
    assert group.inputs["waitForCapacityTimeout"] == infra_groups.CAPACITY_TIMEOUT == "40m"
    assert group.inputs["ignoreFailedScalingActivities"] is True
    # Nothing launches a worker beyond the count: no capacity rebalance, no instance refresh, no warm pool.
    assert group.inputs["capacityRebalance"] is False
    assert not group.inputs.get("instanceRefresh") and not group.inputs.get("warmPool")
    assert group.inputs["healthCheckType"] == "EC2"


def built_ami(monitor) -> str:
    (image,) = monitor.of_type(BUILT)
    return image.state["outputResources"][0]["amis"][0]["image"]


def _bumped_pin(monkeypatch):
    stock = profiles.PROFILES["stock"]
    monkeypatch.setitem(profiles.PROFILES, "stock", dataclasses.replace(
        stock, pip_pins=tuple(p.replace("transformers==5.23.0", "transformers==5.24.0") for p in stock.pip_pins)))


def test_a_new_image_replaces_the_group_deleting_first_so_never_more_than_worker_count_run(monkeypatch):
    before, _ = fresh_run(minimal_config(workerCount=4))
    _bumped_pin(monkeypatch)
    after, _ = fresh_run(minimal_config(workerCount=4))
    old_image, new_image = built_ami(before), built_ami(after)
    assert new_image != old_image  # a new build
    (_, old_group), (new_template, new_group) = template_and_group(before), template_and_group(after)
    assert new_template.inputs["imageId"] == new_image
    # The group is replaced (its trigger names the image), and the old one is deleted before the new one is
    # made: deleting without force_delete drains it (capacity 0, every old worker terminated) first.
    assert new_group.replacement_trigger != old_group.replacement_trigger
    assert new_group.replacement_trigger["image"] == new_image
    assert new_group.delete_before_replace and new_group.inputs["forceDelete"] is False
    assert new_group.custom_timeouts["delete"] == "40m"
    # Each group alone never holds more than workerCount: so at most 4 workers bill at any time.
    assert new_group.inputs["maxSize"] == old_group.inputs["maxSize"] == 4
    # The same settings make the same trigger: nothing else replaces the workers.
    again, _ = fresh_run(minimal_config(workerCount=4))
    assert template_and_group(again)[1].replacement_trigger == new_group.replacement_trigger


def test_the_group_moves_to_a_new_image_before_the_old_one_is_deregistered(monkeypatch):
    """A software change builds the new image before the old one goes: neither the image nor its release record
    (whose delete deregisters the old AMI) is delete-first, so the engine builds the new image, moves the template
    to it, replaces the group (delete-first: it drains, then launches the new workers from the new image), and
    deletes the old image's record last. The master follows the image too (it is replaced, deleting first)."""
    before, _ = fresh_run(minimal_config())
    _bumped_pin(monkeypatch)
    after, _ = fresh_run(minimal_config())
    (old_image,), (new_image,) = before.of_type(BUILT), after.of_type(BUILT)
    (old_release,), (new_release,) = before.of_type(RELEASE), after.of_type(RELEASE)
    assert new_image.replacement_trigger != old_image.replacement_trigger  # a new build
    assert not new_image.delete_before_replace and not new_release.delete_before_replace
    diff = ImageReleaseProvider().diff("id", old_release.inputs, new_release.inputs)
    assert diff.replaces == ["image_id"] and diff.delete_before_replace is False
    assert new_release.inputs["image_id"] == built_ami(after) != built_ami(before)
    new_template, new_group = template_and_group(after)
    assert new_template.inputs["imageId"] == built_ami(after) == new_group.replacement_trigger["image"]
    assert new_group.delete_before_replace  # the old workers go before the new ones launch, from the new image


@pytest.mark.parametrize("change", [{"workerSpot": False}, {"instanceType": "r7iz.metal-32xl"}], ids=["market", "type"])
def test_market_and_instance_type_replace_the_group(change):
    before, _ = fresh_run(minimal_config())
    after, _ = fresh_run(minimal_config(**change))
    old, new = template_and_group(before)[1], template_and_group(after)[1]
    assert old.replacement_trigger != new.replacement_trigger and new.delete_before_replace


def test_given_image_and_subnet_are_not_ignored(harness):
    harness.run(minimal_config(baseAmi="ami-0mine", subnetId="subnet-0mine", bake=False))
    template, group = template_and_group(harness.monitor)
    assert template.ignore_changes == [] and group.ignore_changes == []
    assert template.inputs["imageId"] == "ami-0mine" and group.inputs["vpcZoneIdentifiers"] == ["subnet-0mine"]


# ----------------------------------------------------------- a group that cannot be filled


# The provider's error when a scaling activity failed while it waited for capacity (its wording).
PROVIDER_ERROR = ("creating Auto Scaling Group (xeon-dev-worker-5a6b7c): waiting for Auto Scaling Group "
                  "(xeon-dev-worker-5a6b7c) capacity satisfied: scaling activity (0f1e-77aa): Failed: Could not "
                  "launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that "
                  "matches your request. Launching EC2 instance failed.")
TIMEOUT_ERROR = ("creating Auto Scaling Group (xeon-dev-worker-5a6b7c): waiting for Auto Scaling Group capacity "
                 "satisfied: timeout while waiting for state to become 'ok' (last state: 'want exactly 3 healthy "
                 "instance(s) in Auto Scaling Group, have 1', timeout: 40m0s)")


def _args(errors, operation="create"):
    return pulumi.ErrorHookArgs(urn="urn", id="", name="xeon-dev-worker", type=GROUP, failed_operation=operation,
                                new_inputs={}, errors=errors)


def test_a_group_that_cannot_be_filled_ends_with_its_reason_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(pulumi, "ErrorHook", lambda name, func: func)
    on_error = infra_groups.group_failure_hook("xeon-dev-worker", 3)
    caplog.set_level(logging.INFO)
    assert asyncio.run(on_error(_args([PROVIDER_ERROR]))) is False  # never retried: the group keeps trying
    line = caplog.records[-1].getMessage()
    assert "\n" not in line and line.startswith("xeon-dev-worker: AWS could not launch the 3 worker(s) of the group: ")
    assert "InsufficientInstanceCapacity" in line and "workerSpot: false" in line and "placementGroup: false" in line
    assert asyncio.run(on_error(_args([TIMEOUT_ERROR]))) is False
    line = caplog.records[-1].getMessage()
    assert "not in service within 40m" in line and "keeps trying" in line and "billed" in line
    assert "`fab up` and `fab status` name the group's latest scaling activity" in line
    count = len(caplog.records)
    assert asyncio.run(on_error(_args([PROVIDER_ERROR], operation="delete"))) is False
    assert len(caplog.records) == count


@pytest.mark.parametrize("message, said", [
    ("You have requested more vCPU capacity than your current vCPU limit of 64 allows. VcpuLimitExceeded",
     "lower workerCount"),
    ("The placement group 'xeon-dev-pg' is in use in another availability zone", "placementGroup: false"),
    ("Your Spot request price of 0.1 is lower than the minimum required Spot request fulfillment "
     "price", "spotMaxPrice"),
    ("The image id '[ami-0gone]' does not exist", ""),
])
def test_each_kind_of_launch_failure_gets_its_advice(message, said):
    line = rules.failure_line("g", 2, message)
    assert message in line and (said in line if said else "; `fab preflight`" in line)


def test_only_the_newest_activity_is_the_reason():
    failed = {"StatusCode": "Failed", "StatusMessage": "InsufficientInstanceCapacity"}
    assert rules.latest_failure([failed, {"StatusCode": "Successful"}]) == "InsufficientInstanceCapacity"
    assert rules.latest_failure([{"StatusCode": "Successful"}, failed]) is None
    assert rules.latest_failure([]) is None
    assert rules.activity_failure("no activity here") is None


SHAPE_OF_THREE = ["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]


@pytest.mark.parametrize("spot", [True, False], ids=["spot", "on-demand"])
def test_three_types_of_one_shape_are_the_group_s_mixed_instances_in_the_stack_s_order(harness, spot):
    harness.run(minimal_config(instanceTypes=SHAPE_OF_THREE, workerSpot=spot, spotMaxPrice="3.5"))
    template, group = template_and_group(harness.monitor)
    assert not group.inputs.get("launchTemplate")  # the policy's template instead
    policy = group.inputs["mixedInstancesPolicy"]
    assert policy["launchTemplate"]["launchTemplateSpecification"] == {
        "launchTemplateId": template.id, "version": str(template.state["latestVersion"])}
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == SHAPE_OF_THREE
    assert policy["instancesDistribution"] == {
        "onDemandBaseCapacity": 0, "onDemandPercentageAboveBaseCapacity": 0 if spot else 100,
        "onDemandAllocationStrategy": "prioritized", "spotAllocationStrategy": "price-capacity-optimized",
        "spotMaxPrice": "3.5000" if spot else ""}
    # The template is the first type's, without spot options (AWS refuses them in a mixed instances policy).
    assert template.inputs["instanceType"] == "m7i.48xlarge" and not template.inputs.get("instanceMarketOptions")
    # The master takes the first type, in its own template (no policy: its group is of one).
    assert master_template(harness.monitor).inputs["instanceType"] == "m7i.48xlarge"


def test_another_list_of_types_replaces_the_group_and_one_type_keeps_its_trigger():
    one, _ = fresh_run(minimal_config(instanceType="m7i.48xlarge"))
    three, _ = fresh_run(minimal_config(instanceTypes=SHAPE_OF_THREE))
    reordered, _ = fresh_run(minimal_config(instanceTypes=SHAPE_OF_THREE[:1] + SHAPE_OF_THREE[:0:-1]))
    one_trigger = template_and_group(one)[1].replacement_trigger
    assert "instanceTypes" not in one_trigger  # a one-type stack's group is not replaced by this program
    assert template_and_group(three)[1].replacement_trigger["instanceTypes"] == SHAPE_OF_THREE
    assert template_and_group(reordered)[1].replacement_trigger != template_and_group(three)[1].replacement_trigger
    assert "instanceTypes" in node_replacement.WORKER_SETTINGS


def test_the_program_s_group_hook_names_the_types_the_group_goes_on_with_after_the_first_s_capacity_failure(
        harness, monkeypatch, caplog):
    """The group's error hook as the program binds it to a group of instanceTypes: the provider's failed scaling
    activity for the first type is said with the group's reason and the listed types it goes on with."""
    hooks, real = {}, pulumi.ErrorHook

    def kept(name, func):  # the engine's hook as the program builds it, its callback kept to run here
        hooks[name] = func
        return real(name, func)

    monkeypatch.setattr(pulumi, "ErrorHook", kept)
    harness.run(minimal_config(instanceTypes=SHAPE_OF_THREE))
    (hook,) = template_and_group(harness.monitor)[1].error_hooks
    refused = PROVIDER_ERROR.replace("your request.", "your request for m7i.48xlarge in us-east-1a.")
    caplog.set_level(logging.INFO)
    assert asyncio.run(hooks[hook](_args([refused]))) is False
    line = caplog.records[-1].getMessage()
    assert "of the group: Could not launch Spot Instances. InsufficientInstanceCapacity" in line, line
    assert "the group goes on with its other type(s), c7i.48xlarge, r7i.48xlarge (next: c7i.48xlarge" in line


def test_on_demand_fallback_gives_one_type_a_policy_whose_on_demand_base_is_left_to_fab_up(harness):
    harness.run(minimal_config(onDemandFallback="20m"))
    template, group = template_and_group(harness.monitor)
    policy = group.inputs["mixedInstancesPolicy"]
    assert [o["instanceType"] for o in policy["launchTemplate"]["overrides"]] == ["r7iz.metal-16xl"]
    assert policy["instancesDistribution"]["onDemandBaseCapacity"] == 0  # spot until fab up's fallback
    assert rules.FALLBACK_FIELD in group.ignore_changes and not template.inputs.get("instanceMarketOptions")
    # off (the default): the one launch template, spot in the template, nothing left to fab up
    again, _ = fresh_run(minimal_config())
    plain = template_and_group(again)[1]
    assert plain.inputs.get("launchTemplate") and not plain.inputs.get("mixedInstancesPolicy")
    assert rules.FALLBACK_FIELD not in plain.ignore_changes
