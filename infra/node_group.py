"""The cluster's nodes: two Auto Scaling groups of one shape, `NodeGroup` for each role.

- The master: a group of one (min = max = desired = 1). AWS, not `pulumi up`, replaces a lost master (a
  reclaimed spot instance, one that was terminated): the group launches a new one from the same template,
  which boots ready from the image every node boots. On-demand with `masterSpot: false`.
- The workers: a group of `workerCount` (min = max = desired) from one launch template (with `instanceTypes`,
  or `onDemandFallback`, from a mixed instances policy over that template and each listed type:
  cluster/stack/worker_group.py). AWS replaces a reclaimed worker the same way while the others keep running.

Each group's launch template holds the hardening every node shares: the image (the baked one, or the kept
base image without a bake: infra/placement.py), the instance type, spot as a one-time request at the stack's
max price (on-demand with `masterSpot` / `workerSpot: false`), the cluster placement group, IMDSv2 only with
hop limit 1, an encrypted root volume of the stack's size and type, the role's instance profile (the master's
or the workers', infra/node_role.py), shutdown behaviour `terminate`, the role's tags on each instance and its
volume, and a public address in the default VPC. Each role's user data is its own boot: the workers'
first-boot script writes the cluster key's authorized_keys line (cluster/node/boot_script.py; only the public
half, `from=` the cluster's subnet), so a worker the group launches after `fab distribute` ran is reachable from
the master; the master's boot script continues the cluster's unfinished supervised run whose spec verifies with
the controller's run-spec public key (node_setup/supervisor/boot.py).
Both groups are in the kept subnet (infra/placement.py): never two zones.

Every instance of a group gets the same tags: the workers carry no rank tag (discovery orders them by private
address after the master, node_setup/aws/discovery.py); the master, alone in its group, carries rank 0.

How a change reaches the nodes: a group is **replaced, deleting first** (`delete_before_replace`,
`replacement_trigger` on its image, its market, the instance type, the subnet and every other field of the
template but its user data, the fields cluster/stack/node_replacement.py's WORKER_TEMPLATE lists with the
settings each is made from, which `fab preflight` names: not on the template's version, which a new user data
changes too, so another cluster key makes a new version the workers' group launches its next workers from, in
place, and replaces no worker). A new image is made before the groups move and the old image goes last
(infra/image.py). Deleting a group without `force_delete` first sets its capacity to 0 and waits until every
old instance is terminated (the provider's drain), then the new group launches its new ones and `pulumi up`
waits for them (`wait_for_capacity_timeout`). So old and new nodes never run side by side (never more than the
stack's count billing, nor more than the vCPU quota `fab preflight` checked or the placement group's room), and
no old node is left behind. The alternative, an instance refresh with minimum healthy 0 % and maximum healthy
100 %, was not chosen: the provider starts the refresh and returns without waiting for it, so `pulumi up` would
end while old nodes still run (or before a refresh that cannot launch the new image has failed), and a refresh
started while the group is being filled is cancelled or refused. `capacity_rebalance` stays off for the same
reason: it launches a replacement before the at-risk spot instance is gone.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Sequence

import pulumi
import pulumi_aws as aws

from cluster.stack import worker_group as rules
from cluster.stack.catalog import METAL_BOOT_WAIT_S
from cluster.stack.node_replacement import WORKER_TEMPLATE
from cluster.backend import AWS as AWS_KIND
from cluster.node.boot_script import boot_script, master_boot_script
from cluster.node.profiles import venv_dir
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import GROUP_NAME_TAG, PROFILE_KEY, RANK_KEY, ROLE_KEY, ROLE_MASTER, ROLE_WORKER, SSH_USER_KEY
from infra.node import INSTANCE_TIMEOUTS, SHUTDOWN_BEHAVIOR, NodeNetwork, replacement_key

# Canonical's Ubuntu images (and an image baked from one) boot from this device.
ROOT_DEVICE = "/dev/sda1"
# How long `pulumi up` waits for the group's instances to be in service: a metal type's launch and boot.
CAPACITY_TIMEOUT = f"{METAL_BOOT_WAIT_S // 60}m"
# The states of a group's instance that count as the node (a terminated one is gone).
LIVE_STATES = ("pending", "running")


@dataclass(frozen=True)
class Role:
    """What names a group apart from the other: its component type (its URN), its tags' role and rank, and its
    template's description. (Its size and market are the spec's for that role: NodeGroup.)"""
    component: str
    role: str
    rank: int | None
    description: str


MASTER = Role("xeon-cluster:infra:Master", ROLE_MASTER, 0, "its master")
WORKERS = Role("xeon-cluster:infra:Workers", ROLE_WORKER, None, "its workers")


def group_tags(base: dict[str, str], name: str, spec: ClusterSpec, role: Role) -> dict[str, str]:
    """Tags of every instance of the group and its volume: the cluster's, the role (the master's rank), a Name,
    and what discovery reads."""
    tags = {**base, ROLE_KEY: role.role, **({RANK_KEY: str(role.rank)} if role.rank is not None else {}),
            "Name": name}
    tags.update({k: v for k, v in ((SSH_USER_KEY, spec.ssh_user), (PROFILE_KEY, spec.software_profile)) if v})
    return tags


def template_market(spot: bool, max_price: float | None) -> aws.ec2.LaunchTemplateInstanceMarketOptionsArgs | None:
    if not spot:
        return None
    return aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
        market_type="spot",
        spot_options=aws.ec2.LaunchTemplateInstanceMarketOptionsSpotOptionsArgs(
            spot_instance_type="one-time",
            instance_interruption_behavior="terminate",
            max_price=f"{max_price:.4f}" if max_price else None,
        ),
    )


def group_failure_hook(name: str, wanted: int, types: Sequence[str] = (),
                       said: tuple[str, str] = rules.WORKERS_SAID) -> pulumi.ErrorHook:
    """An error hook for the group: a `pulumi up` whose group could not be filled ends with one line naming
    AWS's reason when the provider's error carries a failed scaling activity's message, and what to change;
    a timeout (the provider waits through failed activities: `ignore_failed_scaling_activities`) says that
    the group keeps trying and where its latest activity is shown (`fab up` names it). Nothing is retried
    here: the group itself keeps trying to launch."""

    async def on_error(args: pulumi.ErrorHookArgs) -> bool:
        if args.failed_operation not in ("create", "update") or not args.errors:
            return False
        found = rules.activity_failure(args.errors[0])
        if found:
            pulumi.log.error(rules.failure_line(args.name, wanted, found[1], types, said))
        elif "timeout" in args.errors[0].lower():
            pulumi.log.error(rules.timeout_line(args.name, wanted, CAPACITY_TIMEOUT, said))
        return False

    return pulumi.ErrorHook(f"{name}-capacity-reason", on_error)


def worker_user_data(spec: ClusterSpec, cluster_key: str, subnet_id: pulumi.Input[str]) -> pulumi.Output[str]:
    """The template's user data, base64 as launch templates take it: the first-boot script that writes the
    cluster key's authorized_keys line, `from=` the workers' subnet (cluster/node/boot_script.py)."""
    cidr = aws.ec2.get_subnet_output(id=subnet_id).cidr_block
    return cidr.apply(lambda block: base64.b64encode(
        boot_script(cluster_key, spec.cluster_name, block, spec.ssh_user).encode()).decode())


def master_user_data(spec: ClusterSpec, signer: str) -> str:
    """The master's template's user data, base64: its boot script (cluster/node/boot_script.py), which continues
    the cluster's unfinished supervised run whose spec verifies with `signer`, the controller's run-spec public
    key (node_setup/supervisor/boot.py)."""
    python = f"{venv_dir(spec.profile)}/bin/python"
    script = master_boot_script(signer=signer, cluster=spec.cluster_name, kind=AWS_KIND, ssh_user=spec.ssh_user,
                                python=python, region=spec.region)
    return base64.b64encode(script.encode()).decode()


class NodeGroup(pulumi.ComponentResource):
    """One role's launch template and Auto Scaling group (the module docstring). `user_data`: the workers'
    first-boot script (worker_user_data) or the master's boot script (master_user_data), base64."""

    def __init__(self, name: str, spec: ClusterSpec, *, role: Role, ami: pulumi.Input[str], network: NodeNetwork,
                 instance_profile: pulumi.Input[str], tags: dict[str, str],
                 user_data: pulumi.Input[str] | None = None,
                 hooks: bool = True, opts: pulumi.ResourceOptions | None = None):
        super().__init__(role.component, name, None, opts)
        master = role is MASTER
        instance_tags = group_tags(tags, name, spec, role)
        count, spot = (1, spec.master_spot) if master else (spec.worker_count, spec.worker_spot)
        # The master: one type (the first of instanceTypes) and one market, no policy.
        fallback = not master and spec.on_demand_fallback_s is not None
        policy = not master and rules.uses_policy(spec.types, fallback)
        public = network.public_ip
        # Everything a worker's launch takes from the template but its user data: a change of any of it
        # replaces the group (below); a new user data does not.
        shape: dict[str, Any] = dict(
            instance_type=spec.instance_type,
            key_name=network.key_name,
            # With a public address asked for (the default VPC), the groups go with the interface.
            network_interfaces=[aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                device_index=0, associate_public_ip_address="true", delete_on_termination="true",
                security_groups=list(network.security_group_ids))] if public else None,
            vpc_security_group_ids=None if public else list(network.security_group_ids),
            placement=(aws.ec2.LaunchTemplatePlacementArgs(group_name=network.placement_group)
                       if network.placement_group else None),
            # With a mixed instances policy (several types, or onDemandFallback) its distribution chooses the market
            # (cluster/stack/worker_group.py).
            instance_market_options=None if policy else template_market(spot, spec.spot_max_price),
            instance_initiated_shutdown_behavior=SHUTDOWN_BEHAVIOR,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(name=instance_profile),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    encrypted="true", volume_size=spec.root_volume_gib, volume_type=spec.root_volume_type,
                    delete_on_termination="true"))],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=instance_tags)
                                for kind in ("instance", "volume")],
        )
        self.template = aws.ec2.LaunchTemplate(
            name,
            description=f"xeon-cluster {spec.cluster_name}: {role.description}",
            image_id=ami,
            user_data=user_data,
            tags={**tags, "Name": name},
            update_default_version=True,
            opts=pulumi.ResourceOptions(parent=self),
            **shape)

        # Not the template's version: a new user data (another cluster key) makes one, and must not replace
        # the workers. The subnet is the kept one (infra/placement.py): a zone move replaces both groups.
        # The template's fields are node_replacement's list, the one `fab preflight` names the settings of.
        assert set(shape) == set(WORKER_TEMPLATE), sorted(set(shape) ^ set(WORKER_TEMPLATE))
        trigger: dict[str, Any] = {**replacement_key(spec, spot), "image": self.template.image_id,
                                   "subnet": network.subnet_id,
                                   "template": {k: shape[k] for k in WORKER_TEMPLATE if shape[k] is not None}}
        version = self.template.latest_version.apply(str)
        if policy:  # (a one-type stack's trigger stays as it was: no key added)
            trigger["instanceTypes"] = list(spec.types)
            launch: dict = {"mixed_instances_policy": aws.autoscaling.GroupMixedInstancesPolicyArgs(
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=(
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                            launch_template_id=self.template.id, version=version)),
                    overrides=[aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(instance_type=t)
                               for t in spec.types]),
                instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                    **rules.distribution(spot, spec.spot_max_price)))}
        else:
            launch = {"launch_template": aws.autoscaling.GroupLaunchTemplateArgs(id=self.template.id, version=version)}
        failure = (group_failure_hook(name, count, said=rules.MASTER_SAID) if master
                   else group_failure_hook(name, count, spec.types))
        self.group = aws.autoscaling.Group(
            name,
            min_size=count,
            max_size=count,
            desired_capacity=count,
            vpc_zone_identifiers=[network.subnet_id],
            **launch,
            health_check_type="EC2",
            capacity_rebalance=False,
            # Delete drains: capacity 0, wait until every instance is terminated (see the module docstring).
            force_delete=False,
            wait_for_capacity_timeout=CAPACITY_TIMEOUT,
            # The provider waits through failed scaling activities (a spot launch refused for capacity now
            # may succeed minutes later, and the group keeps trying anyway) until the timeout; `fab up` then
            # names the group's latest activity. Failing at the first one ended `pulumi up` while the group
            # went on to launch the nodes, billed, with nobody told.
            ignore_failed_scaling_activities=True,
            tags=[aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True)
                  for k, v in sorted(instance_tags.items())],
            opts=pulumi.ResourceOptions(
                parent=self,
                delete_before_replace=True,
                replacement_trigger=trigger,
                # onDemandFallback: the on-demand base is `fab up`'s to raise (node_setup/aws/worker_group.py).
                ignore_changes=[rules.FALLBACK_FIELD] if fallback else None,
                custom_timeouts=INSTANCE_TIMEOUTS,
                hooks=pulumi.ResourceHookBinding(on_error=[failure]) if hooks else None))
        outputs: dict[str, pulumi.Input[Any]] = {"groupName": self.group.name, "launchTemplateId": self.template.id}
        if master:
            # The group's instance as it is now (`pulumi up` waited for it: `wait_for_capacity_timeout`): the
            # stack's outputs and the setup step's address. Discovery finds the nodes by their tags instead
            # (node_setup/aws/discovery.py), which also sees a master the group launched since.
            found = aws.ec2.get_instances_output(instance_tags=self.group.name.apply(lambda n: {GROUP_NAME_TAG: n}),
                                                 instance_state_names=list(LIVE_STATES))
            self.instance_id = found.ids.apply(_only)
            self.public_ip = found.public_ips.apply(_only)
            self.private_ip = found.private_ips.apply(_only)
            # The address the controller (and the setup step) connects to: public if it has one.
            self.connect_address = pulumi.Output.all(self.public_ip, self.private_ip).apply(
                lambda ips: ips[0] or ips[1])
            outputs.update(instanceId=self.instance_id, publicIp=self.public_ip, privateIp=self.private_ip)
        self.register_outputs(outputs)


def _only(values: Sequence[str] | None) -> str:
    """The one instance's value ('' while the group has none running)."""
    return values[0] if values else ""
