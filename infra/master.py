"""The master node (rank 0): the only node reachable by SSH from outside.

It also keeps the cluster's first choice of base image and subnet: when `baseAmi` / `subnetId`
are not set, the program looks both up on every run (infra/lookups.py), and a newer Ubuntu image
or another default subnet would otherwise replace the master (its setup step checked again) and
every worker. With `ignore_changes` the master keeps the values it was created with; the workers
take the master's (its `ami` and `subnet_id` outputs, read back from the state), and the stack
exports them as `baseAmiId` and `subnetId`. Setting `baseAmi` or `subnetId` moves the cluster on
purpose (docs/aws-lifecycle.md), and so does a new `availabilityZone` with `zoneMove` (docs/aws.md).
"""

from __future__ import annotations

import pulumi

from cluster.stack.spec import ClusterSpec
from cluster.run.stack_recovery import MASTER_COMPONENT
from cluster.stack.tags import ROLE_MASTER
from infra.node import NodeNetwork, node_instance


def kept_on_update(spec: ClusterSpec) -> list[str]:
    """The master's inputs that keep their first value: those the program looked up, not given. With a bake the
    master boots the built image and follows it (the image's recipe keeps the looked-up base: infra/image.py);
    with zoneMove the subnet is the zone's, as if given (a new availabilityZone moves the master, and the
    workers with it)."""
    looked_up = (("ami", spec.base_ami or spec.bake), ("subnetId", spec.subnet_id or spec.zone_move))
    return [prop for prop, given in looked_up if not given]


class MasterNode(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], network: NodeNetwork,
                 instance_profile: pulumi.Input[str], tags: dict[str, str],
                 on_error: pulumi.ErrorHook | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__(MASTER_COMPONENT, name, None, opts)
        self.instance = node_instance(
            name, spec, ami=ami, role=ROLE_MASTER, rank=0, spot=spec.master_spot, network=network,
            instance_profile=instance_profile, tags=tags, opts=pulumi.ResourceOptions(parent=self),
            keep=kept_on_update(spec), on_error=on_error)
        # The address the controller (and the setup step) connects to: public if it has one.
        self.connect_address = pulumi.Output.all(self.instance.public_ip, self.instance.private_ip).apply(
            lambda ips: ips[0] or ips[1])
        self.register_outputs({
            "instanceId": self.instance.id,
            "publicIp": self.instance.public_ip,
            "privateIp": self.instance.private_ip,
        })
