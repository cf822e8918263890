"""The master's local node made safe for the setup step's pre-bake cleanup, which runs for real.

A local node shares this machine's filesystem except its own /root and /etc/hosts
(docs/design.md, "The local cluster"). The pre-bake cleanup (cluster/shell/prebake.sh) acts on what
a VM has of its own: it moves /etc/ssh/ssh_host_* to /run/xeon-cluster, and removes shell history,
private keys and credentials under every /home/* and cloud-init's state. Run as it is on a local
node, it would do that to this machine. So, before `pulumi up`, the master's node gets a VM's own
copies of those places, mounted inside its mount namespace only (it was made with private
propagation, so nothing shows outside it, and all of it goes when the node's namespace does):

- /etc/ssh: a copy of this machine's /etc/ssh without its host keys, plus the node's own host key
  pair as ssh_host_ed25519_key (what the cleanup moves away and back);
- /home and /run/xeon-cluster (where the host keys are parked): empty tmpfs;
- /var/lib/cloud (tmpfs), the cloud-init logs (/dev/null) and the cloud-init command (/bin/true),
  where this machine has them: the local node runs no cloud-init.

The node's sshd keeps serving its own host key from the node's directory (not /etc/ssh), so the
five minutes in which a real master refuses new SSH connections after the cleanup (its host keys
parked in /run) are not rehearsed here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from cluster.node.setup_script import PREBAKE_KEY_STASH
from node_setup.local.state import NodeState

HOST_KEY_STASH_PARENT = Path("/run/xeon-cluster")

_MOUNTS = r"""
set -eu
mount --bind "$1" /etc/ssh
mount -t tmpfs -o mode=0755,size=16m xc-rehearsal-home /home
mkdir -p /run/xeon-cluster
mount -t tmpfs -o mode=0700,size=16m xc-rehearsal-run /run/xeon-cluster
if [ -d /var/lib/cloud ]; then mount -t tmpfs -o mode=0755,size=16m xc-rehearsal-cloud /var/lib/cloud; fi
for f in /var/log/cloud-init.log /var/log/cloud-init-output.log; do
  if [ -f "$f" ]; then mount --bind /dev/null "$f"; fi
done
c=$(command -v cloud-init || true)
if [ -n "$c" ]; then mount --bind /bin/true "$c"; fi
"""


class MasterNodeSandbox:
    """Own /etc/ssh, /home, /run/xeon-cluster (and cloud-init's places) for one local node."""

    def __init__(self, node: NodeState, workdir: Path):
        self.node = node
        self.etc_ssh = workdir / f"{node.name}-etc-ssh"
        self.made_stash_parent = False

    def apply(self) -> str:
        if not shutil.which("nsenter"):
            raise RuntimeError("nsenter not found (install util-linux): the master's node cannot get its own /etc/ssh")
        shutil.copytree("/etc/ssh", self.etc_ssh, ignore=shutil.ignore_patterns("ssh_host_*"), symlinks=True)
        node_etc = Path(self.node.dir) / "etc"
        for suffix in ("", ".pub"):
            shutil.copy2(node_etc / f"ssh_host_ed25519_key{suffix}", self.etc_ssh / f"ssh_host_ed25519_key{suffix}")
        self.made_stash_parent = not HOST_KEY_STASH_PARENT.exists()
        subprocess.run(["nsenter", "-t", str(self.node.sshd_pid), "-m", "--", "sh", "-c", _MOUNTS, "sandbox",
                        str(self.etc_ssh)], check=True, capture_output=True, text=True, timeout=30)
        return (f"{self.node.name} has its own /etc/ssh (its host key), /home and /run/xeon-cluster "
                "in its mount namespace")

    def parked_host_keys(self) -> list[str]:
        """The host keys the pre-bake cleanup parked in the node's /run (empty if it did not run)."""
        listed = subprocess.run(["nsenter", "-t", str(self.node.sshd_pid), "-m", "--", "ls", PREBAKE_KEY_STASH],
                                capture_output=True, text=True, timeout=30)
        return sorted(listed.stdout.split()) if listed.returncode == 0 else []

    def cleanup(self) -> None:
        """After the node is gone: the empty mount point this made under /run, if it made one."""
        if self.made_stash_parent:
            try:
                HOST_KEY_STASH_PARENT.rmdir()
            except OSError:
                pass
