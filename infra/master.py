"""The master node (rank 0): the only node reachable by SSH from outside, and the image source."""

from __future__ import annotations

import pulumi

from cluster.spec import ClusterSpec
from cluster.tags import ROLE_MASTER
from infra.node import NodeNetwork, node_instance


class MasterNode(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], network: NodeNetwork,
                 instance_profile: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:Master", name, None, opts)
        self.instance = node_instance(
            name, spec, ami=ami, role=ROLE_MASTER, rank=0, spot=spec.master_spot, network=network,
            instance_profile=instance_profile, tags=tags, opts=pulumi.ResourceOptions(parent=self))
        # The address the controller (and the setup step) connects to: public if it has one.
        self.connect_address = pulumi.Output.all(self.instance.public_ip, self.instance.private_ip).apply(
            lambda ips: ips[0] or ips[1])
        self.register_outputs({
            "instanceId": self.instance.id,
            "publicIp": self.instance.public_ip,
            "privateIp": self.instance.private_ip,
        })
