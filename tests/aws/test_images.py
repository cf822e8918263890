"""Kept images under moto: what node_setup/aws/images.py lists and chooses, `fab images` (the task, end to end) lists
and removes, and `fab sweep` keeps.

The images are made as the Pulumi program makes them: CreateImage from an instance with the bake's tags
(cluster/stack/image_reuse.py's, the keep tag on a kept one), the root snapshot tagged the same way.
"""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from invoke import Context, Exit

pytest.importorskip("moto")

from cluster.stack import image_reuse  # noqa: E402
from cluster.stack.spec import ClusterSpec  # noqa: E402
from cluster.stack.tags import (CLUSTER_KEY, IMAGE_SOURCE_KEY, KEEP_KEY, STACK_MARKER_KEY,  # noqa: E402
                                USED_BY_PREFIX, cluster_tags)
from node_setup.aws import images, sweep, sweep_delete  # noqa: E402
from node_setup.tasks import images as images_task  # noqa: E402
from tests.aws.test_sweep import FakePlacementGroups  # noqa: E402 (moto has no placement groups)

BASE = "ami-1e749f67"  # a Canonical image moto ships
PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int "
              "test@xeon-cluster")


def _tags(tags: dict) -> list[dict]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def stack_spec(region: str, **config) -> ClusterSpec:
    return ClusterSpec.from_config({"publicKey": PUBLIC_KEY, "adminCidrs": ["203.0.113.7/32"], **config},
                                   stack=config.pop("stack", "next"), region=region)


