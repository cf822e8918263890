"""What `pulumi up` would do on a real account after a change, as far as the program decides it.

The engine acts on the options the program registers (delete-before-replace, ignored changes,
replacement triggers, timeouts, error hooks); these tests check the options under Pulumi's mocks.
What the engine then does with them is Pulumi's part and is described, with sources, in
docs/aws-lifecycle.md.
"""

from __future__ import annotations

import asyncio
import logging

import pulumi
import pytest

from cluster.stack.spec import ClusterSpec
from cluster.node import profiles
from cluster.stack import image_build, image_reuse
from cluster.stack.node_replacement import bake_tag
from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, STACK_KEY,
                                USED_BY_PREFIX)
from infra import image as infra_image
from infra import program as infra_program
from infra import setup_step
from infra.setup_step import METAL_SSH_TIMEOUT_SECONDS, SSH_TIMEOUT_SECONDS, ProfileSetupProvider
from tests.infra.conftest import (BASE_AMI, BUILT, COMPONENT, DEFAULT_SUBNETS, DISTRIBUTION, INSTANCES, RECIPE,
                                  SETUP, STACK, FakeAws, fresh_run, master_group, master_template, minimal_config,
                                  worker_group, worker_template)

TAG = "aws:ec2/tag:Tag"


def run_with(**config):
    """(monitor, outputs) of a run with its own mocks, for comparing two configs."""
    return fresh_run(minimal_config(**config))


def nodes(monitor):
    """The two groups, the master's and the workers' (no node is a stand-alone instance)."""
    assert not monitor.of_type("aws:ec2/instance:Instance")
    return [master_group(monitor), worker_group(monitor)]


def master(monitor):
    return master_group(monitor)


def workers(monitor):
    """The workers' launch template and group."""
    return [worker_template(monitor), worker_group(monitor)]


# ----------------------------------------------------- base image and subnet chosen once and kept


class _LaterDay(FakeAws):
    """Test double of the account on a later day: a newer base image, another first default subnet, and the
    master's group running another instance (AWS replaced a lost master)."""

    def __init__(self, **kwargs):
        super().__init__(subnets=["subnet-0000", *DEFAULT_SUBNETS], **kwargs)

    def call(self, args):
        found = super().call(args)
        if args.token == "aws:ec2/getAmiIds:getAmiIds" and args.args.get("owners") != ["self"]:
            return {**found, "ids": ["ami-0newer", *found["ids"]]}
        if args.token == INSTANCES and found["ids"]:
            return {**found, "ids": [f"{i}-replaced" for i in found["ids"]]}
        return found


def _images(monitor) -> list[str]:
    return [master_template(monitor).inputs["imageId"], worker_template(monitor).inputs["imageId"]]


def _subnets(monitor) -> list[list[str]]:
    return [g.inputs["vpcZoneIdentifiers"] for g in nodes(monitor)]


def test_master_and_workers_keep_the_first_lookups_subnet_and_base_image_on_a_later_up():
    stack: dict = {}
    before, first = fresh_run(minimal_config(bake=False), FakeAws(stashes=stack))
    after, later = fresh_run(minimal_config(bake=False), _LaterDay(stashes=stack))
    # One decision for both groups, kept: today's other subnet and newer image move nothing.
    assert _subnets(before) == _subnets(after) == [[min(DEFAULT_SUBNETS)]] * 2
    assert _images(before) == _images(after) == [BASE_AMI] * 2
    assert [g.replacement_trigger for g in nodes(after)] == [g.replacement_trigger for g in nodes(before)]
    # Kept by the stack, not by ignoring changes: every input of a node is what the engine compares.
    for reg in nodes(after) + [master_template(after), worker_template(after)]:
        assert reg.ignore_changes == [], reg.name
    # The kept choices are stack outputs: what the cluster really runs on.
    assert (first["baseAmiId"], first["subnetId"]) == (later["baseAmiId"], later["subnetId"]) == (
        BASE_AMI, min(DEFAULT_SUBNETS))


