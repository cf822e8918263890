"""Remove what the sweep listed as leaked (node_setup/aws/sweep.py), in dependency order.

Deletion re-reads the cluster's master and its stack marker right before each resource and keeps
everything of a cluster that has come back up since the listing (a master started, or a stack
brought up again, while the user read the list).
It runs in dependency order, one deleter per kind (`_deleters`, walked in DELETE_ORDER): instances
(terminated as one batch, then waited for), spot requests, AMIs, then their snapshots, detached volumes,
placement groups, key pairs, security groups (rules that reference another group first), instance profiles
(their roles removed first), IAM roles (removed from their instance profiles, inline policies deleted, managed
ones detached), buckets. A resource
that is already gone counts as removed, so the sweep can be rerun after a partial failure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

from botocore.exceptions import ClientError, WaiterError

from cluster.stack import leftovers
from cluster.stack.tags import CLUSTER_KEY, ROLE_KEY, ROLE_MASTER, STACK_MARKER_KEY
from node_setup.aws import errors
from node_setup.aws.sweep import ALIVE_MASTER_STATES, DELETE_ORDER, NO_CLUSTER, OURS, Listing, Resource, pages

Outcome = tuple[Resource, str]


def _terminate_instances(ec2, resources: list[Resource], waiter_delay: int) -> list[Outcome]:
    """Terminate and wait: everything else of a cluster may depend on its instances."""
    live = [r.id for r in resources if r.state != "shutting-down"]
    try:
        if live:
            ec2.terminate_instances(InstanceIds=live)
        ec2.get_waiter("instance_terminated").wait(InstanceIds=[r.id for r in resources],
                                                   WaiterConfig={"Delay": waiter_delay, "MaxAttempts": 40})
        outcome = "terminated"
    except (ClientError, WaiterError) as exc:
        outcome = f"FAILED to terminate: {exc}"
    return [(res, outcome) for res in resources]


class _Skip(Exception):
    """A resource left alone on purpose; the message says why."""


def _delete_volume(ec2, res: Resource) -> None:
    if res.state == "in-use":  # goes with its instance (DeleteOnTermination) or once detached
        raise _Skip("still attached; rerun the sweep after its instance is gone")
    ec2.delete_volume(VolumeId=res.id)


def _deleters(ec2, s3, iam) -> dict[str, Callable[[Resource], None]]:
    """Kind -> how to delete one resource of that kind (instances are terminated in one batch first)."""
    return {
        "spot-request": lambda r: ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=[r.id]),
        "image": lambda r: ec2.deregister_image(ImageId=r.id),
        "snapshot": lambda r: ec2.delete_snapshot(SnapshotId=r.id),
        "volume": lambda r: _delete_volume(ec2, r),
        "launch-template": lambda r: ec2.delete_launch_template(LaunchTemplateId=r.id),
        "placement-group": lambda r: ec2.delete_placement_group(GroupName=r.id),
        "key-pair": lambda r: ec2.delete_key_pair(KeyName=r.id),
        "security-group": lambda r: ec2.delete_security_group(GroupId=r.id),
        # IAM after the instances are gone: a profile first (its roles removed), then the roles
        "instance-profile": lambda r: _delete_instance_profile(iam, r.id),
        "iam-role": lambda r: _delete_role(iam, r.id),
        "bucket": lambda r: _empty_and_delete_bucket(s3, r.id),
    }


def why_alive(ec2, cluster: str) -> str:
    """Why the cluster exists now ("" when it does not): its master exists (pending, running,
    stopping or stopped), or its stack marker does."""
    if cluster == NO_CLUSTER:
        return ""
    ours = OURS + [{"Name": f"tag:{CLUSTER_KEY}", "Values": [cluster]}]
    filters = ours + [{"Name": f"tag:{ROLE_KEY}", "Values": [ROLE_MASTER]},
                      {"Name": "instance-state-name", "Values": ALIVE_MASTER_STATES}]
    masters = [{t["Key"]: t["Value"] for t in i.get("Tags", [])}
               for res in pages(ec2, "describe_instances", "Reservations", Filters=filters) for i in res["Instances"]]
    marked = any(leftovers.marks_stack({t["Key"]: t["Value"] for t in g.get("Tags", [])})
                 for g in pages(ec2, "describe_security_groups", "SecurityGroups",
                                Filters=ours + [{"Name": "tag-key", "Values": [STACK_MARKER_KEY]}]))
    if any(leftovers.master_keeps_up(tags, marked) for tags in masters):
        return "is up again"
    return "has its stack again" if marked else ""


def delete(listing: Listing, ec2, s3, iam=None, *, include_buckets: bool = False,
           waiter_delay: int = 15, autoscaling=None) -> list[Outcome]:
    """Remove the leaked resources in dependency order; returns (resource, outcome) per resource.

    Right before each deletion the resource's cluster is looked up again: a cluster whose master
    exists again (started since the listing), or whose stack marker does (`pulumi up` since the
    listing), keeps everything, and the outcome says so.
    """
    by_kind: dict[str, list[Resource]] = defaultdict(list)
    for res in listing.leaked(include_buckets=include_buckets):
        by_kind[res.kind].append(res)
    outcomes: list[Outcome] = []
    revived: dict[str, str] = {}  # cluster -> why it is kept

    def still_leaked(res: Resource) -> bool:
        why = revived.get(res.cluster) or why_alive(ec2, res.cluster)
        if why:
            revived[res.cluster] = why
            outcomes.append((res, f"kept: cluster {res.cluster} {why} since the listing"))
            return False
        return True

    # A leaked worker group first: it would launch every worker terminated below again. ForceDelete
    # terminates its instances too (the batch below waits for them with the others).
    for res in by_kind.pop("auto-scaling-group", []):
        if not still_leaked(res):
            continue
        try:
            autoscaling.delete_auto_scaling_group(AutoScalingGroupName=res.id, ForceDelete=True)
        except ClientError as exc:
            outcomes.append((res, "already gone" if errors.is_gone(exc) else f"FAILED {errors.describe(exc)}"))
            if not errors.is_gone(exc):
                return outcomes  # its instances would come back: delete nothing else yet
        else:
            outcomes.append((res, "removed (its instances terminate)"))
    instances = [r for r in by_kind.pop("instance", []) if still_leaked(r)]
    if instances:
        terminated = _terminate_instances(ec2, instances, waiter_delay)
        outcomes += terminated
        if terminated[0][1] != "terminated":
            return outcomes  # what depends on the instances cannot go yet
    _revoke_cross_references(ec2, [r.id for r in by_kind["security-group"]])
    deleters = _deleters(ec2, s3, iam)
    for kind in DELETE_ORDER:
        for res in by_kind.get(kind, []):
            if not still_leaked(res):
                continue
            try:
                deleters[kind](res)
            except _Skip as why:
                outcomes.append((res, f"skipped: {why}"))
            except ClientError as exc:
                outcomes.append((res, "already gone" if errors.is_gone(exc) else f"FAILED {errors.describe(exc)}"))
            else:
                outcomes.append((res, "removed"))
    return outcomes


def _delete_instance_profile(iam, name: str) -> None:
    profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    for role in profile.get("Roles", []):
        iam.remove_role_from_instance_profile(InstanceProfileName=name, RoleName=role["RoleName"])
    iam.delete_instance_profile(InstanceProfileName=name)


def _delete_role(iam, name: str) -> None:
    """IAM refuses to delete a role still in a profile or with policies: those go first."""
    for profile in list(pages(iam, "list_instance_profiles_for_role", "InstanceProfiles", RoleName=name)):
        iam.remove_role_from_instance_profile(InstanceProfileName=profile["InstanceProfileName"], RoleName=name)
    for policy in list(pages(iam, "list_role_policies", "PolicyNames", RoleName=name)):
        iam.delete_role_policy(RoleName=name, PolicyName=policy)
    for policy in list(pages(iam, "list_attached_role_policies", "AttachedPolicies", RoleName=name)):
        iam.detach_role_policy(RoleName=name, PolicyArn=policy["PolicyArn"])
    iam.delete_role(RoleName=name)


def _revoke_cross_references(ec2, group_ids: list[str]) -> None:
    """Two groups that admit each other cannot be deleted until those rules go."""
    if not group_ids:
        return
    try:
        groups = ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"]
    except ClientError:
        return
    for group in groups:
        rules = [p for p in group.get("IpPermissions", []) if p.get("UserIdGroupPairs")]
        if rules:
            try:
                ec2.revoke_security_group_ingress(GroupId=group["GroupId"], IpPermissions=rules)
            except ClientError:
                pass  # deletion below reports what is left


def _empty_and_delete_bucket(s3, name: str) -> None:
    paginator = s3.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=name):
        objects = [{"Key": o["Key"], "VersionId": o["VersionId"]}
                   for o in page.get("Versions", []) + page.get("DeleteMarkers", [])]
        if objects:
            s3.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
    s3.delete_bucket(Bucket=name)


def render_outcomes(outcomes: list[tuple[Resource, str]]) -> str:
    if not outcomes:
        return "nothing leaked: nothing removed"
    lines = [f"  {outcome:<12} {res.kind:<15} {res.id:<28} (cluster {res.cluster}"
             + (f", stack {res.stack})" if res.stack else ")") for res, outcome in outcomes]
    failed = sum(1 for _, outcome in outcomes if outcome.startswith(("FAILED", "skipped")))
    lines.append(f"removed {len(outcomes) - failed}, left {failed}"
                 + (" (rerun `fab sweep --delete`)" if failed else ""))
    return "\n".join(lines)
