#!/usr/bin/env bash
# Installs everything the tests and the local cluster need on a fresh Debian/Ubuntu machine (root).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "== apt packages (sshd for the local nodes, tcmalloc, iproute2, Debian's python3 for the node venv, shellcheck)"
$SUDO apt-get update -qq
tcmalloc=libgoogle-perftools4t64
apt-cache show "$tcmalloc" >/dev/null 2>&1 || tcmalloc=libgoogle-perftools4
$SUDO apt-get install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 util-linux procps "$tcmalloc" \
  python3 python3-venv python3-dev numactl shellcheck >/dev/null
echo "== python packages (torch pinned to the CPU wheel)"
python -m pip install -q "torch==2.13.0" -e ".[dev]"
if [ "${XEON_CLUSTER_SKIP_IPEX:-0}" = 1 ]; then
  echo "== intel profile's stack for the IPEX test: skipped (XEON_CLUSTER_SKIP_IPEX=1); run pytest -m 'not ipex'"
else
  echo "== intel profile's stack for the IPEX test (about 7 GB, ~2 min; XEON_CLUSTER_SKIP_IPEX=1 skips it)"
  python -m tests.training.ipex_env
fi
echo "== ready"
