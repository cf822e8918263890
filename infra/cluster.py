"""build_cluster(spec): the whole cluster, in dependency order, and the stack outputs."""

from __future__ import annotations

import pulumi

from cluster.spec import ClusterSpec
from cluster.tags import cluster_tags
from infra import lookups
from infra.bucket import CheckpointBucket
from infra.image import BakedImage
from infra.master import MasterNode
from infra.network import ClusterNetwork
from infra.node import NodeNetwork
from infra.node_role import NodeRole
from infra.workers import WorkerNodes


def build_cluster(spec: ClusterSpec) -> dict[str, pulumi.Input]:
    """Create every resource of the cluster; return the stack outputs (not yet exported)."""
    # Lookups first: if one fails, nothing has been registered yet.
    base_ami = lookups.base_ami_id(spec)
    place = lookups.placement(spec)
    tags = cluster_tags(spec.cluster_name, spec.stack, dict(spec.tags))
    name = spec.cluster_name

    network = ClusterNetwork(f"{name}-net", spec, place.vpc_id, tags)
    # The nodes' credentials (IMDS) may read and write checkpoints in this bucket and nothing else.
    # The instances take the profile's name as an input, so Pulumi creates role, policy and
    # profile before any node (and deletes the nodes first on destroy).
    bucket = CheckpointBucket(f"{name}-checkpoints", spec, tags)
    node_role = NodeRole(f"{name}-node", spec, bucket_arn=bucket.bucket.arn, tags=tags)

    def node_network(*groups) -> NodeNetwork:
        return NodeNetwork(
            subnet_id=place.subnet_id,
            security_group_ids=[g.id for g in groups],
            key_name=network.key_pair.key_name,
            placement_group=network.placement_group.name if network.placement_group else None,
            public_ip=True if place.default_vpc else None)

    master = MasterNode(f"{name}-master", spec, ami=base_ami,
                        network=node_network(network.cluster_group, network.ssh_group),
                        instance_profile=node_role.profile_name, tags=tags)
    if spec.bake:
        image = BakedImage(f"{name}-image", spec, master, tags, ssh_rules=network.ssh_rules)
        worker_ami: pulumi.Input[str] = image.image.id
    else:
        worker_ami = base_ami
    workers = WorkerNodes(f"{name}-worker", spec, ami=worker_ami,
                          network=node_network(network.cluster_group),
                          instance_profile=node_role.profile_name, tags=tags)

    return {
        "clusterName": spec.cluster_name,
        "region": spec.region,
        "softwareProfile": spec.software_profile,
        "sshUser": spec.ssh_user,
        "masterPublicAddress": master.instance.public_ip,
        "nodePrivateAddresses": pulumi.Output.all(
            master.instance.private_ip, *[w.private_ip for w in workers.instances]),
        "amiId": worker_ami,
        "bucketName": bucket.bucket.bucket,
    }
