"""The cluster's two Auto Scaling groups in AWS: `worker_group(cluster)` and `master_group(cluster)` say each
one's name, sizes, instances and why it has fewer than it wants (the newest scaling activity, when it failed).

The Pulumi program makes a group of one for the master and one of `workerCount` for the workers per cluster
(infra/node_group.py), tagged like every resource of the cluster (cluster/stack/tags.py) and with the role
their instances carry (ROLE_KEY): a group is told by that tag, never by its name. AWS replaces a reclaimed or
terminated node by itself (the group launches a new one from its template); the idle auto-stop sets the
workers' group's minimum, maximum and desired capacity to 0, then the master's, before the nodes power off
(cluster/node/autostop.py; the master's role may set the two groups to 0 and to nothing else), and
`pulumi up --refresh` sets them back. Readers: `fab status` (`status_lines`), discovery's callers, `fab up`
waiting for the groups to be full (`wait_for_workers`, `wait_for_master`) and `fab train --managed` waiting
for a lost worker's replacement.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from cluster.stack import worker_group as rules
from cluster.stack.tags import CLUSTER_KEY, MANAGED_BY_KEY, MANAGED_BY_VALUE, ROLE_KEY, ROLE_MASTER, ROLE_WORKER
from node_setup.aws import clients

IN_SERVICE = "InService"


@dataclass(frozen=True)
class WorkerGroup:
    name: str
    desired: int
    min_size: int
    max_size: int
    instances: tuple[str, ...]  # instance ids in the group, any lifecycle state
    in_service: tuple[str, ...] = ()
    failure: str | None = None  # the newest scaling activity's message, when it failed
    arn: str = ""
    launch_template: str = ""
    states: dict[str, str] = field(default_factory=dict)  # instance id -> lifecycle state
    types: tuple[str, ...] = ()  # its mixed instances policy's types, in order (() for one launch template type)
    instance_types: dict[str, str] = field(default_factory=dict)  # instance id -> its type, as the group says
    on_demand_base: int = 0  # its policy's on-demand base (onDemandFallback raises it)

    @property
    def stopped(self) -> bool:
        """Set to 0 (the idle auto-stop's minimum, maximum and desired 0; a stack of workerCount 0 looks the
        same): it launches nothing until `pulumi up --refresh`."""
        return self.desired == 0 and self.min_size == 0

    def summary(self) -> str:
        """One line for `fab status`."""
        if self.stopped:
            return (f"worker group {self.name}: stopped (min, max and desired 0, as the idle auto-stop sets it); "
                    "`fab up` (pulumi up --refresh) launches the workers again")
        line = f"worker group {self.name}: {len(self.in_service)} of {self.desired} worker(s) in service"
        if self.types:  # which of its types the group launched
            counts = Counter(self.instance_types.get(i, "?") for i in self.in_service)
            line += (f" ({', '.join(f'{n} {t}' for t, n in sorted(counts.items()))})" if counts else "") + \
                f", from {', '.join(self.types)}"
        if self.on_demand_base:
            line += f"; on-demand base {self.on_demand_base} (onDemandFallback: that many workers on demand)"
        if len(self.in_service) < self.desired:
            pending = [f"{i} {s}" for i, s in sorted(self.states.items()) if s != IN_SERVICE]
            line += (f" ({', '.join(pending)})" if pending else "") + "; AWS launches the missing ones"
            if self.failure:
                line += "; " + rules.failure_line(self.name, self.desired, self.failure, self.types)
        return line


def _tags(group: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in group.get("Tags", [])}


def _groups_of(autoscaling, cluster: str, role: str) -> list[dict]:
    found = []
    for page in autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            Filters=[{"Name": f"tag:{CLUSTER_KEY}", "Values": [cluster]},
                     {"Name": f"tag:{MANAGED_BY_KEY}", "Values": [MANAGED_BY_VALUE]},
                     {"Name": f"tag:{ROLE_KEY}", "Values": [role]}]):
        found.extend(page.get("AutoScalingGroups", []))
    return [g for g in found if _tags(g).get(CLUSTER_KEY) == cluster and _tags(g).get(ROLE_KEY) == role]


def from_record(group: dict, activities: list[dict] | None = None) -> WorkerGroup:
    states = {i["InstanceId"]: i.get("LifecycleState", "") for i in group.get("Instances", [])}
    policy = (group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}
    template = group.get("LaunchTemplate") or policy.get("LaunchTemplateSpecification") or {}
    return WorkerGroup(
        name=group["AutoScalingGroupName"], desired=int(group.get("DesiredCapacity", 0)),
        min_size=int(group.get("MinSize", 0)), max_size=int(group.get("MaxSize", 0)),
        instances=tuple(sorted(states)), in_service=tuple(sorted(i for i, s in states.items() if s == IN_SERVICE)),
        failure=rules.latest_failure(activities or []), arn=group.get("AutoScalingGroupARN", ""),
        launch_template=template.get("LaunchTemplateId", ""), states=states,
        types=tuple(o["InstanceType"] for o in policy.get("Overrides", []) if o.get("InstanceType")),
        instance_types={i["InstanceId"]: i.get("InstanceType", "") for i in group.get("Instances", [])},
        on_demand_base=int(((group.get("MixedInstancesPolicy") or {}).get("InstancesDistribution") or {}).get(
            "OnDemandBaseCapacity") or 0))


def _group(cluster: str, role: str, region: str | None, autoscaling) -> WorkerGroup | None:
    autoscaling = autoscaling or clients.client("autoscaling", clients.resolve_region(region))
    groups = _groups_of(autoscaling, cluster, role)
    if not groups:
        return None
    group = sorted(groups, key=lambda g: g.get("CreatedTime", ""))[-1]  # a replaced group's newest
    activities = autoscaling.describe_scaling_activities(
        AutoScalingGroupName=group["AutoScalingGroupName"], MaxRecords=5).get("Activities", [])
    return from_record(group, activities)


def worker_group(cluster: str, region: str | None = None, autoscaling=None) -> WorkerGroup | None:
    """The cluster's worker group (None when it has none: no stack, or one made before the group)."""
    return _group(cluster, ROLE_WORKER, region, autoscaling)


