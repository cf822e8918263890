"""A local node's console: the file its start-up writes, read by the controller to verify its host key.

An EC2 instance's console output is written by the instance at boot and read from outside it
(GetConsoleOutput); a local node does the same with a file in its own directory. The node's
start-up (node_setup/local/system.py, inside the node's namespace, before sshd starts) writes its
host key fingerprints and keys there in cloud-init's shape (`WRITE_CONSOLE`), so the controller
reads them as it reads an AWS node's (cluster/node/console.py parses both), and nothing is sent to the
node's metadata address from outside its namespace. `fab local-up` makes a fresh node directory
for every machine it starts, so a node brought back shows its new keys only.

`LocalConsole` is the local cluster's console source for node_setup/ssh/connections.py: the node at
an address (from the cluster's state file), its instance id, and its console's text.
"""

from __future__ import annotations

from pathlib import Path

from cluster.node.console import FINGERPRINTS_BEGIN, FINGERPRINTS_END, KEYS_BEGIN, KEYS_END
from cluster.inventory import Inventory
from node_setup.local.state import ClusterState, NodeState

CONSOLE_FILE = "console.log"  # in the node's directory
WAIT_S = 10.0  # written before sshd starts: there by the time sshd answers
POLL_S = 0.1

# What a node's start-up writes into its console file ($XC_CONSOLE), from its host keys in $XC_ETC:
# `ssh-keygen -l` for the fingerprints behind the tag cloud-init logs them with, then the keys.
WRITE_CONSOLE = (
    '{ echo "' + FINGERPRINTS_BEGIN + '"; for f in "$XC_ETC"/ssh_host_*_key.pub; do ssh-keygen -l -f "$f"; done; '
    'echo "' + FINGERPRINTS_END + '"; } | sed "s/^/ec2: /" > "$XC_CONSOLE"; '
    '{ echo "' + KEYS_BEGIN + '"; cat "$XC_ETC"/ssh_host_*_key.pub; echo "' + KEYS_END + '"; } >> "$XC_CONSOLE"')


def console_path(node: NodeState) -> Path:
    return Path(node.dir) / CONSOLE_FILE


class LocalConsole:
    """The console host keys source of a local cluster (`fab local-up`'s state file next to its key)."""

    kind = "local"

    def __init__(self, inventory: Inventory, *, wait_s: float = WAIT_S, poll_s: float = POLL_S):
        self.wait_s, self.poll_s = wait_s, poll_s
        self.nodes: dict[str, NodeState] = {}
        if inventory.key_path:
            state_path = Path(inventory.key_path).expanduser().parent / "state.json"
            if state_path.exists():
                self.nodes = {n.address: n for n in ClusterState.from_json(state_path.read_text()).nodes}

    def instance(self, address: str) -> str | None:
        """The instance id of the machine at `address` now, or None when the cluster has no such node."""
        node = self.nodes.get(address)
        return node.instance_id if node else None

    def read(self, address: str) -> str:
        """The console's text so far ("" when the node has written none yet)."""
        try:
            return console_path(self.nodes[address]).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def where(self, address: str) -> str:
        return f"console file {console_path(self.nodes[address])}"

    def advice(self, address: str) -> str:
        node = self.nodes[address]
        return (f"compare it with `ssh-keygen -l -f {Path(node.dir) / 'etc' / 'ssh_host_ed25519_key.pub'}`; "
                f"if {node.name} is down or was replaced, `fab local-up` brings it back as a new machine")