@pytest.mark.parametrize("setting, value", [("subnetId", "subnet-0chosen"), ("baseAmi", "ami-0chosen")])
def test_setting_the_subnet_or_the_base_image_moves_both_groups(setting, value):
    stack: dict = {}
    before, _ = fresh_run(minimal_config(bake=False), FakeAws(stashes=stack))
    after, outputs = fresh_run(minimal_config(bake=False, **{setting: value}), FakeAws(stashes=stack))
    moved = _subnets(after) if setting == "subnetId" else _images(after)
    assert moved == ([[value]] * 2 if setting == "subnetId" else [value] * 2)
    assert outputs["subnetId" if setting == "subnetId" else "baseAmiId"] == value
    for old, new in zip(nodes(before), nodes(after)):  # both replaced, deleting first
        assert new.replacement_trigger != old.replacement_trigger and new.delete_before_replace, new.name
    # Set back to unset: the stash is decided again by the lookup (the trigger changed again).
    again, _ = fresh_run(minimal_config(bake=False), FakeAws(stashes=stack))
    assert _subnets(again) == [[min(DEFAULT_SUBNETS)]] * 2 and _images(again) == [BASE_AMI] * 2


def test_the_built_image_keeps_the_looked_up_base_and_every_node_follows_the_image():
    stack: dict = {}
    before, _ = fresh_run(minimal_config(), FakeAws(stashes=stack))
    after, _ = fresh_run(minimal_config(), _LaterDay(stashes=stack))
    (old_recipe,), (new_recipe,) = before.of_type(RECIPE), after.of_type(RECIPE)
    assert old_recipe.inputs["parentImage"] == new_recipe.inputs["parentImage"] == BASE_AMI
    assert new_recipe.ignore_changes == []
    assert _images(after) == _images(before) == [after.of_type(BUILT)[0].state["outputResources"][0]["amis"][0][
        "image"]] * 2


def test_a_given_base_image_is_the_recipe_s_parent(harness):
    harness.run(minimal_config(baseAmi="ami-0newer", subnetId="subnet-0chosen"))
    (recipe,), (built,) = harness.monitor.of_type(RECIPE), harness.monitor.of_type(BUILT)
    assert recipe.inputs["parentImage"] == "ami-0newer"  # the image is built from it, and every node boots that
    assert _images(harness.monitor) == [built.state["outputResources"][0]["amis"][0]["image"]] * 2
    assert _subnets(harness.monitor) == [["subnet-0chosen"]] * 2


def test_the_base_image_lookup_asks_what_fab_preflight_asks(harness):
    """`fab preflight` dry-runs a launch from the image the program would pick: same owner, same filters."""
    from cluster.stack.images import BASE_IMAGE_FILTERS, CANONICAL_OWNER

    harness.run(minimal_config())
    (args,) = [a for token, a in harness.fake.calls
               if token == "aws:ec2/getAmiIds:getAmiIds" and a["owners"] != ["self"]]  # not the kept images'
    assert args["owners"] == [CANONICAL_OWNER]
    assert {f["name"]: f["values"] for f in args["filters"]} == {name: [value] for name, value in BASE_IMAGE_FILTERS}


# ---------------------------------- replacements delete first; market and instance type force one


@pytest.mark.parametrize("config", [{}, {"bake": False}, {"masterSpot": False}], ids=["baked", "no bake", "on-demand"])
def test_every_node_is_deleted_before_its_replacement(harness, config):
    harness.run(minimal_config(**config))
    for node in nodes(harness.monitor):
        assert node.delete_before_replace, node.name
        assert node.custom_timeouts["create"] == node.custom_timeouts["delete"] == "40m"


def test_market_and_instance_type_force_a_replacement():
    spot, _ = run_with()
    on_demand, _ = run_with(masterSpot=False, workerSpot=False)
    bigger, _ = run_with(instanceType="r7iz.metal-32xl")
    for before, after in zip(nodes(spot), nodes(on_demand)):
        assert before.name == after.name
        # The spot options just vanish from the template (the provider shows no diff): the trigger changes.
        assert not after.replacement_trigger["template"].get("instance_market_options")
        assert before.replacement_trigger["market"] == "spot" and after.replacement_trigger["market"] == "on-demand"
    for before, after in zip(nodes(spot), nodes(bigger)):  # never an in-place change of the type
        assert before.replacement_trigger != after.replacement_trigger
        assert after.replacement_trigger["instanceType"] == "r7iz.metal-32xl"
    again, _ = run_with()
    assert [n.replacement_trigger for n in nodes(spot)] == [n.replacement_trigger for n in nodes(again)]


# ------------------------------------------------ replacing the master never re-bakes


