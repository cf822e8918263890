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
from infra.network import ClusterNetwork
from infra.node import NodeNetwork, engine_supports
from infra.node_group import MASTER, WORKERS, NodeGroup, master_user_data, worker_user_data
from infra.node_role import NodeRole
from infra.placement import KeptPlacement
from infra.setup_step import ProfileSetup, ssh_timeout_for
from node_setup.ssh import keys


def _engine_hooks() -> bool:
    """Whether the Pulumi CLI runs error hooks (the groups' and the image build's one-line reasons); warnings
    for what it lacks."""
    if not engine_supports("REPLACEMENT_TRIGGER"):
        pulumi.log.warn("this Pulumi CLI ignores the replacementTrigger option: switching masterSpot/workerSpot, "
                        "a profile pin or the kept subnet will not replace the nodes or the image; update the "
                        "Pulumi CLI")
    if not engine_supports("ERROR_HOOKS"):
        pulumi.log.warn("this Pulumi CLI has no error hooks: a group that cannot launch its nodes is not explained "
                        "in one line; update the Pulumi CLI (`fab up` and `fab status` name the group's reason)")
        return False
    return True


def build_cluster(spec: ClusterSpec) -> dict[str, pulumi.Input]:
    """Create every resource of the cluster; return the stack outputs (not yet exported)."""
    # Lookups first: if one fails, nothing has been registered yet. They are only first choices: the subnet and
    # the base image every node takes are the ones kept in the stack (infra/placement.py).
    looked_up_ami = lookups.base_ami_id(spec)
    place = lookups.placement(spec)
    # A kept image that holds what this stack's bake would (cluster/stack/image_reuse.py): every node boots it,
    # and nothing is installed or baked. Only with a bake: without one every node boots the base image.
    choice = lookups.image_choice(spec) if spec.bake else None
    kept = choice.image if choice else None
    if choice:
        pulumi.log.info("image: " + image_reuse.choice_line(choice, spec))
    hooks = _engine_hooks()
    tags = cluster_tags(spec.cluster_name, spec.stack, dict(spec.tags))
    name = spec.cluster_name
    # The cluster key's public half, from the controller's key store (the pair made there now if absent),
    # for the workers' first boot; the private half never enters the program, its state or a node's user data.
    # A key store that cannot be used (one half of the pair there) stops the run before anything is made, in
    # one line: Pulumi shows a RunError's message alone, any other exception with a traceback.
    # The run-spec key's public half, the same way, for the master's boot: a new master continues a supervised run
    # only from a spec this controller signed (node_setup/supervisor/boot.py).
    try:
        cluster_key = keys.ensure_cluster_key(name).public_key
        signer = keys.spec_key().public
    except keys.KeyStoreError as exc:
        raise pulumi.RunError(str(exc)) from None

    # Where both groups go and the base they boot: decided once, kept, and decided again only on purpose.
    kept_place = KeptPlacement(f"{name}-placement", spec, subnet_id=place.subnet_id, base_ami=looked_up_ami)
    base_ami, subnet_id = kept_place.base_ami, kept_place.subnet_id
    network = ClusterNetwork(f"{name}-net", spec, place.vpc_id, tags, image_source=choice.source if choice else None)
    # The workers' credentials (IMDS) may read and write checkpoints in this bucket and nothing else; the
    # master's may also set the two groups to 0 and read what the supervisor reads (infra/node_role.py).
    # The launch templates take a profile's name as an input, so Pulumi creates role, policy and
    # profile before any node (and deletes the nodes first on destroy).
    bucket = CheckpointBucket(f"{name}-checkpoints", spec, tags)
    node_role = NodeRole(f"{name}-node", spec, bucket_arn=bucket.bucket.arn, tags=tags)

    def node_network(*groups) -> NodeNetwork:
        return NodeNetwork(
            subnet_id=subnet_id,
            security_group_ids=[g.id for g in groups],
            key_name=network.key_pair.key_name,
            placement_group=network.placement_group.name if network.placement_group else None,
            public_ip=True if place.default_vpc else None)

    # With a bake every node boots one image: a kept one, or the one Image Builder builds apart, on its own small
    # instance (infra/image.py); no node that runs jobs is ever imaged.
    built = BuiltImage(f"{name}-image", spec, base_ami=base_ami, vpc_id=place.vpc_id, subnet_id=subnet_id,
                       bucket=bucket.bucket, tags=tags, hooks=hooks) if spec.bake and not kept else None
    image_id: pulumi.Input[str] | None = kept.image_id if kept else built.image_id if built else None
    # Both groups boot one image: the built or kept one, or the kept base image without a bake.
    node_ami: pulumi.Input[str] = image_id or base_ami
    master = NodeGroup(f"{name}-master", spec, role=MASTER, ami=node_ami,
                       network=node_network(network.cluster_group, network.ssh_group),
                       instance_profile=node_role.master_profile_name, tags=tags,
                       user_data=master_user_data(spec, signer), hooks=hooks)
    if image_id is not None:
        # The master booted the image ready: the setup step checks the group's master as `fab check` does and
        # installs only what differs (this project's wheel), and arms a new master's idle auto-stop; it images
        # nothing. A master the group launches between two `pulumi up` boots the same image: `fab up` (or a
        # job) checks and arms it (infra/setup_step.py).
        ProfileSetup(f"{name}-image-setup", host=master.connect_address, user=spec.ssh_user,
                     private_key_path=spec.private_key_path, instance_id=master.instance_id, profile=spec.profile,
                     cluster=spec.cluster_name, region=spec.region, auto_stop_idle_s=auto_stop_idle(),
                     kept_image=image_id, ssh_timeout_seconds=ssh_timeout_for(spec.instance_type),
                     opts=pulumi.ResourceOptions(depends_on=[master.group, *network.ssh_rules]))
        # This stack's record that it boots the image (its destroy removes it; infra/image.py).
        image_use(f"{name}-image-use", spec, image_id)
    workers = NodeGroup(f"{name}-worker", spec, role=WORKERS, ami=node_ami, network=node_network(network.cluster_group),
                        instance_profile=node_role.worker_profile_name, tags=tags,
                        user_data=worker_user_data(spec, cluster_key, subnet_id),
                        hooks=hooks)
    # The auto-stop's permission on these two groups alone (after them: the policy names the groups' ARNs).
    node_role.allow_group_capacity(workers.group.arn, master.group.arn)

    return {
        "clusterName": spec.cluster_name,
        "region": spec.region,
        "softwareProfile": spec.software_profile,
        "sshUser": spec.ssh_user,
        # The master is the group's to launch again (and a new one has new addresses): fab finds it by its tags.
        "masterGroupName": master.group.name,
        "masterInstanceId": master.instance_id,
        "masterPublicAddress": master.public_ip,
        "masterPrivateAddress": master.private_ip,
        # The workers' addresses are the group's to choose (and change after a reclaim): fab finds them.
        "workerGroupName": workers.group.name,
        "workerCount": spec.worker_count,
        "amiId": node_ami,
        # From an image the master boots it: the base is the one that image was built on.
        "baseAmiId": (kept.tags.get(BASE_IMAGE_KEY, image_reuse.UNKNOWN) if kept else
                      built.identity.apply(lambda held: held[BASE_IMAGE_KEY]) if built else base_ami),
        "imageSource": choice.source if choice else "none",
        "subnetId": subnet_id,
        "bucketName": bucket.bucket.bucket,
        # Every setting, the bake tag and the template's shape, for `fab preflight` to compare with the stack
        # file (cluster/stack/node_replacement.py).
        node_replacement.OUTPUT: node_replacement.node_settings(spec),
    }
