"""build_cluster(spec): the whole cluster, in dependency order, and the stack outputs.

(Not `infra/cluster.py`: Pulumi starts the setup step's provider process in infra/, with infra/
first on sys.path, where a module named `cluster` would hide the project's `cluster` package.)
"""

from __future__ import annotations

import pulumi

from cluster.stack import image_reuse, node_replacement
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import BASE_IMAGE_KEY, cluster_tags
from infra import lookups
from infra.config import auto_stop_idle
from infra.bucket import CheckpointBucket
from infra.image import BuiltImage, image_use
from infra.master import MasterNode, kept_on_update
from infra.network import ClusterNetwork
from infra.node import NodeNetwork, capacity_retry_hook, engine_supports
from infra.node_role import NodeRole
from infra.setup_step import ProfileSetup, ssh_timeout_for
from infra.workers import WorkerGroup
from node_setup.ssh import keys


def _engine_hooks(spec: ClusterSpec) -> pulumi.ErrorHook | None:
    """The launch retry hook, when the Pulumi CLI supports error hooks; warnings for what it lacks."""
    if not engine_supports("REPLACEMENT_TRIGGER"):
        pulumi.log.warn("this Pulumi CLI ignores the replacementTrigger option: switching masterSpot/workerSpot "
                        "or a profile pin will not replace the nodes or the image; update the Pulumi CLI")
    if not engine_supports("ERROR_HOOKS"):
        pulumi.log.warn("this Pulumi CLI has no error hooks: a launch that fails for capacity is not retried; "
                        "update the Pulumi CLI, or run `pulumi up` again")
        return None
    return capacity_retry_hook("xeon-cluster-capacity-retry", types=spec.instance_types)


def workers_keep(spec: ClusterSpec) -> list[str]:
    """The workers' inputs taken from the master that keep their first value: a replaced master (a lost or
    auto-stopped one comes back with the lookups of today) must not replace the workers. The subnet when it
    was looked up; the base image too without a bake (with one every node boots the built image and follows it)."""
    kept = kept_on_update(spec)
    return [prop for prop in kept if prop == "subnetId" or not spec.bake]