def test_a_master_replaced_for_a_setting_is_set_up_again_and_keeps_the_image_and_the_workers():
    """masterSpot replaces the master only. The setup step is not `deleted_with` the master: an engine that
    replaces a resource whose deletedWith target is replaced would replace the step, whose create does not arm
    the new master's idle auto-stop; the image and the workers stay either way."""
    before, _ = run_with()
    after, _ = run_with(masterSpot=False)
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    assert old_setup.deleted_with == new_setup.deleted_with == ""
    assert new_setup.inputs["cluster"] == "xeon-dev"  # names the known_hosts the host key is pinned in
    assert master(before).replacement_trigger != master(after).replacement_trigger  # the master is replaced
    olds = {**old_setup.inputs, **old_setup.state}
    news = {**new_setup.inputs, "instance_id": "i-0replacement"}  # the new master's id, known at the update
    assert ProfileSetupProvider().diff("id", olds, news).replaces == []  # updated: set up again, image kept
    (old_image,), (new_image,) = before.of_type(BUILT), after.of_type(BUILT)
    assert new_image.replacement_trigger == old_image.replacement_trigger and new_image.state == old_image.state
    (_, old_group), (_, new_group) = workers(before), workers(after)
    assert new_group.replacement_trigger == old_group.replacement_trigger


@pytest.mark.parametrize("itype, seconds", [("r7iz.metal-16xl", METAL_SSH_TIMEOUT_SECONDS),
                                            ("c6i.16xlarge", SSH_TIMEOUT_SECONDS)])
def test_setup_step_waits_longer_for_a_metal_master(harness, itype, seconds):
    harness.run(minimal_config(instanceType=itype))
    (setup,) = harness.monitor.of_type(SETUP)
    assert setup.inputs["ssh_timeout_seconds"] == seconds
    assert METAL_SSH_TIMEOUT_SECONDS >= 2400  # "over 20 minutes" to start, per the comment's source


# -------------------------------------------------------------------------------------- the image


def test_the_build_is_named_after_the_bake_tag_waits_long_enough_and_reports_its_failure(harness):
    harness.run(minimal_config(rootVolumeGib=500))
    monitor = harness.monitor
    (image,), (setup,), (recipe,) = monitor.of_type(BUILT), monitor.of_type(SETUP), monitor.of_type(RECIPE)
    (component,), (distribution,) = monitor.of_type(COMPONENT), monitor.of_type(DISTRIBUTION)
    label = f"xeon-dev-stock-{bake_tag(setup.inputs['fingerprint'])}"
    assert recipe.inputs["name"] == component.inputs["name"] == distribution.inputs["name"] == label
    assert image.replacement_trigger == bake_tag(setup.inputs["fingerprint"]) and not image.delete_before_replace
    assert image.custom_timeouts["create"] == image_build.BUILD_TIMEOUT
    # Each build's image has a name of its own (its build date), so an old one and a new one live side by side.
    (where,) = distribution.inputs["distributions"]
    assert where["amiDistributionConfiguration"]["name"] == f"{label}-{{{{ imagebuilder:buildDate }}}}"
    # The build volume is the profile's smallest root volume: a node's launch grows it to rootVolumeGib.
    (device,) = recipe.inputs["blockDeviceMappings"]
    assert device["ebs"]["volumeSize"] == profiles.PROFILES["stock"].min_root_volume_gib
    assert device["ebs"]["encrypted"] == "true"
    assert image.error_hooks == ["xeon-dev-image-build-reason"]


def test_a_failed_build_is_one_line_with_image_builders_reason_and_its_logs():
    error = ("creating Image Builder Image: waiting for Image Builder Image (arn:aws:imagebuilder:us-east-1:1:image/x/"
             "1.0.0/1) create: unexpected state 'FAILED', wanted target 'AVAILABLE'. last error: Image build failed: "
             "Step 'Install' of component 'xeon-dev-stock-abc' failed: exit code 12\nmore")
    line = image_build.failure_line("xeon-dev-image", error, "s3://bucket/image-builder/logs/")
    assert "Step 'Install' of component 'xeon-dev-stock-abc' failed: exit code 12" in line and "\n" not in line
    assert "s3://bucket/image-builder/logs/" in line and "unexpected state" not in line


def test_the_image_is_tagged_with_what_it_holds_and_the_stacks_use_of_it(harness):
    harness.run(minimal_config(tags=["team=ml"]))
    monitor = harness.monitor
    (distribution,), (built,) = monitor.of_type(DISTRIBUTION), monitor.of_type(BUILT)
    (where,) = distribution.inputs["distributions"]
    tags = where["amiDistributionConfiguration"]["amiTags"]
    assert (tags[MANAGED_BY_KEY], tags[CLUSTER_KEY], tags[STACK_KEY], tags["team"]) == (
        MANAGED_BY_VALUE, "xeon-dev", STACK, "ml")
    spec = ClusterSpec.from_config(minimal_config(), stack=STACK, region="us-east-1")
    assert tags.items() >= image_reuse.bake_identity(spec, BASE_AMI).items()
    (use,) = monitor.of_type(TAG)
    assert use.inputs == {"resourceId": built.state["outputResources"][0]["amis"][0]["image"],
                          "key": f"{USED_BY_PREFIX}xeon-dev", "value": STACK}


