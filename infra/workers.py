"""The workers (ranks 1..workerCount): same type, image, group and placement as the master.

One `aws.ec2.Instance` per worker, launched in parallel by the engine once the image exists, not
one EC2 Fleet request: see docs/aws-lifecycle.md ("Why workers launch one by one") for the
trade-off. Each worker carries its rank in its tags and is replaced on its own after a reclaim
(`pulumi up --refresh`); a launch that fails for capacity is retried by the error hook.

`keep` (infra/program.py's `workers_keep`): the master's looked-up values the workers follow keep their
first value, so a new master (a lost one comes back with today's lookups) never replaces the workers.
"""

from __future__ import annotations

import pulumi

from cluster.spec import ClusterSpec
from cluster.tags import ROLE_WORKER
from infra.node import NodeNetwork, node_instance


class WorkerNodes(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, ami: pulumi.Input[str], network: NodeNetwork,
                 instance_profile: pulumi.Input[str], tags: dict[str, str],
                 on_error: pulumi.ErrorHook | None = None, keep: list[str] | None = None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:Workers", name, None, opts)
        self.instances = [
            node_instance(f"{name}-{rank}", spec, ami=ami, role=ROLE_WORKER, rank=rank,
                          spot=spec.worker_spot, network=network, instance_profile=instance_profile,
                          tags=tags, on_error=on_error, keep=keep or (),
                          opts=pulumi.ResourceOptions(parent=self))
            for rank in range(1, spec.worker_count + 1)
        ]
        self.register_outputs({"privateIps": [i.private_ip for i in self.instances]})
