"""A worker's first-boot script: the cluster key's authorized_keys line, written by the machine itself.

`fab distribute` writes the cluster key's line on every node the controller knows; the image, built apart
(infra/image.py), holds none. A worker the Auto Scaling group launches later (the replacement of
a reclaimed spot worker) would have no line, and the run supervisor on the master, which holds only the
cluster key, could not reach it. So the workers' launch template carries `boot_script(...)` as its
user data (infra/workers.py): cloud-init runs it once per instance, as root, and it writes for the SSH
user (cluster/shell/boot-authorize-key.sh)

    from="<the cluster subnet's CIDR>",no-agent-forwarding,no-port-forwarding,no-X11-forwarding <public key>

into ~/.ssh/authorized_keys (0600, ~/.ssh 0700), replacing an older line of the cluster key (the same
comment), so a second run changes nothing. A replacement's address is not known in advance, so
`from=` names the subnet every node of the cluster is in (sshd takes a CIDR in `from=`), where
`fab distribute` names each node's address; the forwarding restrictions are the same
(cluster/node/render.py's KEY_RESTRICTIONS). Only the public half is here: the private half stays on the
controller and the master. The local group keeper (node_setup/local/keeper.py) runs the same script
on the new machines it brings back.

Every value is checked here, whole-value, and the script receives it shell-quoted (cluster.shell).
"""

from __future__ import annotations

import ipaddress
import re

from cluster import names, shell
from cluster.node.render import KEY_RESTRICTIONS, RenderError, checked_public_key, key_comment

SCRIPT = "boot-authorize-key.sh"
# An IPv4 or IPv6 network as `address/length`, in the characters such a network is written with.
_CIDR = re.compile(r"[0-9A-Fa-f.:]+/[0-9]{1,3}\Z")


def checked_cidr(cidr: object, setting: str = "cluster subnet CIDR") -> str:
    """`cidr` when it is a network in its canonical form (`10.0.16.0/20`, no host bits set)."""
    try:
        if not isinstance(cidr, str) or not _CIDR.match(cidr) or str(ipaddress.ip_network(cidr)) != cidr:
            raise ValueError
    except ValueError:
        raise RenderError(f"{setting}: {cidr!r} is not allowed; allowed: a network as address/length with no "
                          "host bits set (e.g. 172.31.16.0/20)") from None
    return cidr


def boot_key_line(public_key: str, cluster: str, cidr: str) -> str:
    """The cluster key's authorized_keys line on a booting worker: `from=` the subnet, no forwarding."""
    key = checked_public_key(public_key)
    mark = key_comment(cluster)
    if not key.endswith(f" {mark}"):
        raise RenderError(f"cluster key: {key[:60]!r} is not allowed; allowed: the key of cluster {cluster!r}, "
                          f"whose comment is {mark!r}")
    return f'from="{checked_cidr(cidr)}",{KEY_RESTRICTIONS} {key}'


def boot_script(public_key: str, cluster: str, cidr: str, ssh_user: str) -> str:
    """The first-boot script (the launch template's user data, before base64)."""
    try:
        user = names.user(ssh_user, "sshUser")
    except names.UnsafeValue as exc:
        raise RenderError(str(exc)) from None
    return shell.render(SCRIPT, {"SSH_USER": user, "LINE": boot_key_line(public_key, cluster, cidr),
                                 "MARK": key_comment(cluster)})
