"""Test double: the stack's security groups, enforced for SSH at the local nodes' own sshd.

moto records the groups the program makes but enforces none of them, and the local nodes share
one bridge with no firewall: on its own, the rehearsal would let `fab` reach a node that AWS
would not let it reach. `SshIngressDouble` reads, for each instance, the ingress rules of its
groups that admit TCP port 22 (CIDR ranges, and groups: the addresses of the running instances
that carry them) and writes them as a `from="..."` list on the controller key's line in that
node's own authorized_keys. sshd then refuses the key from any other source, where AWS would
drop the connection: the master takes it from the admin CIDRs and the cluster's members, a
worker from the members only, so `fab` has to reach the workers through the master.
"""

from __future__ import annotations

from pathlib import Path

from node_setup.local.state import ClusterState, NodeState

SSH_PORT = 22


def admits_ssh(permission: dict) -> bool:
    """Whether an ingress permission covers TCP port 22."""
    if permission.get("IpProtocol") == "-1":
        return True
    return (permission.get("IpProtocol") == "tcp"
            and permission.get("FromPort", 0) <= SSH_PORT <= permission.get("ToPort", 65535))


class SshIngressDouble:
    """Test double for the security groups, at SSH: the controller key's `from=` on every node."""

    def __init__(self, ec2, state: ClusterState):
        self.ec2 = ec2
        self.state = state
        self.controller_key = Path(f"{state.key_path}.pub").read_text().split()[1]

    def _running(self) -> list[dict]:
        found = self.ec2.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])
        return [i for r in found["Reservations"] for i in r["Instances"]]

    def sources(self, instance: dict, running: list[dict]) -> list[str]:
        """Where the instance's groups admit SSH from: CIDRs, and the members of referenced groups."""
        group_ids = [g["GroupId"] for g in instance.get("SecurityGroups", [])]
        groups = self.ec2.describe_security_groups(GroupIds=group_ids)["SecurityGroups"] if group_ids else []
        found: list[str] = []
        for group in groups:
            for permission in filter(admits_ssh, group.get("IpPermissions", [])):
                found += [r["CidrIp"] for r in permission.get("IpRanges", [])]
                found += [r["CidrIpv6"] for r in permission.get("Ipv6Ranges", [])]
                for pair in permission.get("UserIdGroupPairs", []):
                    found += [i["PrivateIpAddress"] for i in running
                              if pair["GroupId"] in {g["GroupId"] for g in i.get("SecurityGroups", [])}]
        return sorted(set(found))

    def apply(self) -> dict[str, list[str]]:
        """Limit the controller key on every node that stands for a running instance; node -> sources."""
        running = self._running()
        by_address = {i["PrivateIpAddress"]: i for i in running}
        applied = {}
        for node in self.state.nodes:
            instance = by_address.get(node.address)
            if instance is not None:
                applied[node.name] = self.sources(instance, running)
                self._limit(node, applied[node.name])
        return applied

    def _limit(self, node: NodeState, sources: list[str]) -> None:
        path = Path(node.dir) / "root" / ".ssh" / "authorized_keys"
        lines = []
        for line in path.read_text().splitlines():
            fields = line.split()
            if self.controller_key in fields:
                key = " ".join(fields[fields.index(self.controller_key) - 1:])  # drop any earlier options
                # No source at all: a pattern that matches no address, so the key is refused everywhere.
                line = f'from="{",".join(sources) or "!*"}" {key}'
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
