"""Which image a stack's nodes boot: a kept image that holds exactly what its bake would, or a bake of its own (pure).

A baked image outlives its stack when the stack sets `keepImage` (infra/image.py: retain_on_delete on the image
and its snapshot's tags). Its tags (cluster/stack/tags.py) say what the bake put in it (`bake_identity`,
`baked_tags`, which the setup step records when it runs, infra/setup_step.py); `KeptImage` reads them back from an
image's description. Two layers find the kept images in the account and ask
`choose` here, and must agree: the Pulumi program (infra/lookups.py, through pulumi_aws's lookups) boots the
master and the workers from the chosen one, and `fab preflight`, `fab up` and `fab plan` (node_setup/aws/images.py,
through boto3) say which it will be, why, and what it saves.

A kept image is reused only when everything that would make the setup step install something else matches
(`mismatches`): the profile's bake tag (a hash of its fingerprint: the profile, its apt packages and every pin,
so a changed pin or profile never reuses an image), the region, the architecture, and the base it was baked on
(the `baseAmi` the stack names, or, without one, the Ubuntu release the program looks up); and its root volume is
no larger than the stack's `rootVolumeGib` (a launch cannot shrink a snapshot; a larger volume grows at boot).

This project's version is not part of the match. The setup step checks the master booted from the image as
`fab check` does and installs what differs, which for another version is this project's wheel alone (seconds:
the profile's packages are there); `fab setup` does the same on the workers. Matching on it would make every
edit of the checkout (the version carries a digest of every source file) a new bake of an hour, for a wheel; a
stack's own image is not re-baked for a new version either (its bake tag is the profile's alone).

Once a stack has chosen, its later `pulumi up`s keep the choice (`previous`, recorded beside its stack marker:
IMAGE_SOURCE_KEY): a stack that baked keeps baking its own image (a kept image that appears later does not
replace its workers), and a stack that reuses an image keeps it while it matches.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from cluster.durations import format_duration
from cluster.stack import lifecycle
from cluster.stack.image_build import BUILDER_INSTANCE_TYPE
from cluster.stack.images import BASE_IMAGE_FILTERS
from cluster.stack.node_replacement import bake_tag
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import (ARCHITECTURE_KEY, BASE_IMAGE_KEY, BASE_KEY, CLUSTER_KEY, CREATED_KEY, FINGERPRINT_KEY,
                                KEEP_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY, PROJECT_VERSION_KEY,
                                REGION_KEY, STACK_KEY)

BAKE = "bake"  # a stack that bakes its own image (IMAGE_SOURCE_KEY's value; else a kept image's id)
KEPT = "true"  # KEEP_KEY's value
UNKNOWN = "unknown"  # a tag value the bake could not know (a step recorded by an older version)
# The Ubuntu release the program looks up without baseAmi (cluster/stack/images.py): a kept image baked on any
# image of it serves a stack without baseAmi.
BASE_RELEASE = "ubuntu-24.04"
ARCHITECTURE = dict(BASE_IMAGE_FILTERS)["architecture"]
# DescribeImages filters (name, value) for the kept images, besides Owners=self.
KEPT_FILTERS: tuple[tuple[str, str], ...] = (
    (f"tag:{MANAGED_BY_KEY}", MANAGED_BY_VALUE),
    (f"tag:{KEEP_KEY}", KEPT),
)
# A snapshot in EBS's standard tier: USD per GB-month in us-east-1 (aws.amazon.com/ebs/pricing). AWS bills the
# blocks a snapshot stores, at most the volume's size: figures from the size are upper bounds.
SNAPSHOT_USD_PER_GIB_MONTH = 0.05
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"  # CREATED_KEY's (when the image was built)


@dataclass(frozen=True)
class Wanted:
    """What a bake of this stack would put into its image."""

    profile: str
    fingerprint: str  # the profile's bake tag
    region: str
    base: str  # baseAmi's id, or BASE_RELEASE
    root_volume_gib: int
    architecture: str = ARCHITECTURE


def wanted(spec: ClusterSpec) -> Wanted:
    return Wanted(profile=spec.software_profile, fingerprint=bake_tag(spec.profile.fingerprint()), region=spec.region,
                  base=spec.base_ami or BASE_RELEASE, root_volume_gib=spec.root_volume_gib)


def bake_identity(spec: ClusterSpec, base_image_id: str) -> dict[str, str]:
    """The tags of what a bake of this stack puts in its image, known before it runs: its profile and bake tag,
    region, base (and that base's image id, the master's), architecture."""
    want = wanted(spec)
    return {PROFILE_KEY: want.profile, FINGERPRINT_KEY: want.fingerprint, REGION_KEY: want.region, BASE_KEY: want.base,
            BASE_IMAGE_KEY: base_image_id or UNKNOWN, ARCHITECTURE_KEY: want.architecture}


def baked_tags(identity: Mapping[str, str], *, project_version: str | None, created: str) -> dict[str, str]:
    """The identity with what the bake itself decided: this project's version it installed and when it ran
    (the setup step's stamp). The tags of a baked image and its root snapshot, with the cluster's (and KEEP_KEY
    on a kept one)."""
    return {**identity, PROJECT_VERSION_KEY: project_version or UNKNOWN, CREATED_KEY: created or UNKNOWN}


@dataclass(frozen=True)
class KeptImage:
    image_id: str
    name: str
    state: str
    tags: Mapping[str, str]
    snapshots: tuple[tuple[str, int], ...]  # (snapshot id, volume GiB), root first
    architecture: str = ""
    creation_date: str = ""  # EC2's, ISO 8601

    @classmethod
    def from_description(cls, image: Mapping[str, Any]) -> "KeptImage":
        """From one image of DescribeImages (boto3's shape; infra/lookups.py turns pulumi_aws's into it)."""
        root = image.get("RootDeviceName")
        mappings = sorted((m for m in image.get("BlockDeviceMappings") or [] if (m.get("Ebs") or {}).get("SnapshotId")),
                          key=lambda m: m.get("DeviceName") != root)
        return cls(image_id=image["ImageId"], name=image.get("Name") or "", state=image.get("State") or "",
                   tags={t["Key"]: t["Value"] for t in image.get("Tags") or []},
                   snapshots=tuple((m["Ebs"]["SnapshotId"], int(m["Ebs"].get("VolumeSize") or 0)) for m in mappings),
                   architecture=image.get("Architecture") or "", creation_date=image.get("CreationDate") or "")

    def tag(self, key: str) -> str:
        return self.tags.get(key) or UNKNOWN

    @property
    def kept(self) -> bool:
        return self.tags.get(KEEP_KEY) == KEPT

    @property
    def size_gib(self) -> int:
        return sum(size for _, size in self.snapshots)

    @property
    def root_gib(self) -> int:
        return self.snapshots[0][1] if self.snapshots else 0

    @property
    def monthly_usd(self) -> float:
        """What its snapshots cost a month at most (their volumes' size; AWS bills the blocks stored)."""
        return self.size_gib * SNAPSHOT_USD_PER_GIB_MONTH

    def created(self) -> dt.datetime | None:
        """When it was baked: its CREATED_KEY stamp, else EC2's creation date; None when neither reads."""
        try:
            return dt.datetime.strptime(self.tags.get(CREATED_KEY, ""), STAMP_FORMAT).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            pass
        try:
            return dt.datetime.fromisoformat(self.creation_date.replace("Z", "+00:00"))
        except ValueError:
            return None

    def age(self, now: dt.datetime) -> str:
        created = self.created()
        if created is None:
            return UNKNOWN
        seconds = max((now - created).total_seconds(), 0.0)
        days, rest = divmod(int(seconds), 86400)
        return f"{days}d {rest // 3600}h" if days else format_duration(rest)

    def origin(self) -> str:
        """`stack dev (cluster xeon-dev)`: which stack baked it."""
        return f"stack {self.tag(STACK_KEY)} (cluster {self.tag(CLUSTER_KEY)})"

    def summary(self, now: dt.datetime) -> str:
        return (f"{self.image_id} (profile {self.tag(PROFILE_KEY)}, baked {self.age(now)} ago by {self.origin()}, "
                f"xeon-cluster {self.tag(PROJECT_VERSION_KEY)})")


def mismatches(image: KeptImage, want: Wanted) -> list[str]:
    """Why the image does not hold what this stack's bake would (empty: it does), each a short phrase."""
    why = []
    if image.state != "available":
        why.append(f"it is {image.state or 'in no state'}, not available")
    if image.tags.get(FINGERPRINT_KEY) != want.fingerprint:
        why.append(f"profile {image.tag(PROFILE_KEY)} with bake tag {image.tag(FINGERPRINT_KEY)}, not {want.profile} "
                   f"with {want.fingerprint} (another profile or other pins)")
    if image.tags.get(REGION_KEY) != want.region:
        why.append(f"baked for region {image.tag(REGION_KEY)}, not {want.region}")
    architecture = image.architecture or image.tags.get(ARCHITECTURE_KEY)
    if architecture != want.architecture:
        why.append(f"architecture {architecture or UNKNOWN}, not {want.architecture}")
    if image.tags.get(BASE_KEY) != want.base:
        why.append(f"baked on {image.tag(BASE_KEY)}, not {want.base}"
                   + (" (baseAmi)" if want.base != BASE_RELEASE else " (no baseAmi: the looked-up Ubuntu release)"))
    if image.root_gib > want.root_volume_gib:
        why.append(f"its root volume is {image.root_gib} GiB, more than rootVolumeGib {want.root_volume_gib}")
    return why


@dataclass(frozen=True)
class Choice:
    """The image a stack's nodes boot: `image` (a kept one) or None (a bake of its own), and why."""

    image: KeptImage | None
    why: str
    rejected: tuple[tuple[str, str], ...] = ()  # (image id, why it does not serve) for every other kept image

    @property
    def source(self) -> str:
        """IMAGE_SOURCE_KEY's value for it."""
        return self.image.image_id if self.image else BAKE


def previous_source(marker_tags: Mapping[str, str] | None, source_key: str) -> str | None:
    """The choice a stack recorded beside its stack marker: None for a stack with no marker (new, or destroyed),
    BAKE for a marker without it (a stack of an older version, which always baked)."""
    if marker_tags is None:
        return None
    return marker_tags.get(source_key) or BAKE


def choose(want: Wanted, kept: Iterable[KeptImage], previous: str | None) -> Choice:
    """The image for a stack that wants `want`, given the kept images of its region and its previous choice."""
    images = [k for k in kept if k.kept]
    problems = {k.image_id: mismatches(k, want) for k in images}
    usable = sorted((k for k in images if not problems[k.image_id]), key=newest_first)

    def rejected(chosen: KeptImage | None) -> tuple[tuple[str, str], ...]:
        return tuple((k.image_id, "; ".join(problems[k.image_id]) or "an older match")
                     for k in images if chosen is None or k.image_id != chosen.image_id)

    if previous == BAKE:
        return Choice(None, "this stack bakes its own image (its first `pulumi up` found no kept image to reuse), "
                            "and keeps doing so: a kept image found now would replace its workers", rejected(None))
    if previous:
        same = next((k for k in usable if k.image_id == previous), None)
        if same:
            return Choice(same, f"this stack already boots it, and it still matches profile {want.profile}",
                          rejected(same))
        gone = next((k for k in images if k.image_id == previous), None)
        lost = (f"the kept image {previous} this stack booted no longer serves it ("
                + ("; ".join(problems[previous]) if gone else "it is gone") + "); ")
    else:
        lost = ""
    if usable:
        best = usable[0]
        return Choice(best, f"{lost}it holds profile {want.profile} with the same pins, for {want.region}, baked on "
                            f"{want.base}", rejected(best))
    found = (f"none of the {len(images)} kept image(s) here holds profile {want.profile} as this stack would bake it"
             if images else f"no kept image in {want.region}")
    return Choice(None, f"{lost}{found}: this stack bakes its own", rejected(None))


def newest_first(image: KeptImage) -> tuple[float, str]:
    """A sort key: the newest bake first (by its stamp, else EC2's date), then by id."""
    created = image.created()
    return (-(created.timestamp() if created else 0.0), image.image_id)


def choice_line(choice: Choice, spec: ClusterSpec, *, project_version: str | None = None,
                now: dt.datetime | None = None) -> str:
    """One line for `fab preflight`, `fab up` and `pulumi up`: which image, why, and what it saves."""
    now = now or dt.datetime.now(dt.timezone.utc)
    bake = lifecycle.first_up(spec.instance, spec.profile.min_root_volume_gib)
    kept = lifecycle.first_up(spec.instance, spec.profile.min_root_volume_gib, kept_image=True)
    keep = (" (keepImage: true keeps it after `pulumi destroy` for the next stack)" if spec.keep_image else
            " (keepImage: false: `pulumi destroy` deletes it, unless another stack boots it)")
    if choice.image is None:
        return (f"bakes a new image: {choice.why}; EC2 Image Builder builds it on its own {BUILDER_INSTANCE_TYPE} "
                f"(${bake.builder_usd:.2f}), and the first `pulumi up` takes about {format_duration(bake.seconds)}"
                f"{keep}")
    image = choice.image
    line = (f"reuses kept image {image.summary(now)}: {choice.why}; no install, no bake: the first `pulumi up` "
            f"takes about {format_duration(kept.seconds)} instead of {format_duration(bake.seconds)} and its build "
            f"instance bills nothing (${bake.builder_usd:.2f} less)")
    held = image.tags.get(PROJECT_VERSION_KEY)
    if project_version and held != project_version:
        line += (f"; it holds xeon-cluster {held or UNKNOWN}: the setup step installs {project_version} on the master "
                 "and `fab setup` on the workers (this project's wheel alone, seconds)")
    return line


def monthly_usd(images: Sequence[KeptImage]) -> float:
    return sum(image.monthly_usd for image in images)
