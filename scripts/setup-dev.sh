#!/usr/bin/env bash
# Installs everything the tests and the local cluster need on a fresh Debian/Ubuntu machine (root):
# Debian's packages, then a virtual environment at .venv (Debian's python3; no system `python` or
# pip is needed, and PEP 668's externally-managed system Python is never touched).
# Afterwards: `. .venv/bin/activate` puts `fab` and `python` on PATH, or call .venv/bin/... directly.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
VENV="${XEON_CLUSTER_VENV:-.venv}"
echo "== apt packages (sshd for the local nodes, tcmalloc, iproute2, Debian's python3 and venv, shellcheck)"
$SUDO apt-get update -qq
tcmalloc=libgoogle-perftools4t64
apt-cache show "$tcmalloc" >/dev/null 2>&1 || tcmalloc=libgoogle-perftools4
$SUDO apt-get install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 util-linux procps "$tcmalloc" \
  python3 python3-venv python3-dev gcc numactl shellcheck ca-certificates >/dev/null
echo "== virtual environment $VENV (from /usr/bin/python3)"
[ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
echo "== python packages into $VENV (torch pinned to the CPU wheel)"
"$VENV/bin/python" -m pip install -q "torch==2.13.0" -e ".[dev]"
if [ "${XEON_CLUSTER_SKIP_IPEX:-0}" = 1 ]; then
  echo "== intel profile's stack for the IPEX test: skipped (XEON_CLUSTER_SKIP_IPEX=1); run pytest -m 'not ipex'"
else
  echo "== intel profile's stack for the IPEX test (about 7 GB, ~2 min; XEON_CLUSTER_SKIP_IPEX=1 skips it)"
  "$VENV/bin/python" -m tests.training.ipex_env
fi
echo "== ready: . $VENV/bin/activate (puts fab and python on PATH)"
