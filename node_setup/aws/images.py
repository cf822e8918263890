"""The kept images of a region (a stack's `keepImage`): listed, chosen for a stack, checked for use, removed.

    kept_images(ec2) -> [KeptImage]             the images of this account with the kept filters
    stack_choice(ec2, spec) -> Choice           the image `pulumi up` of this stack will boot, and why
    in_use(ec2, image_ids) -> {id: [where]}     live instances and this toolkit's launch templates that boot one
    remove(ec2, image) -> [(what, outcome)]     deregister it, then delete its snapshots
    release_built(ec2, image_id, cluster, keep) -> str   a stack's destroy: its built image removed, or why not

The rule is cluster/stack/image_reuse.py's, which the Pulumi program asks too (infra/lookups.py) with the same
filters, so `fab preflight`, `fab up` and `fab plan` say what `pulumi up` will do. boto3 only.
"""

from __future__ import annotations

from collections import defaultdict

from botocore.exceptions import ClientError

from cluster.stack import image_build, image_reuse
from cluster.stack.image_reuse import Choice, KeptImage
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import CLUSTER_KEY, IMAGE_SOURCE_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, STACK_MARKER_KEY
from node_setup.aws import errors
from node_setup.aws.sweep import LIVE_INSTANCE_STATES, pages


def kept_images(ec2) -> list[KeptImage]:
    """The account's kept images in the client's region, newest first."""
    filters = [{"Name": name, "Values": [value]} for name, value in image_reuse.KEPT_FILTERS]
    found = [KeptImage.from_description(i) for i in pages(ec2, "describe_images", "Images", Owners=["self"],
                                                           Filters=filters)]
    return sorted(found, key=image_reuse.newest_first)


def previous_source(ec2, spec: ClusterSpec) -> str | None:
    """The choice the stack recorded beside its stack marker (None: no marker, a new stack)."""
    groups = list(pages(ec2, "describe_security_groups", "SecurityGroups", Filters=[
        {"Name": f"tag:{STACK_MARKER_KEY}", "Values": [spec.stack]},
        {"Name": f"tag:{CLUSTER_KEY}", "Values": [spec.cluster_name]}]))
    if not groups:
        return None
    return image_reuse.previous_source({t["Key"]: t["Value"] for t in groups[0].get("Tags") or []}, IMAGE_SOURCE_KEY)


def stack_choice(ec2, spec: ClusterSpec) -> Choice:
    """What `pulumi up` of this stack will boot, by the program's own rule (raises botocore's errors)."""
    return image_reuse.choose(image_reuse.wanted(spec), kept_images(ec2), previous_source(ec2, spec))


def in_use(ec2, image_ids: list[str]) -> dict[str, list[str]]:
    """Which of the images boot something now: a live instance (any state but terminated), the latest version
    of one of this toolkit's launch templates (a workers' group launches from it, after an auto-stop too), or a
    stack that records its use of it (its tag, cluster/stack/image_build.py; a stopped cluster launches none)."""
    used: dict[str, list[str]] = defaultdict(list)
    if not image_ids:
        return used
    for image in ec2.describe_images(ImageIds=image_ids).get("Images") or []:
        users = image_build.image_users({t["Key"]: t["Value"] for t in image.get("Tags") or []})
        for cluster, stack in sorted(users.items()):
            used[image["ImageId"]].append(f"stack {stack} (cluster {cluster})")
    live = [{"Name": "image-id", "Values": image_ids}, {"Name": "instance-state-name", "Values": LIVE_INSTANCE_STATES}]
    for reservation in pages(ec2, "describe_instances", "Reservations", Filters=live):
        for instance in reservation["Instances"]:
            used[instance["ImageId"]].append(f"instance {instance['InstanceId']}")
    ours = [{"Name": f"tag:{MANAGED_BY_KEY}", "Values": [MANAGED_BY_VALUE]}]
    for template in pages(ec2, "describe_launch_templates", "LaunchTemplates", Filters=ours):
        versions = ec2.describe_launch_template_versions(LaunchTemplateId=template["LaunchTemplateId"],
                                                         Versions=["$Latest"])["LaunchTemplateVersions"]
        for version in versions:
            image = version.get("LaunchTemplateData", {}).get("ImageId")
            if image in image_ids:
                used[image].append(f"launch template {template['LaunchTemplateName']}")
    return used


def remove(ec2, image: KeptImage) -> list[tuple[str, str]]:
    """Deregister the image, then delete its snapshots (a snapshot cannot go while an image uses it); one
    (what, outcome) per resource. One already gone counts as removed."""
    outcomes = []
    steps = [(f"image {image.image_id}", lambda: ec2.deregister_image(ImageId=image.image_id))] + [
        (f"snapshot {snap}", lambda snap=snap: ec2.delete_snapshot(SnapshotId=snap)) for snap, _ in image.snapshots]
    for what, call in steps:
        try:
            call()
        except ClientError as exc:
            outcomes.append((what, "already gone" if errors.is_gone(exc) else f"FAILED {errors.describe(exc)}"))
            if outcomes[-1][1].startswith("FAILED"):
                break  # the image still holds its snapshots
        else:
            outcomes.append((what, "removed"))
    return outcomes


def release_built(ec2, image_id: str, cluster: str, *, keep: bool) -> str:
    """What the destroy of `cluster`'s stack does with the image it built, decided on the image's tags as they are
    now (image_build.release: kept when the stack keeps it or another stack records its use), in one line."""
    try:
        found = ec2.describe_images(ImageIds=[image_id]).get("Images") if image_id else None
    except ClientError as exc:
        if not errors.is_gone(exc):
            raise
        found = None
    if not found:
        return "already gone"
    image = KeptImage.from_description(found[0])
    go, why = image_build.release(image.tags, cluster, keep=keep)
    if not go:
        return why
    return f"{why}: " + ", ".join(f"{what} {outcome}" for what, outcome in remove(ec2, image))