def master_group(cluster: str, region: str | None = None, autoscaling=None) -> WorkerGroup | None:
    """The cluster's master group, of one (None when it has none: no stack, or one made before it)."""
    return _group(cluster, ROLE_MASTER, region, autoscaling)


def _wait_full(read: Callable[[], WorkerGroup | None], timeout_s: float, poll_s: float,
               sleep: Callable[[float], None], clock: Callable[[], float]) -> WorkerGroup | None:
    deadline = clock() + timeout_s
    while True:
        group = read()
        if group is None or len(group.in_service) >= group.desired or clock() >= deadline:
            return group
        sleep(poll_s)


def wait_for_workers(cluster: str, *, region: str | None = None, timeout_s: float = 2400, poll_s: float = 15,
                     autoscaling=None, sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> WorkerGroup | None:
    """Wait until the group has its desired number of workers in service (a lost one replaced by AWS);
    returns the group as last seen (check `len(in_service) < desired` for a timeout), None without one."""
    return _wait_full(lambda: worker_group(cluster, region, autoscaling), timeout_s, poll_s, sleep, clock)


def wait_for_master(cluster: str, *, region: str | None = None, timeout_s: float = 2400, poll_s: float = 15,
                    autoscaling=None, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> WorkerGroup | None:
    """Wait until the master's group has its master in service (a lost or stopped one launched again by AWS);
    the group as last seen, as `wait_for_workers`."""
    return _wait_full(lambda: master_group(cluster, region, autoscaling), timeout_s, poll_s, sleep, clock)


def set_on_demand_base(name: str, base: int, region: str | None = None, autoscaling=None) -> None:
    """onDemandFallback's act: the group's mixed instances policy with its on-demand base set to `base` (the rest
    of the policy as the group has it: the program's)."""
    autoscaling = autoscaling or clients.client("autoscaling", clients.resolve_region(region))
    (group,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    policy = dict(group["MixedInstancesPolicy"])
    policy["InstancesDistribution"] = {**policy.get("InstancesDistribution", {}), "OnDemandBaseCapacity": base}
    template = policy["LaunchTemplate"]["LaunchTemplateSpecification"]
    if template.get("LaunchTemplateId"):  # described with both; an update takes the id or the name, not both
        policy["LaunchTemplate"] = {**policy["LaunchTemplate"], "LaunchTemplateSpecification": {
            k: v for k, v in template.items() if k != "LaunchTemplateName"}}
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=name, MixedInstancesPolicy=policy)


def status_lines(cluster: str, region: str | None, autoscaling=None) -> tuple[str, str | None]:
    """`fab status`'s line about the worker group (and one about the master's group while it has no master in
    service), and a problem for `--json` when it lacks workers or its master (never raises: a group that cannot
    be read is said so, the rest of the status still shows)."""
    from node_setup.aws import errors

    try:
        group = worker_group(cluster, region, autoscaling)
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        return f"worker group: could not read it ({exc}); allow autoscaling:DescribeAutoScalingGroups", None
    if group is None:
        return "worker group: none (this cluster's workers are not an Auto Scaling group)", None
    line = group.summary()
    short = not group.stopped and len(group.in_service) < group.desired
    master = master_group(cluster, region, autoscaling)
    if master is not None and not master.stopped and len(master.in_service) < master.desired:
        # (a stopped master group goes with the workers': their line says so)
        said = (f"master group {master.name}: no master in service; AWS launches one by itself"
                + (f" ({master.failure})" if master.failure else ""))
        return f"{line}\n{said}", (line if short else said)
    return line, (line if short else None)


def group_file(cluster: str, region: str | None, autoscaling=None) -> dict[str, str]:
    """The auto-stop's record of the worker group and the master's group on the master ({path under home: text};
    {} without a worker group). An AWS error is not hidden: without the record a group would relaunch stopped
    nodes."""
    from cluster.node import autostop

    region = clients.resolve_region(region)
    group = worker_group(cluster, region, autoscaling)
    if group is None:
        return {}
    master = master_group(cluster, region, autoscaling)
    return {f"{autostop.STATE_DIR}/{autostop.GROUP_FILE}": autostop.group_file_text(
        group.name, region, master.name if master else None)}
