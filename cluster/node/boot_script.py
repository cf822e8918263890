"""A worker's first-boot script: the cluster key's authorized_keys line, written by the machine itself.

`fab distribute` writes the cluster key's line on every node the controller knows; the image, built apart
(infra/image.py), holds none. A worker the Auto Scaling group launches later (the replacement of
a reclaimed spot worker) would have no line, and the run supervisor on the master, which holds only the
cluster key, could not reach it. So the workers' launch template carries `boot_script(...)` as its
user data (infra/node_group.py): cloud-init runs it once per instance, as root, and it writes for the SSH
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

import re

from cluster import names, shell
from cluster.node.render import KEY_RESTRICTIONS, RenderError, checked_cidr, checked_public_key, key_comment

SCRIPT = "boot-authorize-key.sh"
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


MASTER_SCRIPT = "boot-master.sh"
_PUBLIC_ED25519 = re.compile(r"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI[A-Za-z0-9+/]{43}=?\Z")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]\Z")
_KIND = re.compile(r"[a-z]{1,16}\Z")


def master_boot_script(*, signer: str, cluster: str, kind: str, ssh_user: str, python: str, store: str = "",
                       region: str = "") -> str:
    """A new master's boot script (the master's launch template's user data on AWS, before base64; the local
    keeper runs it on the new master it brings back): the boot step (node_setup/supervisor/boot.py), which
    continues the cluster's unfinished supervised run. `signer`: the controller's run-spec public key (a spec
    verifies only with it); `store`: the local store double's data directory; `region`: the SSM store's."""
    key = " ".join(str(signer).split()[:2])
    if not _PUBLIC_ED25519.match(key):
        raise RenderError(f"run-spec public key: {str(signer)[:60]!r} is not allowed; allowed: one "
                          "'ssh-ed25519 <base64>' line")
    if not _KIND.match(kind):
        raise RenderError(f"kind: {kind!r} is not allowed; allowed: a cluster kind's name (lower-case letters)")
    if region and not _REGION.match(region):
        raise RenderError(f"region: {region!r} is not allowed; allowed: an AWS region such as us-east-1")
    try:
        user, name = names.user(ssh_user, "sshUser"), names.cluster(cluster)
        names.node_path(python, "python")
        if store:
            names.node_path(store, "store (the local cluster's data directory)")
    except names.UnsafeValue as exc:
        raise RenderError(str(exc)) from None
    return shell.render(MASTER_SCRIPT, {"SSH_USER": user, "PYTHON": python, "CLUSTER": name, "KIND": kind,
                                        "SIGNER": key, "STORE": store, "REGION": region})
