"""Where every node goes and what it boots first, decided once and kept in the stack.

The program looks the subnet and the base image up on every run (infra/lookups.py), and the answers can
change (another default subnet, a newer Ubuntu image). Each first answer is kept in a `pulumi.Stash`: the
engine records a stash's first `input` as its `output` and keeps that output on later runs, whatever the
input is then. Both node groups (infra/node_group.py) and the image's recipe (infra/image.py) take the
kept values, never a lookup's, so the master and the workers are always in one subnet (one zone) and a
new lookup answer replaces nothing: a master the group launches again boots from the same template.

A kept value is decided again only on purpose, when its stash is replaced (`replacement_trigger`):
- the subnet when `subnetId` is set or changed, or with `zoneMove` when `availabilityZone` is set or changed
  (the zone's subnet is looked up again: a zone move, which moves both groups, their triggers naming the
  subnet);
- the base image when `baseAmi` is set or changed.
"""

from __future__ import annotations

from typing import Any

import pulumi

from cluster.stack.spec import ClusterSpec


def subnet_trigger(spec: ClusterSpec) -> dict[str, Any]:
    """What decides the subnet again when it changes: `subnetId`, and with zoneMove `availabilityZone`."""
    return {"subnetId": spec.subnet_id or "", **({"zone": spec.availability_zone} if spec.zone_move else {})}


def base_trigger(spec: ClusterSpec) -> dict[str, Any]:
    """What decides the base image again when it changes: `baseAmi`."""
    return {"baseAmi": spec.base_ami or ""}


class KeptPlacement(pulumi.ComponentResource):
    """The kept subnet (`subnet_id`) and base image (`base_ami`): the first lookup's, or the given ones."""

    def __init__(self, name: str, spec: ClusterSpec, *, subnet_id: str, base_ami: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:Placement", name, None, opts)
        subnet = pulumi.Stash(f"{name}-subnet", input=subnet_id, opts=pulumi.ResourceOptions(
            parent=self, replacement_trigger=subnet_trigger(spec)))
        base = pulumi.Stash(f"{name}-base", input=base_ami, opts=pulumi.ResourceOptions(
            parent=self, replacement_trigger=base_trigger(spec)))
        self.subnet_id: pulumi.Output[str] = subnet.output
        self.base_ami: pulumi.Output[str] = base.output
        self.register_outputs({"subnetId": self.subnet_id, "baseAmi": self.base_ami})
