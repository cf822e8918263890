"""What `pulumi up` would do on a real account after a change, as far as the program decides it.

The engine acts on the options the program registers (delete-before-replace, ignored changes,
replacement triggers, timeouts, error hooks); these tests check the options under Pulumi's mocks.
What the engine then does with them is Pulumi's part and is described, with sources, in
docs/aws-lifecycle.md.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging

import pulumi
import pytest

from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_MASTER, STACK_KEY
from infra import image as infra_image
from infra import node as infra_node
from infra import program as infra_program
from infra import setup_step
from infra.setup_step import METAL_SSH_TIMEOUT_SECONDS, SSH_TIMEOUT_SECONDS, ProfileSetupProvider
from tests.infra.conftest import (AMI, BASE_AMI, DEFAULT_SUBNETS, GROUP, INSTANCE, LAUNCH_TEMPLATE, PROJECT, SETUP,
                                  SETUP_STAMP, STACK, FakeAws, Harness, RecordingMonitor, fresh_run,
                                  minimal_config)

TAG = "aws:ec2/tag:Tag"


def run_with(**config):
    """(monitor, outputs) of a run with its own mocks, for comparing two configs."""
    return fresh_run(minimal_config(**config))


def nodes(monitor):
    return sorted(monitor.of_type(INSTANCE), key=lambda n: n.name)


def master(monitor):
    (found,) = [n for n in nodes(monitor) if n.inputs["tags"][ROLE_KEY] == ROLE_MASTER]
    return found


def workers(monitor):
    """The workers' launch template and group (there are no stand-alone worker instances)."""
    assert all(n.inputs["tags"][ROLE_KEY] == ROLE_MASTER for n in nodes(monitor))
    (template,), (group,) = monitor.of_type(LAUNCH_TEMPLATE), monitor.of_type(GROUP)
    return [template, group]


# ----------------------------------------------------- base image and subnet chosen once and kept


def test_master_keeps_the_looked_up_image_and_subnet_and_workers_follow_it(harness):
    outputs = harness.run(minimal_config(bake=False))
    monitor = harness.monitor
    first = master(monitor)
    assert sorted(first.ignore_changes) == ["ami", "subnetId"]
    template, group = workers(monitor)
    # They follow the master's outputs when made, and keep them: a new master does not replace them.
    assert template.ignore_changes == ["imageId"] and group.ignore_changes == ["vpcZoneIdentifiers"]
    assert template.inputs["imageId"] == first.state["ami"] == BASE_AMI
    assert group.inputs["vpcZoneIdentifiers"] == [first.state["subnetId"]] == [min(DEFAULT_SUBNETS)]
    # The kept choices are stack outputs: what the cluster really runs on.
    assert outputs["baseAmiId"] == BASE_AMI and outputs["subnetId"] == min(DEFAULT_SUBNETS)


def test_given_image_and_subnet_are_not_ignored_so_setting_them_moves_the_cluster(harness):
    harness.run(minimal_config(baseAmi="ami-0newer", subnetId="subnet-0chosen"))
    first = master(harness.monitor)
    assert first.ignore_changes == []
    assert (first.inputs["ami"], first.inputs["subnetId"]) == ("ami-0newer", "subnet-0chosen")


def test_the_base_image_lookup_asks_what_fab_preflight_asks(harness):
    """`fab preflight` dry-runs a launch from the image the program would pick: same owner, same filters."""
    from cluster.stack.images import BASE_IMAGE_FILTERS, CANONICAL_OWNER

    harness.run(minimal_config())
    (args,) = [a for token, a in harness.fake.calls
               if token == "aws:ec2/getAmiIds:getAmiIds" and a["owners"] != ["self"]]  # not the kept images'
    assert args["owners"] == [CANONICAL_OWNER]
    assert {f["name"]: f["values"] for f in args["filters"]} == {name: [value] for name, value in BASE_IMAGE_FILTERS}


def test_only_the_looked_up_one_is_kept():
    from infra.master import kept_on_update

    def spec(**cfg):
        return ClusterSpec.from_config(minimal_config(**cfg), stack="dev", region="us-east-1")

    assert kept_on_update(spec()) == ["ami", "subnetId"]
    assert kept_on_update(spec(baseAmi="ami-1")) == ["subnetId"]
    assert kept_on_update(spec(subnetId="subnet-1")) == ["ami"]


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
        # The spot options just vanish from the inputs (the provider shows no diff): the trigger changes.
        assert not after.inputs.get("instanceMarketOptions")
        assert before.replacement_trigger["market"] == "spot" and after.replacement_trigger["market"] == "on-demand"
    for before, after in zip(nodes(spot), nodes(bigger)):
        assert "instanceType" in after.replace_on_changes  # never an in-place stop/modify/start
        assert before.replacement_trigger != after.replacement_trigger
    again, _ = run_with()
    assert [n.replacement_trigger for n in nodes(spot)] == [n.replacement_trigger for n in nodes(again)]


# ------------------------------------------------ replacing the master never re-bakes


