"""`fab images`: the images stacks kept with `keepImage`, what they hold and cost; one removed on request.

A kept image outlives its stack so that the next stack of the same profile in the region boots from it with no
install and no bake (cluster/stack/image_reuse.py). It bills its snapshot's storage every month until it is
removed: `fab images --remove AMI` deregisters it and deletes its snapshots, after a confirmation (`--yes` skips
it); an image that a live instance or one of this toolkit's launch templates boots is not removed. `fab sweep`
lists kept images as kept, never as leaked, and never deletes one.
"""

from __future__ import annotations

import datetime as dt
import json as json_module
import re

from invoke import Exit

from cluster.stack import image_reuse
from cluster.stack.tags import BASE_IMAGE_KEY, BASE_KEY, PROFILE_KEY, PROJECT_VERSION_KEY
from node_setup.tasks.common import FAILED, fail, task

IMAGE_ID = re.compile(r"ami-[0-9a-f]{8,17}\Z")


def render(images: list[image_reuse.KeptImage], used: dict[str, list[str]], region: str, now: dt.datetime) -> str:
    """The table of kept images and their total."""
    if not images:
        return f"no kept images in {region} (a stack with keepImage: true keeps its image after `pulumi destroy`)"
    lines = [f"kept images in {region}, newest first:",
             f"  {'image':<22} {'profile':<8} {'age':>9} {'size':>8} {'$/month':>8}  {'xeon-cluster':<24} base, from"]
    for image in images:
        base = f"{image.tag(BASE_KEY)} ({image.tag(BASE_IMAGE_KEY)})"
        lines.append(f"  {image.image_id:<22} {image.tag(PROFILE_KEY):<8} {image.age(now):>9} "
                     f"{image.size_gib:>4} GiB {image.monthly_usd:>8.2f}  {image.tag(PROJECT_VERSION_KEY):<24} "
                     f"{base}, {image.origin()}" + (f"; in use: {', '.join(used[image.image_id])}"
                                                    if used.get(image.image_id) else ""))
    gib = sum(i.size_gib for i in images)
    lines.append(f"{len(images)} kept image(s), {gib} GiB of snapshots: at most ${image_reuse.monthly_usd(images):.2f}"
                 f"/month (${image_reuse.SNAPSHOT_USD_PER_GIB_MONTH:g} per GB-month, the volumes' size; AWS bills the "
                 "blocks stored); `fab images --remove AMI` removes one")
    return "\n".join(lines)


def as_json(images: list[image_reuse.KeptImage], used: dict[str, list[str]], now: dt.datetime) -> str:
    return json_module.dumps([{"image_id": i.image_id, "name": i.name, "profile": i.tag(PROFILE_KEY),
                               "age": i.age(now), "size_gib": i.size_gib, "monthly_usd": round(i.monthly_usd, 2),
                               "snapshots": [snap for snap, _ in i.snapshots], "in_use": used.get(i.image_id, []),
                               "tags": dict(i.tags)} for i in images], indent=2)


@task(help={
    "region": "region of the images (default: the stack's, else AWS_REGION)",
    "stack": "Pulumi stack to take the region from",
    "remove": "the kept image (ami-...) to deregister, with its snapshots (asks first)",
    "yes": "do not ask before removing",
    "json": "print the kept images as JSON",
})
def images(c, region="", stack="", remove="", yes=False, json=False):
    """List the images stacks kept with keepImage (profile, age, size, monthly cost); --remove one.

    Exit code 1 when AWS refuses a call or the image could not be removed (it is in use, or a deletion failed),
    2 for an image id that is not a kept image here.
    """
    from node_setup.aws import clients as aws
    from node_setup.aws import errors
    from node_setup.aws import images as kept_images
    from node_setup.tasks.costs import _stack_spec

    if remove and not IMAGE_ID.match(remove):
        raise fail(f"--remove: {remove!r} is not an image id; allowed: ami- and 8 or 17 hex digits, as `fab images` "
                   "lists them")
    if not region:
        spec = _stack_spec(stack, required=False)
        region = spec.region if spec else ""
    try:
        region = aws.resolve_region(region or None)
        ec2 = aws.client("ec2", region)
        found = kept_images.kept_images(ec2)
        used = kept_images.in_use(ec2, [i.image_id for i in found])
    except aws.AwsSetupError as exc:
        raise fail(str(exc)) from None
    except errors.AWS_ERRORS as exc:
        hint = errors.credentials_hint(exc)
        if hint:
            raise fail(hint) from None
        raise fail(f"cannot list the kept images of {region}: {errors.describe(exc)} (needs ec2:DescribeImages, "
                   "ec2:DescribeInstances, ec2:DescribeLaunchTemplates, ec2:DescribeLaunchTemplateVersions)",
                   code=FAILED) from None
    now = dt.datetime.now(dt.timezone.utc)
    if not remove:
        print(as_json(found, used, now) if json else render(found, used, region, now))
        return
    image = next((i for i in found if i.image_id == remove), None)
    if image is None:
        raise fail(f"--remove: {remove} is not a kept image in {region}; allowed: "
                   + (", ".join(i.image_id for i in found) or "none: there are no kept images here"))
    if used.get(remove):
        raise Exit(f"error: {remove} is in use ({', '.join(used[remove])}): its cluster still boots it; "
                   "`pulumi destroy` that stack first, then remove it", code=FAILED)
    snapshots = ", ".join(snap for snap, _ in image.snapshots) or "no snapshot"
    if not yes:
        answer = input(f"remove {image.summary(now)} and its snapshot(s) {snapshots} in {region}? type 'yes': ")
        if answer.strip().lower() != "yes":
            raise Exit("images: nothing removed", code=FAILED)
    outcomes = kept_images.remove(ec2, image)
    for what, outcome in outcomes:
        print(f"  {outcome:<12} {what}")
    if any(outcome.startswith("FAILED") for _, outcome in outcomes):
        raise Exit(f"error: {remove} was not removed completely; rerun `fab images --remove {remove}`", code=FAILED)
    print(f"removed {remove} and {len(image.snapshots)} snapshot(s): ${image.monthly_usd:.2f}/month less at most")


TASKS = [images]
