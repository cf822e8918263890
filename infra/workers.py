"""The workers (ranks 1..workerCount): same type, image, group and placement as the master."""

from __future__ import annotations

import pulumi

from cluster.spec import ClusterSpec
from cluster.tags import ROLE_WORKER
from infra.node import NodeNetwork, node_instance


class WorkerNodes(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], network: NodeNetwork,
                 instance_profile: pulumi.Input[str], tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:Workers", name, None, opts)
        self.instances = [
            node_instance(f"{name}-{rank}", spec, ami=ami, role=ROLE_WORKER, rank=rank,
                          spot=spec.worker_spot, network=network, instance_profile=instance_profile,
                          tags=tags,
                          opts=pulumi.ResourceOptions(parent=self))
            for rank in range(1, spec.worker_count + 1)
        ]
        self.register_outputs({"privateIps": [i.private_ip for i in self.instances]})
