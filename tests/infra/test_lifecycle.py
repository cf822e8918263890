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
from cluster.stack.tags import (CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_MASTER, STACK_KEY,
                                USED_BY_PREFIX)
from infra import image as infra_image
from infra import node as infra_node
from infra import program as infra_program
from infra import setup_step
from infra.setup_step import METAL_SSH_TIMEOUT_SECONDS, SSH_TIMEOUT_SECONDS, ProfileSetupProvider
from tests.infra.conftest import (BASE_AMI, BUILT, COMPONENT, DEFAULT_SUBNETS, DISTRIBUTION, GROUP, INSTANCE,
                                  LAUNCH_TEMPLATE, PROJECT, RECIPE, SETUP, STACK, FakeAws, Harness, RecordingMonitor,
                                  fresh_run, minimal_config)

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
    (recipe,), (built,) = harness.monitor.of_type(RECIPE), harness.monitor.of_type(BUILT)
    assert first.ignore_changes == [] and recipe.ignore_changes == []
    assert recipe.inputs["parentImage"] == "ami-0newer"  # the image is built from it, and the master boots that
    assert (first.inputs["ami"], first.inputs["subnetId"]) == (built.state["outputResources"][0]["amis"][0]["image"],
                                                               "subnet-0chosen")


def test_the_built_image_keeps_the_looked_up_base_and_the_master_follows_the_image(harness):
    harness.run(minimal_config())
    (recipe,) = harness.monitor.of_type(RECIPE)
    assert recipe.ignore_changes == ["parentImage"] and recipe.inputs["parentImage"] == BASE_AMI
    assert master(harness.monitor).ignore_changes == ["subnetId"]


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

    assert kept_on_update(spec(bake=False)) == ["ami", "subnetId"]
    assert kept_on_update(spec()) == kept_on_update(spec(baseAmi="ami-1")) == ["subnetId"]  # it follows the image
    assert kept_on_update(spec(subnetId="subnet-1", bake=False)) == ["ami"]
    assert kept_on_update(spec(subnetId="subnet-1")) == []


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


def test_with_instance_types_the_master_s_last_capacity_error_names_the_next_listed_type(harness, monkeypatch,
                                                                                         caplog):
    """The master is one instance of the first listed type: when its launch retries are spent, the change of
    type to make is to list another first (the next one named), not instanceType, which the stack does not set."""
    hooks, real = {}, pulumi.ErrorHook

    def kept(name, func):  # the engine's hook as the program builds it, its callback kept to run here
        hooks[name] = func
        return real(name, func)

    monkeypatch.setattr(pulumi, "ErrorHook", kept)
    harness.run(minimal_config(instanceTypes=["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]))
    (master,) = nodes(harness.monitor)
    assert master.error_hooks == ["xeon-cluster-capacity-retry"]
    args = pulumi.ErrorHookArgs(urn="urn", id="", name=master.name, type=INSTANCE, failed_operation="create",
                                new_inputs=master.inputs, errors=[CAPACITY] * 4)  # past the three retries
    caplog.set_level(logging.INFO)
    assert asyncio.run(hooks["xeon-cluster-capacity-retry"](args)) is False
    final = caplog.records[-1].getMessage()
    assert final.startswith("xeon-dev-master: AWS has no spot capacity for m7i.48xlarge in this zone"), final
    assert ("placementGroup: false, list another type first in instanceTypes (the master takes the first; next: "
            "c7i.48xlarge); `fab preflight` checks the new settings") in final
    # one type: the type to change is instanceType
    assert "placementGroup: false, instanceType; " in infra_node.capacity_message("xeon-dev-master", {}, 4)


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
    assert master(after).id != master(before).id

    # The setup step: updated (not replaced), which checks the new master as `fab check` does (the image it
    # booted holds the profile) and installs only what differs, with the same pins; it images nothing.
    (old_setup,), (new_setup,) = before.of_type(SETUP), after.of_type(SETUP)
    olds = {**old_setup.inputs, **old_setup.state}
    # The image's id the engine gives it: the old one (the mocks, which know no ignore_changes, build a new one
    # from the ignored base; the recipe kept below is why the engine does not).
    news = {**new_setup.inputs, "kept_image": olds["kept_image"]}
    diff = ProfileSetupProvider().diff("id", olds, news)
    assert diff.changes and diff.replaces == []
    ran = []
    monkeypatch.setattr(setup_step, "run_profile_setup", lambda props, **seams: ran.append(props) or dict(props))
    updated = ProfileSetupProvider().update("id", olds, news).outs
    assert [p["instance_id"] for p in ran] == [master(after).id] and ran[0]["pip_pins"] == olds["pip_pins"]
    assert updated["kept_image"] == olds["kept_image"]

    # The image: a newer Ubuntu image found today builds nothing. The recipe keeps its base (ignored), and
    # what the engine compares of it, its component and the image's trigger are the same.
    (old_recipe,), (new_recipe,) = before.of_type(RECIPE), after.of_type(RECIPE)
    assert new_recipe.inputs["parentImage"] == "ami-0newer" and new_recipe.ignore_changes == ["parentImage"]
    assert _kept(new_recipe) == _kept(old_recipe)
    assert _kept(after.of_type(COMPONENT)[0]) == _kept(before.of_type(COMPONENT)[0])
    assert after.of_type(BUILT)[0].replacement_trigger == before.of_type(BUILT)[0].replacement_trigger

    # The workers' group ignores the master's new subnet, so it keeps its instances.
    (_, old_group), (_, new_group) = workers(before), workers(after)
    assert new_group.ignore_changes == ["vpcZoneIdentifiers"]
    assert new_group.inputs["vpcZoneIdentifiers"] != old_group.inputs["vpcZoneIdentifiers"]  # ignored, as it must be


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
