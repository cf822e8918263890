"""What `fab sweep` may delete: the status of one tagged resource, from what the listing found.

A cluster is *up* while its master exists (pending, running, stopping or stopped); a master its Auto
Scaling group launched (AWS's group-name tag) keeps it up only while its stack marker is there too
(`master_keeps_up`: a group whose stack is gone launches a master again after every termination). A cluster
whose master is gone is *stopped, stack exists* while its stack marker is there (the
`xeon-cluster:stack-marker` tag that the Pulumi program puts on the cluster security group,
infra/network.py): an idle auto-stop terminates every node and a spot reclaim the master, but
only `pulumi destroy` removes that group, so the stack still owns its image, groups, key,
role and bucket, and none of them is leaked. Only a cluster with neither is *down*, and its
resources are leaked, except what is kept on purpose: checkpoint buckets (deleted only when asked)
and the images a stack kept with `keepImage` (with their snapshots: cluster/stack/image_reuse.py; `fab images`
removes them). Without the instance or the security-group listing no cluster can be told apart, and every
resource is unknown.

Pure: the edges (node_setup/aws/sweep.py) list the account and ask here.
"""

from __future__ import annotations

from collections.abc import Mapping

from cluster.stack.tags import GROUP_NAME_TAG, STACK_MARKER_KEY

# A master in one of these states means its cluster exists (a stopped one can be started again).
ALIVE_MASTER_STATES = ("pending", "running", "stopping", "stopped")
IAM_KINDS = ("instance-profile", "iam-role")

UP, STACK, LEAKED, KEPT, UNKNOWN = "up", "stack", "leaked", "kept", "unknown"
IN_USE = "in-use"  # an IAM role or profile of a cluster that is up, or has its stack, in another region


def marks_stack(tags: Mapping[str, str]) -> bool:
    """Whether a security group's tags carry the stack marker (a non-empty value)."""
    return bool(tags.get(STACK_MARKER_KEY))


def master_keeps_up(tags: Mapping[str, str], stack_exists: bool) -> bool:
    """Whether a master instance that exists (ALIVE_MASTER_STATES), with these tags, keeps its cluster up: one
    its group launched only with the cluster's stack marker (`stack_exists`)."""
    return GROUP_NAME_TAG not in tags or stack_exists


KEPT_IMAGE_KINDS = ("image", "snapshot")


def resource_status(kind: str, *, clusters_known: bool, up: bool, stack_exists: bool,
                    iam_unknown: bool = False, elsewhere: bool = False, kept: bool = False) -> str:
    """The status of one resource of a cluster.

    `up`: its master exists in the swept region; `stack_exists`: its stack marker is there;
    for IAM (global) `elsewhere`: the cluster is up or has its stack in another region, and
    `iam_unknown`: another region could not be checked; `kept`: an image (or its snapshot) tagged as kept.
    """
    if not clusters_known:
        return UNKNOWN
    if up:
        return UP
    if stack_exists:
        return STACK
    if kind in IAM_KINDS:
        if iam_unknown:
            return UNKNOWN
        if elsewhere:
            return IN_USE
    if kind == "bucket" or kind in KEPT_IMAGE_KINDS and kept:
        return KEPT
    return LEAKED