def test_a_master_replaced_for_a_setting_is_set_up_again_and_keeps_the_image_and_the_workers():
    """masterSpot replaces the master only. The setup step is not `deleted_with` the master: an engine that
    replaces a resource whose deletedWith target is replaced would replace the step, whose create makes the
    new master the image's source, so a new image and new workers."""
    before, _ = run_with()
    after, _ = run_with(masterSpot=False)
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    assert old_setup.deleted_with == new_setup.deleted_with == ""
    assert new_setup.inputs["cluster"] == "xeon-dev"  # names the known_hosts the host key is pinned in
    assert master(before).replacement_trigger != master(after).replacement_trigger  # the master is replaced
    olds = {**old_setup.inputs, **old_setup.state}
    news = {**new_setup.inputs, "instance_id": "i-0replacement"}  # the new master's id, known at the update
    assert ProfileSetupProvider().diff("id", olds, news).replaces == []  # updated: set up again, image kept
    (old_image,), (new_image,) = before.of_type(AMI), after.of_type(AMI)
    assert new_image.replacement_trigger == old_image.replacement_trigger
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


def test_image_create_timeout_and_name_from_the_setup_steps_stamp(harness):
    harness.run(minimal_config(rootVolumeGib=500))
    (image,) = harness.monitor.of_type(AMI)
    (setup,) = harness.monitor.of_type(SETUP)
    assert image.custom_timeouts["create"] == "500m"  # the provider's default is 40m
    assert infra_image.image_create_timeout(100) == "120m"
    # The name ends with the step's stamp (set by its create); not ignored, or a replacement would
    # be created under the old image's name (Pulumi applies ignore_changes to a replacement too).
    assert image.inputs["name"] == f"xeon-dev-stock-{setup.inputs['bake_tag']}-{SETUP_STAMP}"
    assert "name" not in (image.ignore_changes or [])
    assert image.replacement_trigger == setup.inputs["bake_tag"]
    spec = ClusterSpec.from_config(minimal_config(), stack="dev", region="us-east-1")
    first = infra_image.image_name(spec, "abc", setup_step.setup_stamp(dt.datetime(2026, 5, 1, 12, 0, 0,
                                                                                   tzinfo=dt.timezone.utc)))
    again = infra_image.image_name(spec, "abc", setup_step.setup_stamp(dt.datetime(2026, 5, 1, 12, 31, 5,
                                                                                   tzinfo=dt.timezone.utc)))
    assert first == "xeon-dev-stock-abc-20260501T120000Z" and again != first
    assert len(first) <= 128  # CreateImage's limit


def test_image_snapshot_is_tagged_for_the_sweep(harness):
    harness.run(minimal_config(tags=["team=ml"]))
    (image,) = harness.monitor.of_type(AMI)
    snapshot_tags = {t.inputs["key"]: t for t in harness.monitor.of_type(TAG)}
    assert snapshot_tags[MANAGED_BY_KEY].inputs["value"] == MANAGED_BY_VALUE
    assert snapshot_tags[CLUSTER_KEY].inputs["value"] == "xeon-dev"
    assert snapshot_tags[STACK_KEY].inputs["value"] == STACK
    assert snapshot_tags["team"].inputs["value"] == "ml"
    for tag in snapshot_tags.values():
        assert tag.inputs["resourceId"] == image.state["rootSnapshotId"]
        assert tag.deleted_with == image.urn  # the image's delete removes its snapshots


def test_no_image_no_snapshot_tags(harness):
    harness.run(minimal_config(bake=False))
    assert not harness.monitor.of_type(TAG) and not harness.monitor.of_type(AMI)


# ---------------------------------------------------------------------- capacity errors on launch


CAPACITY = ("creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, "
            "api error InsufficientInstanceCapacity: There is no Spot capacity available that matches your request.")


def test_every_node_launch_has_the_capacity_retry_hook(harness):
    harness.run(minimal_config())
    for node in nodes(harness.monitor):
        assert node.error_hooks == ["xeon-cluster-capacity-retry"], node.name


def test_capacity_errors_are_retried_a_few_times_then_given_up():
    delays = (1, 2, 3)
    assert infra_node.capacity_retry_delay([CAPACITY], delays) == 1
    assert infra_node.capacity_retry_delay([CAPACITY] * 3, delays) == 3
    assert infra_node.capacity_retry_delay([CAPACITY] * 4, delays) is None
    assert infra_node.capacity_retry_delay(["api error InvalidAMIID.NotFound"], delays) is None
    assert infra_node.capacity_retry_delay([], delays) is None


def _hook_args(errors, operation="create", name="xeon-dev-worker-2"):
    return pulumi.ErrorHookArgs(urn="urn", id="", name=name, type=INSTANCE, failed_operation=operation,
                                new_inputs={"instanceType": "r7iz.metal-16xl",
                                            "instanceMarketOptions": {"marketType": "spot"}},
                                errors=errors)


