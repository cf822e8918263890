"""Find everything this toolkit left in a region, and remove what is leaked.

Every resource the Pulumi program makes carries `xeon-cluster:managed-by=xeon-cluster` and
`xeon-cluster:cluster=<name>` (cluster/stack/tags.py). The sweep lists, per cluster: instances in any
state but terminated, spot requests (tagged, or behind a tagged instance), AMIs with their
snapshots, volumes, the groups' launch templates, security groups, key pairs, placement groups
and checkpoint buckets; with an Auto Scaling client also the master's and the workers' groups
(infra/node_group.py, by the same tags: a leaked group keeps launching nodes, so it is deleted first, with
its instances); with an IAM
client also the nodes' IAM roles and instance profiles (infra/node_role.py).

A cluster is *up* while its master instance exists and is not terminated (pending, running,
stopping or stopped: a stopped master can be started again) and, for a master its Auto Scaling group
launched (AWS's group-name tag), while its stack marker is there too: a group whose stack is gone launches
a master again after each termination, so such a master alone keeps nothing up; everything of an up
cluster is left alone. A cluster whose master is gone but whose cluster security group still carries the stack
marker (`xeon-cluster:stack-marker`, written by the Pulumi program, infra/network.py) is *stopped,
stack exists*: an idle auto-stop or a spot reclaim took its nodes, its stack still owns the rest,
and everything of it is left alone too (status *stack*, buckets included). Everything of any other
cluster (or with no cluster tag) is *leaked*, except what is *kept* on purpose: the checkpoint buckets,
deleted only with `delete_buckets=True`, and the images a stack kept with `keepImage` (tagged
`xeon-cluster:keep`) with their snapshots, which the next stack of their profile boots and only `fab images
--remove` deletes; the listing says what those cost a month. The statuses are decided in cluster/stack/leftovers.py.

IAM is global and the role's tags do not say in which region its cluster runs. Roles and instance
profiles are listed whatever their region; one whose cluster is not up in the swept region is
*leaked* only when no instance of that cluster (in any state but terminated) exists in any other
enabled region either, and no stack marker there (one `DescribeInstances` and one
`DescribeSecurityGroups` per region, made only when such a role or profile exists). A cluster with
instances or its stack in another region marks its role and profile *in-use*; when another region
cannot be checked they are *unknown* and left alone.

Each kind of resource is listed by its own API call, independently: one the caller may not use
(AccessDenied, UnauthorizedOperation, ...) is recorded in `Listing.errors` and the others are still
listed. Without the instance listing no cluster can be told up or down, and without the
security-group listing no stack marker can be seen, so then every resource is *unknown* and none
is deleted.

Deletion: node_setup/aws/sweep_delete.py.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field

import botocore.session
from botocore.exceptions import ClientError

from cluster.stack import image_reuse, leftovers
from cluster.stack.leftovers import IAM_KINDS, IN_USE, KEPT, LEAKED, STACK, UNKNOWN, UP  # noqa: F401 (re-exported)
from cluster.stack.tags import (CLUSTER_KEY, KEEP_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, PROFILE_KEY,
                                ROLE_KEY, ROLE_MASTER, STACK_KEY, STACK_MARKER_KEY)
from node_setup.aws import errors

NO_CLUSTER = "(no cluster tag)"
LIVE_INSTANCE_STATES = ["pending", "running", "shutting-down", "stopping", "stopped"]
ALIVE_MASTER_STATES = list(leftovers.ALIVE_MASTER_STATES)  # as an EC2 filter's values
OPEN_SPOT_STATES = ("open", "active", "disabled")
DELETE_ORDER = ("auto-scaling-group", "instance", "spot-request", "image", "snapshot", "volume", "launch-template",
                "placement-group", "key-pair", "security-group", "instance-profile", "iam-role", "bucket")
# Kind -> the permission its listing needs (named in the error when it is refused).
LIST_PERMISSIONS = {"instance": "ec2:DescribeInstances", "spot-request": "ec2:DescribeSpotInstanceRequests",
                    "image": "ec2:DescribeImages", "snapshot": "ec2:DescribeSnapshots",
                    "volume": "ec2:DescribeVolumes", "security-group": "ec2:DescribeSecurityGroups",
                    "key-pair": "ec2:DescribeKeyPairs", "launch-template": "ec2:DescribeLaunchTemplates",
                    "auto-scaling-group": "autoscaling:DescribeAutoScalingGroups",
                    "placement-group": "ec2:DescribePlacementGroups",
                    "bucket": "s3:ListAllMyBuckets", "iam-role": "iam:ListRoles and iam:ListRoleTags",
                    "instance-profile": "iam:ListInstanceProfiles and iam:ListInstanceProfileTags"}


@dataclass(frozen=True)
class Resource:
    kind: str
    id: str
    cluster: str
    state: str = ""
    detail: str = ""
    stack: str = ""  # the Pulumi stack that made it (its tag), "" when untagged
    kept: bool = False  # an image kept by its stack's keepImage, or its snapshot
    gib: int = 0  # a kept image's snapshots' size


def _resource(kind: str, ident: str, tags: dict[str, str], state: str = "", detail: str = "", gib: int = 0
              ) -> Resource:
    kept = kind in leftovers.KEPT_IMAGE_KINDS and tags.get(KEEP_KEY) == image_reuse.KEPT
    return Resource(kind, ident, _cluster(tags), state, detail, tags.get(STACK_KEY, ""), kept, gib if kept else 0)


@dataclass
class Listing:
    region: str
    resources: list[Resource] = field(default_factory=list)
    up_clusters: set[str] = field(default_factory=set)
    master_states: dict[str, str] = field(default_factory=dict)  # cluster -> its master's state
    # cluster -> the tags and state of each master that exists: up as leftovers.master_keeps_up says (`collect`)
    masters: dict[str, list[tuple[dict[str, str], str]]] = field(default_factory=dict)
    stack_markers: dict[str, str] = field(default_factory=dict)  # cluster -> the group with its stack marker
    errors: dict[str, str] = field(default_factory=dict)  # kind -> why it could not be listed
    iam_listed: bool = False
    # IAM is global: cluster -> other regions where it still has instances (its role is in use there)
    elsewhere: dict[str, set[str]] = field(default_factory=dict)
    stacks_elsewhere: dict[str, set[str]] = field(default_factory=dict)  # ... where its stack marker is
    other_regions_checked: int = 0
    elsewhere_error: str = ""  # why other regions could not be checked: no role or profile is leaked

    @property
    def clusters_known(self) -> bool:
        """Whether up, stopped and down can be told apart (the instance and security-group listings worked)."""
        return not {"instance", "security-group"} & set(self.errors)

    def status(self, resource: Resource) -> str:
        cluster = resource.cluster
        return leftovers.resource_status(
            resource.kind, clusters_known=self.clusters_known, up=cluster in self.up_clusters,
            stack_exists=cluster in self.stack_markers, iam_unknown=bool(self.elsewhere_error),
            elsewhere=cluster in self.elsewhere or cluster in self.stacks_elsewhere, kept=resource.kept)

    def by_cluster(self) -> dict[str, list[Resource]]:
        grouped: dict[str, list[Resource]] = defaultdict(list)
        for res in self.resources:
            grouped[res.cluster].append(res)
        return {name: sorted(items, key=lambda r: (DELETE_ORDER.index(r.kind), r.id))
                for name, items in sorted(grouped.items())}

    def leaked(self, *, include_buckets: bool = False) -> list[Resource]:
        """What `--delete` removes: the leaked resources, and with `include_buckets` the kept buckets (never a
        kept image: `fab images --remove` removes one)."""
        return [r for r in self.resources
                if self.status(r) == LEAKED or include_buckets and r.kind == "bucket" and self.status(r) == KEPT]

    def kept_images(self) -> list[Resource]:
        return [r for r in self.resources if r.kind == "image" and self.status(r) == KEPT]

    def render(self) -> str:
        lines = [] if self.resources or self.errors else [f"no xeon-cluster resources in {self.region}"]
        for name, items in self.by_cluster().items():
            state = self._cluster_state(name)
            if name in self.elsewhere and name not in self.up_clusters:
                state += f"; has instances in {', '.join(sorted(self.elsewhere[name]))} (its IAM role is in use there)"
            if name in self.stacks_elsewhere and name not in self.up_clusters:
                state += (f"; its stack exists in {', '.join(sorted(self.stacks_elsewhere[name]))} "
                          "(its IAM role is in use there)")
            lines.append(f"cluster {name}: {state}")
            for res in items:
                extra = " ".join(x for x in (res.state, res.detail) if x)
                lines.append(f"  {self.status(res):<6} {res.kind:<15} {res.id:<28} {extra}".rstrip())
        if self.resources:
            counts: defaultdict[str, int] = defaultdict(int)
            for res in self.resources:
                counts[self.status(res)] += 1
            unknown = f", {counts[UNKNOWN]} unknown (not deleted)" if counts[UNKNOWN] else ""
            stopped = (f", {counts[STACK]} of stopped clusters whose stack exists (not deleted)"
                       if counts[STACK] else "")
            lines.append(f"{self.region}: {counts[UP] + counts[IN_USE]} in use, {counts[LEAKED]} leaked, "
                         f"{counts[KEPT]} kept "
                         f"(checkpoint buckets; delete with --delete-buckets{self._images_kept()}){stopped}{unknown}")
        for kind, why in sorted(self.errors.items(), key=lambda item: DELETE_ORDER.index(item[0])):
            lines.append(f"could not list {kind}s: {why}")
        if self.iam_listed:
            lines.append(self._iam_note())
        return "\n".join(lines)

    def _images_kept(self) -> str:
        """What the kept images among the listing cost a month, or ""."""
        images = self.kept_images()
        if not images:
            return ""
        gib = sum(r.gib for r in images)
        return (f"; {len(images)} image(s) kept by keepImage with their snapshots, {gib} GiB, at most "
                f"${gib * image_reuse.SNAPSHOT_USD_PER_GIB_MONTH:.2f}/month: `fab images` lists and removes them")

    def _cluster_state(self, name: str) -> str:
        """The cluster's header line: up (and how), stopped with its stack, down, or unknown."""
        if not self.clusters_known:
            missing = " and ".join(what for kind, what in (("instance", "instances"),
                                                           ("security-group", "security groups"))
                                   if kind in self.errors)
            return f"unknown ({missing} could not be listed)"
        master = self.master_states.get(name, "")
        if master in ("pending", "running"):
            return f"up (master {master})"
        if name in self.up_clusters:
            return f"up but {master} (master {master}: start it again, or `pulumi destroy` removes it)"
        if name in self.stack_markers:
            return (f"stopped, stack exists (no master; security group {self.stack_markers[name]} carries its "
                    "stack marker: `pulumi up` brings the nodes back, `pulumi destroy` removes it all; "
                    "if the stack itself is gone, delete that group and sweep again)")
        return "down"

    def _iam_note(self) -> str:
        note = "IAM is global: roles and instance profiles are listed whatever region their cluster is in"
        if self.elsewhere_error:
            return f"{note}; {self.elsewhere_error}, so none of them counts as leaked"
        checked = f" ({self.other_regions_checked} other regions checked)" if self.other_regions_checked else ""
        return (f"{note}; one counts as leaked only when its cluster has no instance in any region "
                f"and no stack marker in any{checked}")


