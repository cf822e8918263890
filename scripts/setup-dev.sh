#!/usr/bin/env bash
# Installs everything the tests and the local cluster need on a fresh Debian/Ubuntu machine (root).
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "== apt packages (sshd for the local nodes, tcmalloc, iproute2, Debian's python3 for the node venv)"
$SUDO apt-get update -qq
tcmalloc=libgoogle-perftools4t64
apt-cache show "$tcmalloc" >/dev/null 2>&1 || tcmalloc=libgoogle-perftools4
$SUDO apt-get install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 util-linux procps "$tcmalloc" \
  python3 python3-venv python3-dev numactl >/dev/null
echo "== python packages (torch pinned to the CPU wheel)"
python -m pip install -q "torch==2.13.0" -e ".[dev]"
echo "== ready"
