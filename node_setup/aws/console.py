"""An AWS node's console output (EC2 GetConsoleOutput, Latest=True): where a new node's host key is verified.

cloud-init prints the instance's SSH host key fingerprints and keys to its console at the end of
boot (cluster/node/console.py parses them); EC2 returns that text from outside the instance, over the
authenticated API, so it is the node's own word that no one between the controller and the node
can change. `AwsConsole` is the AWS cluster's console source for node_setup/ssh/connections.py:
the instance at an address (from discovery's Inventory) and its latest console output.

The console output arrives base64-encoded (EC2's API; boto3 does not decode it). It needs the
`ec2:GetConsoleOutput` permission; without it the node is refused with a line saying so.
"""

from __future__ import annotations

import base64
import binascii

from cluster.node.console import ConsoleUnreadable
from cluster.inventory import Inventory, Node
from cluster.stack.catalog import boot_wait_s
from node_setup.aws import clients, errors

POLL_S = 10.0


class AwsConsole:
    """The console host keys source of an AWS cluster."""

    kind = "aws"

    def __init__(self, inventory: Inventory, ec2=None, *, wait_s: float | None = None, poll_s: float = POLL_S):
        """`wait_s`: how long a node's console may take to list its fingerprints (cloud-init prints them at
        the end of boot, after sshd is up): by default as long as the cluster's type boots (a worker that
        `fab up` found in service may still be booting: a metal type's boot takes over 20 minutes)."""
        self.region = inventory.region
        self.wait_s = float(boot_wait_s(inventory.instance_type or "")) if wait_s is None else wait_s
        self.poll_s = poll_s
        self._ec2 = ec2
        self.nodes: dict[str, Node] = {}
        for node in inventory.nodes:
            if node.instance_id:
                self.nodes[node.address] = node
                self.nodes.setdefault(node.private_address, node)

    def _client(self):
        if self._ec2 is None:
            self._ec2 = clients.client("ec2", self.region)
        return self._ec2

    def instance(self, address: str) -> str | None:
        node = self.nodes.get(address)
        return node.instance_id if node else None

    def read(self, address: str) -> str:
        """The instance's latest console output, decoded ("" when EC2 has none yet)."""
        instance_id = self.nodes[address].instance_id
        try:
            answer = self._client().get_console_output(InstanceId=instance_id, Latest=True)
        except clients.AwsSetupError as exc:
            raise ConsoleUnreadable(f"cannot read the console of {instance_id}: {exc}") from None
        except errors.AWS_ERRORS as exc:
            hint = errors.credentials_hint(exc) or (
                f"allow ec2:GetConsoleOutput on {instance_id}: a new node's host key is verified from it"
                if errors.is_denied(exc) else "")
            raise ConsoleUnreadable(f"cannot read the console of {instance_id} ({errors.describe(exc)})"
                                    + (f"; {hint}" if hint else "")) from None
        return decode_output(answer.get("Output") or "")

    def where(self, address: str) -> str:
        return f"EC2 console output of {self.nodes[address].instance_id}"

    def advice(self, address: str) -> str:
        instance_id = self.nodes[address].instance_id
        return (f"see it yourself with `aws ec2 get-console-output --latest --instance-id {instance_id}"
                + (f" --region {self.region}" if self.region else "") + " --output text`")


def decode_output(output: str) -> str:
    """GetConsoleOutput's base64 text as text; text that is not base64 is taken as it is."""
    try:
        return base64.b64decode(output, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        return output