def _tags(item: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags") or item.get("TagSet") or []}


def _ours(tags: dict[str, str]) -> bool:
    return tags.get(MANAGED_BY_KEY) == MANAGED_BY_VALUE


def _cluster(tags: dict[str, str]) -> str:
    return tags.get(CLUSTER_KEY) or NO_CLUSTER


OURS = [{"Name": f"tag:{MANAGED_BY_KEY}", "Values": [MANAGED_BY_VALUE]}]


def pages(client, operation: str, key: str, **kwargs):
    if client.can_paginate(operation):
        for page in client.get_paginator(operation).paginate(**kwargs):
            yield from page.get(key, [])
    else:
        yield from getattr(client, operation)(**kwargs).get(key, [])


def collect(ec2, s3, region: str, iam=None, regional_ec2=None, autoscaling=None) -> Listing:
    """Everything with this toolkit's tags in `region` (buckets: those located in `region`).

    With `iam`, also the IAM roles and instance profiles (global); `regional_ec2(region)` gives an
    EC2 client for another region, to find clusters that still have instances there. Without it a
    role or profile of a cluster that is not up here is *unknown*, never leaked.

    Each kind is listed on its own: a refused call is recorded in `Listing.errors` (with the
    permission it needs) and the other kinds are still listed. Rejected credentials raise.
    """
    listing = Listing(region)
    found = _Found()
    listers = [("instance", _list_instances, ec2), ("spot-request", _list_spot_requests, ec2),
               ("image", _list_images, ec2), ("snapshot", _list_snapshots, ec2),
               ("volume", _list_volumes, ec2), ("security-group", _list_security_groups, ec2),
               ("key-pair", _list_key_pairs, ec2), ("placement-group", _list_placement_groups, ec2),
               ("launch-template", _list_launch_templates, ec2), ("bucket", _list_buckets, s3)]
    if autoscaling is not None:
        listers.insert(0, ("auto-scaling-group", _list_worker_groups, autoscaling))
    if iam is not None:
        listing.iam_listed = True
        listers += [("iam-role", _list_roles, iam), ("instance-profile", _list_instance_profiles, iam)]
    for kind, lister, client in listers:
        try:
            lister(client, listing, found)
        except ClientError as exc:
            _refused(listing, kind, exc)
    # (after the security groups: a master its group launched keeps its cluster up only with the stack's marker)
    for cluster, masters in listing.masters.items():
        for tags, state in masters:
            if leftovers.master_keeps_up(tags, cluster in listing.stack_markers):
                listing.up_clusters.add(cluster)
                listing.master_states[cluster] = state
    if iam is not None and listing.clusters_known:
        _find_clusters_elsewhere(ec2, listing, regional_ec2)
    return listing


def _refused(listing: Listing, kind: str, exc: ClientError) -> None:
    if errors.is_bad_credentials(exc):  # every listing would fail the same way
        raise exc
    listing.errors[kind] = f"{errors.describe(exc)}; allow {LIST_PERMISSIONS[kind]} for your IAM identity and rerun"


@dataclass
class _Found:
    """What one listing tells the next: spot requests behind instances, snapshots behind images."""
    spot_of_instance: dict[str, tuple[dict[str, str], str]] = field(default_factory=dict)  # -> (tags, instance)
    image_snapshots: set[str] = field(default_factory=set)


def _list_instances(ec2, listing: Listing, found: _Found) -> None:
    add = listing.resources.append
    for res in pages(ec2, "describe_instances", "Reservations", Filters=OURS + [
            {"Name": "instance-state-name", "Values": LIVE_INSTANCE_STATES}]):
        for inst in res["Instances"]:
            tags, state = _tags(inst), inst["State"]["Name"]
            cluster = _cluster(tags)
            role = tags.get(ROLE_KEY, "")
            add(_resource("instance", inst["InstanceId"], tags, state, f"{role} {inst['InstanceType']}".strip()))
            if role == ROLE_MASTER and state in ALIVE_MASTER_STATES:
                listing.masters.setdefault(cluster, []).append((tags, state))
            if inst.get("SpotInstanceRequestId"):
                found.spot_of_instance[inst["SpotInstanceRequestId"]] = (tags, inst["InstanceId"])


def _list_spot_requests(ec2, listing: Listing, found: _Found) -> None:
    add = listing.resources.append
    seen = set()
    for req in pages(ec2, "describe_spot_instance_requests", "SpotInstanceRequests", Filters=OURS):
        if req["State"] in OPEN_SPOT_STATES:
            seen.add(req["SpotInstanceRequestId"])
            add(_resource("spot-request", req["SpotInstanceRequestId"], _tags(req), req["State"],
                          req.get("InstanceId", "")))
    untagged = sorted(set(found.spot_of_instance) - seen)
    if untagged:  # requests made for tagged instances need not carry tags themselves
        for req in pages(ec2, "describe_spot_instance_requests", "SpotInstanceRequests",
                          SpotInstanceRequestIds=untagged):
            if req["State"] in OPEN_SPOT_STATES:
                tags, instance = found.spot_of_instance[req["SpotInstanceRequestId"]]
                add(_resource("spot-request", req["SpotInstanceRequestId"], tags, req["State"], instance))


def _list_images(ec2, listing: Listing, found: _Found) -> None:
    add = listing.resources.append
    for image in pages(ec2, "describe_images", "Images", Owners=["self"], Filters=OURS):
        tags = _tags(image)
        described = image_reuse.KeptImage.from_description(image)
        detail = image.get("Name", "")
        if described.kept:
            detail += (f"; kept by keepImage (profile {described.tag(PROFILE_KEY)}), {described.size_gib} GiB, at "
                       f"most ${described.monthly_usd:.2f}/month")
        add(_resource("image", image["ImageId"], tags, image.get("State", ""), detail, described.size_gib))
        for mapping in image.get("BlockDeviceMappings", []):
            snap = mapping.get("Ebs", {}).get("SnapshotId")
            if snap:
                found.image_snapshots.add(snap)
                add(_resource("snapshot", snap, tags, "", f"of {image['ImageId']}"))


def _list_snapshots(ec2, listing: Listing, found: _Found) -> None:
    for snap in pages(ec2, "describe_snapshots", "Snapshots", OwnerIds=["self"], Filters=OURS):
        if snap["SnapshotId"] not in found.image_snapshots:
            listing.resources.append(_resource("snapshot", snap["SnapshotId"], _tags(snap), snap.get("State", "")))


def _list_volumes(ec2, listing: Listing, found: _Found) -> None:
    for vol in pages(ec2, "describe_volumes", "Volumes", Filters=OURS):
        attached = ",".join(a["InstanceId"] for a in vol.get("Attachments", []))
        listing.resources.append(_resource("volume", vol["VolumeId"], _tags(vol), vol["State"],
                                           f"on {attached}" if attached else f"{vol.get('Size', '?')} GiB"))


def _list_security_groups(ec2, listing: Listing, found: _Found) -> None:
    """The groups, and the stack markers among them (a marker without a cluster tag marks nothing)."""
    for group in pages(ec2, "describe_security_groups", "SecurityGroups", Filters=OURS):
        tags = _tags(group)
        marked = leftovers.marks_stack(tags) and CLUSTER_KEY in tags
        if marked:
            listing.stack_markers.setdefault(_cluster(tags), group["GroupId"])
        detail = group.get("GroupName", "") + ("; carries the stack marker" if marked else "")
        listing.resources.append(_resource("security-group", group["GroupId"], tags, "", detail))


def _list_key_pairs(ec2, listing: Listing, found: _Found) -> None:
    for key in pages(ec2, "describe_key_pairs", "KeyPairs", Filters=OURS):
        listing.resources.append(_resource("key-pair", key["KeyName"], _tags(key), "", key.get("KeyPairId", "")))


def _list_placement_groups(ec2, listing: Listing, found: _Found) -> None:
    for group in pages(ec2, "describe_placement_groups", "PlacementGroups", Filters=OURS):
        listing.resources.append(_resource("placement-group", group["GroupName"], _tags(group),
                                           group.get("State", ""), group.get("Strategy", "")))


def _list_launch_templates(ec2, listing: Listing, found: _Found) -> None:
    for template in pages(ec2, "describe_launch_templates", "LaunchTemplates", Filters=OURS):
        listing.resources.append(_resource("launch-template", template["LaunchTemplateId"], _tags(template), "",
                                           template.get("LaunchTemplateName", "")))


def _list_worker_groups(autoscaling, listing: Listing, found: _Found) -> None:
    for group in pages(autoscaling, "describe_auto_scaling_groups", "AutoScalingGroups", Filters=OURS):
        listing.resources.append(_resource(
            "auto-scaling-group", group["AutoScalingGroupName"], _tags(group), "",
            f"desired {group.get('DesiredCapacity', '?')}, {len(group.get('Instances', []))} instance(s)"))


def _list_buckets(s3, listing: Listing, found: _Found) -> None:
    for bucket in s3.list_buckets().get("Buckets", []):
        name = bucket["Name"]
        try:
            tags = _tags(s3.get_bucket_tagging(Bucket=name))
            location = s3.get_bucket_location(Bucket=name).get("LocationConstraint") or "us-east-1"
        except ClientError:
            continue  # untagged (NoSuchTagSet) or not ours to read
        if _ours(tags) and location == listing.region:
            listing.resources.append(_resource("bucket", name, tags, "", "checkpoints"))


def _list_roles(iam, listing: Listing, found: _Found) -> None:
    """Roles whose tags say they are ours (ListRoles returns no tags: one ListRoleTags per role).

    Every role's tags are read, whatever its name: Pulumi names the role after the cluster with a
    random suffix, and a name is no proof of ownership either way.
    """
    for role in list(pages(iam, "list_roles", "Roles")):
        name = role["RoleName"]
        tags = _iam_tags(iam, "list_role_tags", RoleName=name)
        if tags is not None and _ours(tags):
            listing.resources.append(_resource("iam-role", name, tags, "", _role_policies(iam, name)))


def _iam_tags(iam, operation: str, **name) -> dict[str, str] | None:
    """An IAM role's or instance profile's tags (IAM lists them per resource); None when it is gone."""
    try:
        return _tags({"Tags": list(pages(iam, operation, "Tags", **name))})
    except ClientError as exc:
        if errors.is_gone(exc):
            return None  # deleted since it was listed
        raise


def _role_policies(iam, name: str) -> str:
    try:
        inline = list(pages(iam, "list_role_policies", "PolicyNames", RoleName=name))
        attached = [p["PolicyName"] for p in pages(iam, "list_attached_role_policies", "AttachedPolicies",
                                                     RoleName=name)]
    except ClientError:
        return ""  # only the detail is missing; deletion lists them again
    return "; ".join(part for part in (f"inline {','.join(inline)}" if inline else "",
                                       f"attached {','.join(attached)}" if attached else "") if part)


def _list_instance_profiles(iam, listing: Listing, found: _Found) -> None:
    for profile in list(pages(iam, "list_instance_profiles", "InstanceProfiles")):
        name = profile["InstanceProfileName"]
        tags = _iam_tags(iam, "list_instance_profile_tags", InstanceProfileName=name)
        if tags is not None and _ours(tags):
            roles = ",".join(r["RoleName"] for r in profile.get("Roles", []))
            listing.resources.append(_resource("instance-profile", name, tags, "",
                                               f"role {roles}" if roles else "no role"))


def _find_clusters_elsewhere(ec2, listing: Listing, regional_ec2) -> None:
    """IAM is global: record the other regions where a cluster with a role or profile here has
    instances, or its stack marker (a stopped cluster there still needs its role)."""
    clusters = sorted({r.cluster for r in listing.resources if r.kind in IAM_KINDS
                       and r.cluster not in listing.up_clusters and r.cluster not in listing.stack_markers
                       and r.cluster != NO_CLUSTER})
    if not clusters:
        return
    if regional_ec2 is None:
        listing.elsewhere_error = "other regions were not checked for their clusters' instances"
        return
    try:
        regions = sorted(r["RegionName"] for r in ec2.describe_regions()["Regions"])
    except ClientError as exc:
        listing.elsewhere_error = (f"the account's regions could not be listed ({errors.code(exc)}; "
                                   "allow ec2:DescribeRegions)")
        return
    partition = _partition(listing.region)
    failed = []
    for region in regions:
        if region == listing.region or _partition(region) != partition:
            continue  # a role serves instances of its own partition only (aws, aws-cn, aws-us-gov)
        ours = OURS + [{"Name": f"tag:{CLUSTER_KEY}", "Values": clusters}]
        try:
            client = regional_ec2(region)
            for res in pages(client, "describe_instances", "Reservations", Filters=ours + [
                    {"Name": "instance-state-name", "Values": LIVE_INSTANCE_STATES}]):
                for inst in res["Instances"]:
                    listing.elsewhere.setdefault(_cluster(_tags(inst)), set()).add(region)
            for group in pages(client, "describe_security_groups", "SecurityGroups", Filters=ours + [
                    {"Name": "tag-key", "Values": [STACK_MARKER_KEY]}]):
                if leftovers.marks_stack(_tags(group)):
                    listing.stacks_elsewhere.setdefault(_cluster(_tags(group)), set()).add(region)
        except ClientError as exc:
            failed.append(f"{region} ({errors.code(exc)})")
            continue
        listing.other_regions_checked += 1
    if failed:
        listing.elsewhere_error = (f"instances or security groups could not be listed in {', '.join(failed)} "
                                   "(allow ec2:DescribeInstances and ec2:DescribeSecurityGroups there)")


@functools.lru_cache(maxsize=None)
def _partition(region: str) -> str:
    try:
        return botocore.session.get_session().get_partition_for_region(region)
    except Exception:  # a region botocore does not know yet: assume the usual partition
        return "aws"