def test_capacity_hook_waits_retries_and_finally_says_what_to_change(monkeypatch, caplog):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    # Building the hook registers it with the engine; here only its callback is exercised.
    monkeypatch.setattr(pulumi, "ErrorHook", lambda name, func: func)
    on_error = infra_node.capacity_retry_hook("test-hook", delays=(5, 7), sleep=sleep)
    caplog.set_level(logging.INFO)
    assert asyncio.run(on_error(_hook_args([CAPACITY]))) is True
    assert asyncio.run(on_error(_hook_args([CAPACITY, CAPACITY]))) is True
    assert slept == [5, 7]
    assert asyncio.run(on_error(_hook_args([CAPACITY] * 3))) is False
    final = caplog.records[-1].getMessage()
    assert final.startswith("xeon-dev-worker-2: AWS has no spot capacity for r7iz.metal-16xl")
    assert "workerSpot: false" in final and "subnetId" in final and "fab preflight" in final
    assert "masterSpot: false" in infra_node.capacity_message("xeon-dev-master", {}, 1)
    # Not a capacity error, or not a create: not retried.
    assert asyncio.run(on_error(_hook_args(["api error UnauthorizedOperation"]))) is False
    assert asyncio.run(on_error(_hook_args([CAPACITY], operation="delete"))) is False
    assert slept == [5, 7]


def test_an_older_cli_gets_warnings_and_no_hook(harness, monkeypatch, caplog):
    monkeypatch.setattr(infra_program, "engine_supports", lambda feature: False)
    caplog.set_level(logging.WARNING)
    harness.run(minimal_config())
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "ignores the replacementTrigger option" in messages and "no error hooks" in messages
    assert all(node.error_hooks == [] for node in nodes(harness.monitor))


# ------------------------------------------------ a lost master costs its setup, not a re-bake


class _LaterDay(FakeAws):
    """Test double of the account on the day the master is replaced: a newer base image, another first
    default subnet, and the new master's own instance id."""

    def call(self, args):
        found = super().call(args)
        if args.token == "aws:ec2/getAmiIds:getAmiIds" and args.args.get("owners") != ["self"]:
            return {**found, "ids": ["ami-0newer", *found["ids"]]}
        if args.token == "aws:ec2/getSubnets:getSubnets":
            return {**found, "ids": ["subnet-0000", *found["ids"]]}
        return found

    def new_resource(self, args):
        rid, state = super().new_resource(args)
        return (f"{rid}-replaced", state) if args.typ == INSTANCE and args.name.endswith("-master") else (rid, state)


def _later_run(config):
    fake = _LaterDay()
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project=PROJECT, stack=STACK, preview=False, monitor=monitor)
    Harness(fake, monitor).run(config)
    return monitor


def _kept(reg) -> dict:
    """The inputs the engine compares (ignored ones take the state's value)."""
    return {k: v for k, v in reg.inputs.items() if k not in reg.ignore_changes}


def test_a_replaced_master_is_set_up_again_and_replaces_neither_the_image_nor_the_workers(monkeypatch):
    before, _ = fresh_run(minimal_config())
    after = _later_run(minimal_config())
    assert master(after).id != master(before).id and master(after).inputs["ami"] == "ami-0newer"

    # The setup step: updated (not replaced), which sets the new master up again with the same pins
    # and keeps the image's source.
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    olds = {**old_setup.inputs, **old_setup.state}
    diff = ProfileSetupProvider().diff("id", olds, new_setup.inputs)
    assert diff.changes and diff.replaces == []
    ran = []
    monkeypatch.setattr(setup_step, "run_profile_setup", lambda props, **seams: ran.append(props) or dict(props))
    updated = ProfileSetupProvider().update("id", olds, new_setup.inputs).outs
    assert [p["instance_id"] for p in ran] == [master(after).id] and ran[0]["pip_pins"] == olds["pip_pins"]
    assert updated["bake_source"] == master(before).id
    assert updated["baked"] == olds["baked"]  # what the image holds: the old master's base, not the new one's

    # The image: same trigger, and its only changed inputs are its source and its tags of what it holds, which
    # come from the step's bake_source and baked (kept by the update above); nothing else would replace it.
    (old_image,), (new_image,) = before.of_type(AMI), after.of_type(AMI)
    assert new_image.replacement_trigger == old_image.replacement_trigger
    assert new_image.inputs["sourceInstanceId"] == new_setup.state["bake_source"]  # from the step, not the master
    assert new_image.inputs["tags"].items() >= new_setup.state["baked"].items()
    from_step = ("sourceInstanceId", "tags")
    assert ({k: v for k, v in _kept(new_image).items() if k not in from_step}
            == {k: v for k, v in _kept(old_image).items() if k not in from_step})
    assert new_setup.urn in new_image.dependencies and master(after).urn not in new_image.dependencies

    # The workers: neither the launch template (same image, no new version) nor the group (the master's
    # new subnet is ignored, same trigger) changes, so the group keeps its instances.
    (old_template, old_group), (new_template, new_group) = workers(before), workers(after)
    assert _kept(new_template) == _kept(old_template) and new_template.inputs["imageId"] == old_image.id
    assert _kept(new_group) == _kept(old_group)
    assert new_group.replacement_trigger == old_group.replacement_trigger
    assert new_group.ignore_changes == ["vpcZoneIdentifiers"]
    assert new_group.inputs["vpcZoneIdentifiers"] != old_group.inputs["vpcZoneIdentifiers"]  # ignored, as it must be
