#!/bin/sh
# xeon-cluster power-off (cluster/node/autostop.py POWEROFF_PATH): `xeon-cluster-poweroff MODE`, run on
# every node by the master's auto-stop service (workers over SSH, the master last);
# `xeon-cluster-poweroff mode` prints the mode this node allows.
#   system  `shutdown -h now` (through sudo): the instance shuts down; launched with
#           instance-initiated shutdown behaviour "terminate", EC2 then terminates it
#   local   a local cluster's node: asks the node's own metadata service to take the node down
#           (every process in its network namespace killed, its link down); never a real power-off
# A node inside a network namespace shares the kernel of the machine that runs it, so `system` is
# refused there whatever the caller asked: it is allowed only where this shell provably runs in the
# machine's own PID namespace (INIT_PID_NS: the kernel's fixed number for the first one; in any
# other, PID 1 is a container's or a node's init, not the machine's), in the network namespace of
# that PID 1 (both readable), and in no named one (`ip netns`). Anything unreadable counts as a node.
# Either way it prints ACK first once the power-off is under way: the master counts a node as
# stopped only when that line came back.
# Header: LOCAL_POWEROFF_PATH (the local metadata service's power-off request), ACK, INIT_PID_NS.
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
in_namespace() {
  [ -n "$(ip netns identify 2>/dev/null)" ] && return 0
  [ "$(readlink /proc/self/ns/pid 2>/dev/null)" = "$INIT_PID_NS" ] || return 0
  own=$(readlink /proc/self/ns/net 2>/dev/null)
  init=$($SUDO readlink /proc/1/ns/net 2>/dev/null)
  [ -z "$own" ] || [ "$own" != "$init" ]
}
case "${1:-}" in
  mode) if in_namespace; then echo local; else echo system; fi ;;
  system)
    if in_namespace; then
      echo "refused: this node is a network or PID namespace (a local cluster's node, a container): a real power-off would stop the machine under it" >&2
      exit 2
    fi
    if [ -n "$SUDO" ] && ! sudo -n true; then echo "refused: sudo -n is not allowed here, so shutdown cannot run" >&2; exit 1; fi
    echo "$ACK system"
    exec $SUDO shutdown -h now ;;
  local)
    # shellcheck disable=SC2016  # Python source, not shell
    exec /usr/bin/python3 -I -c '
import sys, urllib.request as u
o = u.build_opener(u.ProxyHandler({}))
base = "http://169.254.169.254"
token = o.open(u.Request(base + "/latest/api/token", method="PUT",
                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=5).read().decode()
print(o.open(u.Request(base + sys.argv[1], method="PUT", headers={"X-aws-ec2-metadata-token": token}),
             timeout=5).read().decode())
print(sys.argv[2] + " local", flush=True)
' "$LOCAL_POWEROFF_PATH" "$ACK" ;;
  *) echo "usage: $0 system|local|mode" >&2; exit 2 ;;
esac
