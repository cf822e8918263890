#!/bin/sh
# xeon-cluster power-off (cluster/autostop.py POWEROFF_PATH): `xeon-cluster-poweroff MODE`, run on
# every node by the master's auto-stop service (workers over SSH, the master last);
# `xeon-cluster-poweroff mode` prints the mode this node allows.
#   system  `shutdown -h now` (through sudo): the instance shuts down; launched with
#           instance-initiated shutdown behaviour "terminate", EC2 then terminates it
#   local   a local cluster's node: asks the node's own metadata service to take the node down
#           (every process in its network namespace killed, its link down); never a real power-off
# A node inside a network namespace shares the kernel of the machine that runs it, so `system` is
# refused there whatever the caller asked: it is allowed only where this shell provably runs in
# the machine's own network namespace (PID 1's, readable) and in no named one (`ip netns`).
# Header: LOCAL_POWEROFF_PATH (the local metadata service's power-off request).
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
in_namespace() {
  [ -n "$(ip netns identify 2>/dev/null)" ] && return 0
  [ "$(readlink /proc/self/ns/net)" != "$($SUDO readlink /proc/1/ns/net 2>/dev/null)" ]
}
case "${1:-}" in
  mode) if in_namespace; then echo local; else echo system; fi ;;
  system)
    if in_namespace; then
      echo "refused: this node is a network namespace (a local cluster's node): a real power-off would stop the machine under it" >&2
      exit 2
    fi
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
' "$LOCAL_POWEROFF_PATH" ;;
  *) echo "usage: $0 system|local|mode" >&2; exit 2 ;;
esac
