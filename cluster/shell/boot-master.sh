#!/bin/sh
# A new master's boot (cluster/node/boot_script.py's master_boot_script): the master's launch template
# carries this script as its user data on AWS, which cloud-init runs once per instance, as root; the local
# group keeper runs it the same way on the new master it brings back. As SSH_USER, in that user's home, it
# runs the boot step (node_setup/supervisor/boot.py) with the node venv's PYTHON: the cluster key fetched from
# the run store, the unfinished run whose spec verifies with SIGNER found, and its supervisor started, which
# continues the run from its newest checkpoint.
# Header: SSH_USER, PYTHON, CLUSTER, KIND, SIGNER, STORE (the local store double's data directory, or ""),
# REGION (or "").
set -u
home=$(getent passwd "$SSH_USER" | cut -d: -f6)
if [ -z "$home" ] || [ ! -d "$home" ]; then
  echo "xeon-cluster master boot: no home directory for user $SSH_USER" >&2
  exit 1
fi
cd "$home" || exit 1
if [ "$(id -un)" = "$SSH_USER" ]; then
  HOME="$home" exec "$PYTHON" -m node_setup.supervisor.boot "$KIND" "$CLUSTER" "$SIGNER" "$STORE" "$REGION"
fi
exec runuser -u "$SSH_USER" -- env HOME="$home" "$PYTHON" -m node_setup.supervisor.boot "$KIND" "$CLUSTER" \
  "$SIGNER" "$STORE" "$REGION"
