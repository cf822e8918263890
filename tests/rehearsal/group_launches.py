"""Test double: the cluster's Auto Scaling groups (the master's and the workers') launch their instances on the
local nodes.

moto 5 runs an Auto Scaling group's instances itself, from the group's launch template:
CreateAutoScalingGroup fills the group to its desired capacity, and a TerminateInstances of one of
its instances launches the replacement within that same call (moto's `notify_terminate_instances`),
as AWS launches one a little later. But moto applies only part of the template (the image, the
type, the key, the security groups, the instance tags) and picks each instance's private address
from the subnet, where the rehearsal needs the address of a local node.

`GroupLaunchDouble` wraps the EC2 backend's instance creation (`run_instances`, which moto's group
calls) for the group's launches only: those that carry the group's name tag. Each instance is
launched alone, with

- the private address of a local node: the first of the group's addresses (the master's group: the first
  node; the workers': the nodes after it) that no live instance holds. A terminated instance's address is
  freed first (AWS frees it; moto keeps it taken), so the replacement of a terminated node gets that node;
- what AWS applies from the template and moto leaves out: the market options (spot), the metadata
  options (IMDSv2), the shutdown behaviour, the root volume as the template gives it (moto adds an
  8 GiB default volume besides), the volume tags and the instance profile.

Every other launch (the image build's RunInstances) goes to moto unchanged. It is installed on the
account's EC2 backend when the account starts (tests/rehearsal/account.py); moto's reset removes it.
"""

from __future__ import annotations

import threading
from typing import Any

# moto's own tag on a group's instances (moto.autoscaling.models.ASG_NAME_TAG), as AWS tags them.
GROUP_NAME_TAG = "aws:autoscaling:groupName"
LIVE = ("pending", "running", "stopping", "stopped")


class GroupLaunchDouble:
    """Test double for where and how AWS launches an Auto Scaling group's instances (module docstring)."""

    def __init__(self, backend):
        self.backend = backend
        self.moto_run_instances = backend.run_instances
        self.addresses: dict[str, list[str]] = {}  # group name -> the local nodes its instances stand for
        self.launched: list[tuple[str, str, str]] = []  # (group, instance id, private address), in launch order
        self.lock = threading.Lock()

    @classmethod
    def install(cls, backend) -> "GroupLaunchDouble":
        double = cls(backend)
        backend.run_instances = double.run_instances  # the group calls it through the backend
        return double

    def run_instances(self, image_id: str, count: int, user_data, security_group_names: list, **kwargs: Any):
        tags = dict((kwargs.get("tags") or {}).get("instance", {}))
        if not kwargs.get("launch_template") or GROUP_NAME_TAG not in tags:
            return self.moto_run_instances(image_id, count, user_data, security_group_names, **kwargs)
        group, subnet = tags[GROUP_NAME_TAG], kwargs.get("subnet_id") or ""
        data = self.backend._get_template_from_args(kwargs["launch_template"]).data
        applied = template_settings(data)
        with self.lock:
            reservation = None
            for _ in range(count):
                address = self._free_address(group, subnet)
                made = self.moto_run_instances(
                    image_id, 1, user_data, security_group_names,
                    **{**kwargs, **applied, "private_ip": address,
                       "tags": {"instance": tags, "volume": spec_tags(data, "volume")}})
                instance = made.instances[0]
                profile = (data.get("IamInstanceProfile") or {}).get("Name")
                if profile:
                    self.backend.associate_iam_instance_profile(instance_id=instance.id,
                                                                iam_instance_profile_name=profile)
                if reservation is None:
                    reservation = made
                else:  # one reservation for the launch, as moto's own call makes
                    reservation.instances.append(instance)
                    self.backend.reservations.pop(made.id, None)
                self.launched.append((group, instance.id, address))
        return reservation

    def _free_address(self, group: str, subnet_id: str) -> str:
        pool = self.addresses.get(group)
        if not pool:
            raise RuntimeError(f"the group {group} launches into {subnet_id}, but has no local node for it "
                               "(GroupLaunchDouble.addresses)")
        held = {i.private_ip_address for r in self.backend.reservations.values() for i in r.instances
                if i.state in LIVE}
        free = [a for a in pool if a not in held]
        if not free:
            raise RuntimeError(f"the group {group} launches another instance, but every local node of it "
                               f"({', '.join(pool)}) stands for a live instance")
        subnet = self.backend.get_subnet(subnet_id)
        holder = subnet._subnet_ips.get(free[0])
        if holder is not None and getattr(holder, "state", "") not in LIVE:
            subnet.del_subnet_ip(free[0])  # AWS frees a terminated instance's address
        return free[0]


def spec_tags(data: dict, kind: str) -> dict[str, str]:
    """The template's tags for one resource type (its TagSpecifications)."""
    return {t["Key"]: t.get("Value", "") for spec in data.get("TagSpecifications") or []
            if spec.get("ResourceType") == kind for t in spec.get("Tags") or []}


def template_settings(data: dict) -> dict[str, Any]:
    """moto's run_instances arguments for what AWS applies from a launch template and moto's group omits."""
    applied: dict[str, Any] = {}
    if data.get("InstanceMarketOptions"):
        applied["instance_market_options"] = data["InstanceMarketOptions"]
    if data.get("MetadataOptions"):
        applied["metadata_options"] = data["MetadataOptions"]
    if data.get("InstanceInitiatedShutdownBehavior"):
        applied["instance_initiated_shutdown_behavior"] = data["InstanceInitiatedShutdownBehavior"]
    if data.get("BlockDeviceMappings"):
        applied["block_device_mappings"] = data["BlockDeviceMappings"]
    return applied