def build_cluster(spec: ClusterSpec) -> dict[str, pulumi.Input]:
    """Create every resource of the cluster; return the stack outputs (not yet exported)."""
    # Lookups first: if one fails, nothing has been registered yet. The master keeps the base
    # image and subnet it was created with (infra/master.py); these are only first choices.
    base_ami = lookups.base_ami_id(spec)
    place = lookups.placement(spec)
    # A kept image that holds what this stack's bake would (cluster/stack/image_reuse.py): every node boots it,
    # and nothing is installed or baked. Only with a bake: without one every node boots the base image.
    choice = lookups.image_choice(spec) if spec.bake else None
    kept = choice.image if choice else None
    if choice:
        pulumi.log.info("image: " + image_reuse.choice_line(choice, spec))
    on_error = _engine_hooks(spec)
    tags = cluster_tags(spec.cluster_name, spec.stack, dict(spec.tags))
    name = spec.cluster_name
    # The cluster key's public half, from the controller's key store (the pair made there now if absent),
    # for the workers' first boot; the private half never enters the program, its state or a node's user data.
    # A key store that cannot be used (one half of the pair there) stops the run before anything is made, in
    # one line: Pulumi shows a RunError's message alone, any other exception with a traceback.
    try:
        cluster_key = keys.ensure_cluster_key(name).public_key
    except keys.KeyStoreError as exc:
        raise pulumi.RunError(str(exc)) from None

    network = ClusterNetwork(f"{name}-net", spec, place.vpc_id, tags, image_source=choice.source if choice else None)
    # The workers' credentials (IMDS) may read and write checkpoints in this bucket and nothing else; the
    # master's may also set its worker group to 0 and read what the supervisor reads (infra/node_role.py).
    # The instances take a profile's name as an input, so Pulumi creates role, policy and
    # profile before any node (and deletes the nodes first on destroy).
    bucket = CheckpointBucket(f"{name}-checkpoints", spec, tags)
    node_role = NodeRole(f"{name}-node", spec, bucket_arn=bucket.bucket.arn, tags=tags)

    def node_network(subnet_id: pulumi.Input[str], *groups) -> NodeNetwork:
        return NodeNetwork(
            subnet_id=subnet_id,
            security_group_ids=[g.id for g in groups],
            key_name=network.key_pair.key_name,
            placement_group=network.placement_group.name if network.placement_group else None,
            public_ip=True if place.default_vpc else None)

    # With a bake every node boots one image: a kept one, or the one Image Builder builds apart, on its own small
    # instance (infra/image.py); no node that runs jobs is ever imaged.
    built = BuiltImage(f"{name}-image", spec, base_ami=base_ami, vpc_id=place.vpc_id, subnet_id=place.subnet_id,
                       bucket=bucket.bucket, tags=tags, hooks=on_error is not None) if spec.bake and not kept else None
    image_id: pulumi.Input[str] | None = kept.image_id if kept else built.image_id if built else None
    master = MasterNode(f"{name}-master", spec, ami=image_id or base_ami,
                        network=node_network(place.subnet_id, network.cluster_group, network.ssh_group),
                        instance_profile=node_role.master_profile_name, tags=tags, on_error=on_error)
    # The base image and subnet the master really has (kept from its creation), for the workers.
    kept_ami, kept_subnet = master.instance.ami, master.instance.subnet_id
    if image_id is not None:
        # The master booted the image ready: the setup step checks it as `fab check` does and installs only what
        # differs (this project's wheel), and arms a new master's idle auto-stop; it images nothing.
        ProfileSetup(f"{name}-image-setup", host=master.connect_address, user=spec.ssh_user,
                     private_key_path=spec.private_key_path, instance_id=master.instance.id, profile=spec.profile,
                     cluster=spec.cluster_name, region=spec.region, auto_stop_idle_s=auto_stop_idle(),
                     kept_image=image_id, ssh_timeout_seconds=ssh_timeout_for(spec.instance_type),
                     opts=pulumi.ResourceOptions(depends_on=[master.instance, *network.ssh_rules]))
        # This stack's record that it boots the image (its destroy removes it; infra/image.py).
        image_use(f"{name}-image-use", spec, image_id)
    worker_ami: pulumi.Input[str] = image_id or kept_ami
    workers = WorkerGroup(f"{name}-worker", spec, ami=worker_ami,
                          network=node_network(kept_subnet, network.cluster_group),
                          instance_profile=node_role.worker_profile_name, tags=tags, cluster_key=cluster_key,
                          hooks=on_error is not None, keep=workers_keep(spec))
    # The auto-stop's permission on this group alone (after it: the policy names the group's ARN).
    node_role.allow_group_capacity(workers.group.arn)

    return {
        "clusterName": spec.cluster_name,
        "region": spec.region,
        "softwareProfile": spec.software_profile,
        "sshUser": spec.ssh_user,
        "masterPublicAddress": master.instance.public_ip,
        "masterPrivateAddress": master.instance.private_ip,
        # The workers' addresses are the group's to choose (and change after a reclaim): fab finds them.
        "workerGroupName": workers.group.name,
        "workerCount": spec.worker_count,
        "amiId": worker_ami,
        # From an image the master boots it: the base is the one that image was built on.
        "baseAmiId": (kept.tags.get(BASE_IMAGE_KEY, image_reuse.UNKNOWN) if kept else
                      built.identity.apply(lambda held: held[BASE_IMAGE_KEY]) if built else kept_ami),
        "imageSource": choice.source if choice else "none",
        "subnetId": kept_subnet,
        "bucketName": bucket.bucket.bucket,
        # Every setting, the bake tag and the template's shape, for `fab preflight` and a lost master's
        # replacement to compare with the stack file (cluster/stack/node_replacement.py).
        node_replacement.OUTPUT: node_replacement.node_settings(spec),
    }