def bake(ec2, spec: ClusterSpec, cluster: str, *, keep: bool, created: str = "20260501T120000Z") -> str:
    """An image as a stack of `spec`'s settings bakes it (its cluster `cluster`), its root snapshot tagged too."""
    master = ec2.run_instances(ImageId=BASE, InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    tags = {**cluster_tags(cluster, cluster), **image_reuse.baked_tags(image_reuse.bake_identity(spec, BASE),
                                                                       project_version="0.1.0", created=created)}
    if keep:
        tags[KEEP_KEY] = image_reuse.KEPT
    image = ec2.create_image(InstanceId=master["InstanceId"], Name=f"{cluster}-stock-{created}",
                             TagSpecifications=[{"ResourceType": "image", "Tags": _tags(tags)}])["ImageId"]
    snapshot = ec2.describe_images(ImageIds=[image])["Images"][0]["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]
    ec2.create_tags(Resources=[snapshot], Tags=_tags(tags))
    ec2.terminate_instances(InstanceIds=[master["InstanceId"]])  # its stack was destroyed
    return image


@pytest.fixture
def account(mocked_aws):
    ec2 = boto3.client("ec2", region_name=mocked_aws)
    spec = stack_spec(mocked_aws)
    kept = bake(ec2, spec, "weekly", keep=True)
    leaked = bake(ec2, spec, "forgot", keep=False)  # a destroy that forgot its image: not kept
    return dict(ec2=ec2, region=mocked_aws, spec=spec, kept=kept, leaked=leaked)


def test_only_kept_images_are_listed_with_what_they_hold(account):
    (found,) = images.kept_images(account["ec2"])
    assert found.image_id == account["kept"] and found.kept and found.size_gib > 0
    assert found.tag("xeon-cluster:profile") == "stock" and found.origin() == "stack weekly (cluster weekly)"


def test_a_new_stack_of_the_same_settings_boots_the_kept_image_and_one_that_baked_keeps_baking(account):
    ec2, spec = account["ec2"], account["spec"]
    assert images.stack_choice(ec2, spec).image.image_id == account["kept"]
    assert images.stack_choice(ec2, stack_spec(account["region"], softwareProfile="intel")).image is None
    ec2.create_security_group(GroupName="next-cluster", Description="the stack's marker", TagSpecifications=[
        {"ResourceType": "security-group", "Tags": _tags({STACK_MARKER_KEY: spec.stack, CLUSTER_KEY: spec.cluster_name,
                                                          IMAGE_SOURCE_KEY: image_reuse.BAKE})}])
    assert images.stack_choice(ec2, spec).image is None


def test_an_image_a_live_instance_or_a_launch_template_boots_is_in_use(account):
    ec2, kept = account["ec2"], account["kept"]
    assert images.in_use(ec2, [kept]) == {}
    ec2.create_launch_template(LaunchTemplateName="next-worker", LaunchTemplateData={"ImageId": kept},
                               TagSpecifications=[{"ResourceType": "launch-template",
                                                   "Tags": _tags(cluster_tags("next", "next"))}])
    assert images.in_use(ec2, [kept]) == {kept: ["launch template next-worker"]}


def run_images(**options) -> None:
    images_task.images(Context(), **options)


def test_fab_images_lists_size_age_and_monthly_cost(account, capsys):
    run_images(region=account["region"])
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.startswith(f"  {account['kept']}")]
    found = images.kept_images(account["ec2"])[0]
    age = found.age(dt.datetime.now(dt.timezone.utc))
    assert row.split()[1:2] == ["stock"] and f"{found.size_gib} GiB" in row and age in row
    assert f"{found.monthly_usd:.2f}" in row and "stack weekly (cluster weekly)" in row
    assert account["leaked"] not in out  # not kept: `fab sweep` finds it as a leak
    assert f"1 kept image(s), {found.size_gib} GiB of snapshots: at most ${found.monthly_usd:.2f}/month" in out


@pytest.mark.parametrize("remove, code, message", [
    ("ami-x", 2, "--remove: 'ami-x' is not an image id"),
    ("ami-0123456789abcdef0", 2, "is not a kept image in us-east-1; allowed: ami-"),
])
def test_fab_images_refuses_what_is_not_a_kept_image(account, remove, code, message):
    with pytest.raises(Exit) as caught:
        run_images(region=account["region"], remove=remove, yes=True)
    assert caught.value.code == code and message in caught.value.message
    assert len(images.kept_images(account["ec2"])) == 1


def test_fab_images_keeps_an_image_in_use_and_one_not_confirmed(account, monkeypatch):
    ec2, kept = account["ec2"], account["kept"]
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(Exit, match="nothing removed"):
        run_images(region=account["region"], remove=kept)
    running = ec2.run_instances(ImageId=kept, InstanceType="c6i.16xlarge", MinCount=1, MaxCount=1)["Instances"][0]
    with pytest.raises(Exit) as caught:
        run_images(region=account["region"], remove=kept, yes=True)
    assert caught.value.code == 1 and f"is in use (instance {running['InstanceId']})" in caught.value.message
    assert [i.image_id for i in images.kept_images(ec2)] == [kept]


def test_fab_images_removes_the_image_and_its_snapshots(account, capsys):
    ec2, kept = account["ec2"], account["kept"]
    (found,) = images.kept_images(ec2)
    run_images(region=account["region"], remove=kept, yes=True)
    out = capsys.readouterr().out
    assert f"removed {kept} and 1 snapshot(s)" in out
    assert kept not in {i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]}
    snapshots = {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    assert found.snapshots[0][0] not in snapshots


def test_the_sweep_keeps_a_kept_image_and_says_what_it_costs(account):
    ec2, s3 = FakePlacementGroups(account["ec2"]), boto3.client("s3", region_name=account["region"])
    listing = sweep.collect(ec2, s3, account["region"])
    status = {(r.kind, r.id): listing.status(r) for r in listing.resources}
    assert status[("image", account["kept"])] == sweep.KEPT and status[("image", account["leaked"])] == sweep.LEAKED
    kept_snapshots = [r for r in listing.resources if r.kind == "snapshot" and r.detail == f"of {account['kept']}"]
    assert [listing.status(r) for r in kept_snapshots] == [sweep.KEPT]
    (found,) = images.kept_images(ec2)
    text = listing.render()
    assert (f"1 image(s) kept by keepImage with their snapshots, {found.size_gib} GiB, at most "
            f"${found.monthly_usd:.2f}/month: `fab images` lists and removes them") in text
    # --delete, with the buckets too, never removes a kept image or its snapshot
    assert {r.id for r in listing.leaked(include_buckets=True)} >= {account["leaked"]}
    sweep_delete.delete(listing, ec2, s3, include_buckets=True, waiter_delay=1)
    assert [i.image_id for i in images.kept_images(ec2)] == [account["kept"]]


def test_fab_preflight_says_which_image_pulumi_up_boots_and_what_it_saves(account):
    from node_setup.aws.findings import OK, Report
    from node_setup.controller import project_version
    from node_setup.tasks.costs import check_image

    report = Report(account["region"])
    check_image(report, account["spec"])
    (finding,) = report.findings
    assert finding.check == "image" and finding.status == OK
    assert finding.message.startswith(f"reuses kept image {account['kept']} (profile stock, baked ")
    # a kept image: resources 1m, the metal boot's typical 9m, cloud-init 3m, the check 30s = 13m 30s; with the build
    # (the build instance's typical 2m boot, 10m install, 40 GiB x 18 s snapshot) 24m more = 37m 30s
    assert "no install, no bake: the first `pulumi up` takes about 13m 30s instead of 37m 30s" in finding.message
    assert f"it holds xeon-cluster 0.1.0: the setup step installs {project_version()} on the master" in finding.message
    report = Report(account["region"])
    check_image(report, stack_spec(account["region"], softwareProfile="intel"))
    assert report.findings[0].message.startswith("bakes a new image: none of the 1 kept image(s) here holds profile "
                                                 "intel as this stack would bake it")


def _release(account, image: str, cluster: str, *, keep: bool) -> None:
    """A stack's `pulumi destroy` of its built image's release record (infra/image.py), its real delete."""
    from infra.image import ImageReleaseProvider

    ImageReleaseProvider().delete("release", {"image_id": image, "cluster": cluster, "region": account["region"],
                                              "keep": keep})


def _use(ec2, image: str, cluster: str, stack: str) -> None:
    ec2.create_tags(Resources=[image], Tags=_tags({f"{USED_BY_PREFIX}{cluster}": stack}))


def test_a_stacks_destroy_neither_removes_nor_untags_an_image_another_stack_boots(account):
    ec2, built = account["ec2"], account["leaked"]  # built by stack "forgot", keepImage false
    _use(ec2, built, "forgot", "forgot")
    _use(ec2, built, "other", "other")  # a second stack boots it
    ec2.delete_tags(Resources=[built], Tags=[{"Key": f"{USED_BY_PREFIX}forgot"}])  # the owner's own record goes first
    before = ec2.describe_images(ImageIds=[built])["Images"][0]
    _release(account, built, "forgot", keep=False)
    after = ec2.describe_images(ImageIds=[built])["Images"][0]
    assert after["State"] == "available" and sorted(map(str, after["Tags"])) == sorted(map(str, before["Tags"]))
    # `fab images --remove` refuses it too: the other stack records its use.
    assert images.in_use(ec2, [built]) == {built: ["stack other (cluster other)"]}
    # Once the other stack's destroy removed its record, the owner's release removes the image and its snapshot.
    snapshot = after["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]
    ec2.delete_tags(Resources=[built], Tags=[{"Key": f"{USED_BY_PREFIX}other"}])
    _release(account, built, "forgot", keep=False)
    assert built not in {i["ImageId"] for i in ec2.describe_images(Owners=["self"])["Images"]}
    assert snapshot not in {s["SnapshotId"] for s in ec2.describe_snapshots(OwnerIds=["self"])["Snapshots"]}
    _release(account, built, "forgot", keep=False)  # already gone: nothing to do, no error


def test_a_kept_image_outlives_its_stacks_destroy(account):
    _release(account, account["kept"], "weekly", keep=True)
    assert [i.image_id for i in images.kept_images(account["ec2"])] == [account["kept"]]
