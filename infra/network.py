"""Who may talk to the nodes: the cluster security group, the master's SSH group, placement, key.

- `cluster` group: every member reaches every other member on every port (MPI, gloo, oneCCL pick
  ports freely); outbound open. Nothing from outside the group is admitted. All nodes carry it.
- `ssh` group: port 22 from the admin CIDRs only; only the master carries it. Workers are reached
  through the master (Fabric's gateway), so they take no inbound traffic from outside the group.
Rules are separate `aws.vpc.SecurityGroup*Rule` resources, never inline, so they can change one at
a time and never fight with inline rules.

The stack marker (`xeon-cluster:stack-marker=<stack>`, cluster/stack/tags.py) is a tag of the cluster
group: `fab sweep` never deletes a cluster that has it, whatever became of its nodes. It is on this
group because the group lives exactly as long as the stack: created before any node (every node
carries it) and deleted by `pulumi destroy` only after every node and the image, while an idle
auto-stop or a spot reclaim, which terminate instances, leave it. It is part of the group's own
`tags`, not a separate tag resource (which would fight the group's tags on every update), and the
nodes' role has no EC2 permission, so no node can remove it. The sweep reads it with the
`ec2:DescribeSecurityGroups` call it already makes. An object in the checkpoint bucket would need
another permission (`s3:GetObject`) and could be deleted by any node, which may delete every object
there.

Beside the marker, the image the stack's nodes boot (IMAGE_SOURCE_KEY: "bake", or the kept image it reuses;
none without a bake), which the next `pulumi up` of the stack reads back to keep that choice
(cluster/stack/image_reuse.py): it lives as long as the stack, and only the program writes it.
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_aws as aws

from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import IMAGE_SOURCE_KEY, STACK_MARKER_KEY


class ClusterNetwork(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, vpc_id: str, tags: dict[str, str],
                 image_source: str | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        def group(suffix: str, purpose: str, marker: dict[str, str] | None = None) -> aws.ec2.SecurityGroup:
            return aws.ec2.SecurityGroup(f"{name}-{suffix}", vpc_id=vpc_id,
                                         description=f"xeon-cluster {spec.cluster_name}: {purpose}",
                                         tags={**tags, "Name": f"{name}-{suffix}", **(marker or {})}, opts=child)

        self.cluster_group = group("cluster", "all traffic between cluster members",
                                   marker={STACK_MARKER_KEY: spec.stack,
                                           **({IMAGE_SOURCE_KEY: image_source} if image_source else {})})
        self.self_rule = aws.vpc.SecurityGroupIngressRule(
            f"{name}-cluster-self",
            security_group_id=self.cluster_group.id,
            referenced_security_group_id=self.cluster_group.id,
            ip_protocol="-1",
            description="every port from members of this group",
            tags=tags,
            opts=child)
        # Nodes download packages, models and datasets; return traffic of SSH is stateful.
        self.egress_rules = [
            aws.vpc.SecurityGroupEgressRule(
                f"{name}-cluster-egress-{family}",
                security_group_id=self.cluster_group.id,
                ip_protocol="-1",
                description=f"outbound {family}",
                tags=tags,
                opts=child,
                cidr_ipv4=cidr if family == "ipv4" else None,
                cidr_ipv6=cidr if family == "ipv6" else None)
            for family, cidr in (("ipv4", "0.0.0.0/0"), ("ipv6", "::/0"))
        ]

        self.ssh_group = group("ssh", "SSH to the master from the admin networks")
        self.ssh_rules = []
        for index, cidr in enumerate(spec.admin_cidrs):
            family = "ipv6" if ipaddress.ip_network(cidr).version == 6 else "ipv4"
            self.ssh_rules.append(aws.vpc.SecurityGroupIngressRule(
                f"{name}-ssh-{index}",
                security_group_id=self.ssh_group.id,
                ip_protocol="tcp",
                from_port=22,
                to_port=22,
                description=f"SSH from admin network {cidr}",
                tags=tags,
                opts=child,
                **{f"cidr_{family}": cidr}))

        # A cluster placement group packs the nodes close together (10 Gbps per flow, not 5).
        self.placement_group = aws.ec2.PlacementGroup(
            f"{name}-placement", strategy="cluster", tags=tags, opts=child) if spec.placement_group else None

        self.key_pair = aws.ec2.KeyPair(f"{name}-key", public_key=spec.public_key, tags=tags, opts=child)

        self.register_outputs({
            "clusterGroupId": self.cluster_group.id,
            "sshGroupId": self.ssh_group.id,
            "keyName": self.key_pair.key_name,
        })
