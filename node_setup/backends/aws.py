"""The backend of an AWS cluster: EC2 instances found by their tags (node_setup/aws/).

Discovered by the tags the Pulumi program writes (node_setup/aws/discovery.py); a lost worker is
replaced by the workers' Auto Scaling group; a new node's host keys are in its console
(GetConsoleOutput); prices are AWS's (node_setup/aws/pricing.py); the supervisor is a systemd
unit. boto3 is imported inside the methods only (`fab --list` loads none; the supervisor on the
master has it in the node venv). `AwsGroup` is not run against AWS here; the same loop is
rehearsed on the local cluster.
"""

from __future__ import annotations

from typing import Any

from cluster.backend import AWS, BackendError, ConsoleSource, NodePrice, PreflightReport
from cluster.cost import spend
from cluster.inventory import Inventory, Node
from cluster.run.supervision import Member
from node_setup.backends.inventory import StaticGroup
from node_setup.backends.members import checked_group, checked_member


class AwsGroup:
    """The workers' Auto Scaling group, read with the node role (boto3 in the node venv).

    A lost worker's slot is filled by the group's newest in-service instance that is no member yet; a
    replacement the supervisor refuses (or a worker `fab up` cannot reach to arm) is handed back (`hand_back`:
    terminated through the group, which launches another; the master's role may make that call on its own
    group only).
    """

    def __init__(self, region: str, group_name: str, members: list[Member]):
        self.group_name, self.region = checked_group(group_name, region)
        self._known = {m.instance_id: m for m in members}
        self._clients: dict[str, object] = {}

    def _client(self, service: str) -> Any:
        if service not in self._clients:
            import boto3  # the node venv has it (the training profile)

            self._clients[service] = boto3.client(service, region_name=self.region)
        return self._clients[service]

    def members(self) -> dict[str, Member]:
        groups = self._client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.group_name]).get("AutoScalingGroups") or []
        ids = [i["InstanceId"] for g in groups for i in g.get("Instances", [])
               if i.get("LifecycleState") == "InService"]
        found = {m.name: m for m in self._known.values()}
        new = []
        if ids:
            answer = self._client("ec2").describe_instances(InstanceIds=ids)
            for reservation in answer.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    if instance["InstanceId"] not in self._known and instance.get("PrivateIpAddress"):
                        new.append(instance)
        taken = {m.name for m in self._known.values() if m.instance_id in ids}
        free = sorted(n for n in found if n not in taken)
        for instance, slot in zip(sorted(new, key=lambda i: str(i.get("LaunchTime"))), free):
            member = checked_member({"name": slot, "address": instance["PrivateIpAddress"],
                                     "instance_id": instance["InstanceId"],
                                     "state": instance.get("State", {}).get("Name"),
                                     "instance_type": instance.get("InstanceType")}, "EC2 instance")
            self._known[member.instance_id] = member
            found[slot] = member
        return found

    def instance_state(self, member: Member) -> str | None:
        answer = self._client("ec2").describe_instances(InstanceIds=[member.instance_id])
        for reservation in answer.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return instance.get("State", {}).get("Name")
        return "gone"

    def console(self, member: Member) -> str:
        from node_setup.aws.console import decode_output

        answer = self._client("ec2").get_console_output(InstanceId=member.instance_id, Latest=True)
        return decode_output(answer.get("Output") or "")

    def replaces_lost(self) -> bool:
        return True  # the group launches a lost worker's replacement

    def hand_back(self, member: Member) -> str:
        try:  # without lowering the group's desired capacity: it launches another in its place
            self._client("autoscaling").terminate_instance_in_auto_scaling_group(
                InstanceId=member.instance_id, ShouldDecrementDesiredCapacity=False)
        except Exception as exc:  # noqa: BLE001 - botocore's errors, said in the run's log
            why = (str(exc).splitlines() or [type(exc).__name__])[0]
            return (f"could not hand it back to the group {self.group_name} ({why}): it runs, "
                    f"billed, until it is terminated (`aws ec2 terminate-instances --instance-ids "
                    f"{member.instance_id}`)")
        return f"handed back: terminated through the group {self.group_name}, which launches another"