def test_no_image_no_snapshot_tags(harness):
    harness.run(minimal_config(bake=False))
    assert not harness.monitor.of_type(TAG) and not harness.monitor.of_type(BUILT)


# ---------------------------------------------------------------------- a group that cannot launch


def test_each_group_has_its_one_line_failure_hook(harness):
    harness.run(minimal_config())
    for group in nodes(harness.monitor):
        assert group.error_hooks == [f"{group.name}-capacity-reason"], group.name


def test_an_older_cli_gets_warnings_and_no_hook(harness, monkeypatch, caplog):
    monkeypatch.setattr(infra_program, "engine_supports", lambda feature: False)
    caplog.set_level(logging.WARNING)
    harness.run(minimal_config())
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "ignores the replacementTrigger option" in messages and "no error hooks" in messages
    assert all(node.error_hooks == [] for node in nodes(harness.monitor))


# ------------------------------------------------ a lost master costs its setup, not a re-bake


def test_a_master_the_group_replaced_is_set_up_again_and_replaces_neither_the_image_nor_the_workers(monkeypatch):
    stack: dict = {}
    before, old = fresh_run(minimal_config(), FakeAws(stashes=stack))
    after, new = fresh_run(minimal_config(), _LaterDay(stashes=stack))
    assert new["masterInstanceId"] == f"{old['masterInstanceId']}-replaced"  # the group's new instance

    # The setup step: updated (not replaced), which checks the new master as `fab check` does (the image it
    # booted holds the profile) and installs only what differs, with the same pins; it images nothing.
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    olds = {**old_setup.inputs, **old_setup.state}
    diff = ProfileSetupProvider().diff("id", olds, new_setup.inputs)
    assert diff.changes and diff.replaces == []
    ran = []
    monkeypatch.setattr(setup_step, "run_profile_setup", lambda props, **seams: ran.append(props) or dict(props))
    updated = ProfileSetupProvider().update("id", olds, new_setup.inputs).outs
    assert [p["instance_id"] for p in ran] == [new["masterInstanceId"]] and ran[0]["pip_pins"] == olds["pip_pins"]
    assert updated["kept_image"] == olds["kept_image"]

    # The image: a newer Ubuntu image found today builds nothing (the recipe's base is the kept one).
    (old_recipe,), (new_recipe,) = before.of_type(RECIPE), after.of_type(RECIPE)
    assert new_recipe.inputs == old_recipe.inputs
    assert after.of_type(COMPONENT)[0].inputs == before.of_type(COMPONENT)[0].inputs
    assert after.of_type(BUILT)[0].replacement_trigger == before.of_type(BUILT)[0].replacement_trigger

    # Neither group changes: the kept subnet, the same image.
    for old_group, new_group in zip(nodes(before), nodes(after)):
        assert new_group.inputs["vpcZoneIdentifiers"] == old_group.inputs["vpcZoneIdentifiers"]
        assert new_group.replacement_trigger == old_group.replacement_trigger


def test_a_failed_build_is_logged_with_image_builders_reason_and_where_its_logs_are(monkeypatch, caplog, capsys):
    # Building the hook registers it with the engine; here only its callback is exercised.
    monkeypatch.setattr(pulumi, "ErrorHook", lambda name, func: func)
    on_error = infra_image.build_failure_hook("xeon-dev-image", "s3://bucket-0a1b/image-builder/logs/")
    caplog.set_level(logging.INFO)
    error = "waiting for Image Builder Image create: unexpected state 'FAILED'. last error: Image build failed: x"
    args = pulumi.ErrorHookArgs(urn="urn", id="", name="xeon-dev-image", type=BUILT, failed_operation="create",
                                new_inputs={}, errors=[error])
    assert asyncio.run(on_error(args)) is False  # never retried: a build that failed fails the same way
    # pulumi.log goes to logging with an engine (mocks) set up in this process, else to stderr
    said = " ".join(r.getMessage() for r in caplog.records) + capsys.readouterr().err
    assert image_build.failure_line("xeon-dev-image", error, "s3://bucket-0a1b/image-builder/logs/") in said