class AwsBackend:
    kind = AWS

    def discover(self, target: str | None, region: str | None = None) -> Inventory:
        from node_setup.aws.discovery import find_cluster

        return find_cluster(target, region)

    def console_source(self, inventory: Inventory) -> ConsoleSource | None:
        from node_setup.aws.console import AwsConsole

        return AwsConsole(inventory)

    def price_book(self, inventory: Inventory) -> Any:
        """AWS's prices for the cluster's region (node_setup/aws/pricing.py), or why there are none."""
        from node_setup.aws import clients, pricing

        try:
            return pricing.PriceBook(clients.resolve_region(inventory.region))
        except clients.AwsSetupError as exc:
            return f"no price: {exc}"

    def node_price(self, book: Any, node: Node, instance_type: str | None) -> NodePrice:
        if isinstance(book, str):
            return None, book
        if not instance_type:
            return None, f"no price: {node.name} has no instance type"
        from node_setup.aws import clients, errors

        try:
            found = book.price(instance_type, spot=bool(node.spot), zone=node.zone)
        except (LookupError, clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
            return None, f"no price for {instance_type}: {str(exc)[:200]}"
        return found.usd_per_hour, f"{instance_type}: {found.source}"

    def run_context(self, inventory: Inventory, autoscaling: Any = None) -> dict[str, Any]:
        """The cluster's worker group for the supervisor: {"worker_group": its name, "region": its region},
        each checked whole, so that it waits for the group's replacement of a lost worker; {} for a cluster
        without a group (its survivors go on)."""
        from node_setup.aws import clients, errors
        from node_setup.aws.worker_group import worker_group

        try:
            region = clients.resolve_region(inventory.region)
            group = worker_group(inventory.name, region, autoscaling)
        except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
            raise BackendError(f"worker group of {inventory.name}: could not read it ({exc}); the supervisor needs "
                               "it to wait for a lost worker's replacement (allow "
                               "autoscaling:DescribeAutoScalingGroups)", unreachable=True) from None
        if group is None:
            return {}
        try:
            name, region = checked_group(group.name, region)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        return {"worker_group": name, "region": region}

    def machine_group(self, spec: dict[str, Any], members: list[Member]) -> tuple[Any, list[Member]]:
        if spec.get("worker_group"):
            return AwsGroup(spec["region"], spec["worker_group"], members), members
        return StaticGroup(members), members  # a stack made before the group: the survivors go on

    def supervisor_as_service(self) -> bool:
        return True  # a machine of its own: a transient systemd unit

    def preflight_for_run(self, inventory: Inventory) -> PreflightReport | None:
        from node_setup.aws.train_checks import preflight_for_train

        return preflight_for_train(inventory)

    def default_idle_stop(self, inventory: Inventory) -> int | None:
        from node_setup.stack_config import stack_auto_stop_idle

        return stack_auto_stop_idle(inventory.name)

    def idle_stop_files(self, inventory: Inventory) -> dict[str, str]:
        from node_setup.aws.worker_group import group_file

        return group_file(inventory.name, inventory.region)

    def group_status(self, inventory: Inventory) -> tuple[str, str | None] | None:
        from node_setup.aws.worker_group import status_lines

        return status_lines(inventory.name, inventory.region)

    def compiles_bytecode(self) -> bool:
        return True  # baked into the image: the jobs' user cannot write it

    def copies_wheelhouse(self) -> bool:
        return True

    def market(self, node: Node) -> str | None:
        return None if node.spot is None else spend.SPOT if node.spot else spend.ON_DEMAND

    def link_limit(self, inventory: Inventory) -> str:
        return ""

    def measured_type(self, inventory: Inventory) -> str:
        return inventory.instance_type or ""

    def history_identity(self, inventory: Inventory) -> str:
        return ""

    def planned_machine(self) -> tuple[str, int] | None:
        return None

    def run_store(self, cluster: str, *, data_dir: str = "", region: str | None = None) -> Any:
        from node_setup.aws.run_secrets import SsmStore

        return SsmStore(cluster, region)

    def cluster_network(self, inventory: Inventory, ec2: Any = None) -> tuple[str, tuple[str, ...]] | None:
        """The master's subnet (EC2: its instance's subnet's CIDR block), where the stack's master group brings a
        new master up at an address of its own; None when EC2 does not say (then `from=` the nodes' addresses)."""
        from cluster.node.render import RenderError, checked_cidr
        from node_setup.aws import clients, errors

        master = inventory.master.instance_id
        if not master:
            return None
        try:
            ec2 = ec2 or clients.client("ec2", inventory.region)
            reservations = ec2.describe_instances(InstanceIds=[master])["Reservations"]
            subnet = reservations[0]["Instances"][0]["SubnetId"]
            return checked_cidr(ec2.describe_subnets(SubnetIds=[subnet])["Subnets"][0]["CidrBlock"]), ()
        except (clients.AwsSetupError, RenderError, LookupError, *errors.AWS_ERRORS):
            return None
