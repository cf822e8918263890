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

# apt-get ARGS, waiting while another apt or dpkg holds its lock (an unattended upgrade, another set-up),
# with one line saying so; its output is shown only when it fails.
apt_get() {
  local out start=$SECONDS said=""
  while ! out=$($SUDO apt-get "$@" 2>&1); do
    if ! printf '%s\n' "$out" | grep -q "Could not get lock"; then printf '%s\n' "$out" >&2; return 1; fi
    if [ $((SECONDS - start)) -ge "${APT_LOCK_WAIT_S:-1800}" ]; then
      echo "== gave up after ${APT_LOCK_WAIT_S:-1800} s waiting for the dpkg lock:" >&2; printf '%s\n' "$out" >&2
      return 1
    fi
    if [ -z "$said" ]; then
      said=$(printf '%s\n' "$out" | sed -n 's/.*held by process \([0-9]*\).*/\1/p' | head -n 1)
      echo "== waiting for the dpkg lock: another apt or dpkg (pid ${said:-unknown}) holds it; trying again every" \
           "${APT_LOCK_POLL_S:-5} s, up to ${APT_LOCK_WAIT_S:-1800} s"
      said=${said:-yes}
    fi
    sleep "${APT_LOCK_POLL_S:-5}"
  done
}

echo "== apt packages (sshd for the local nodes, tcmalloc, iproute2, Debian's python3 and venv, shellcheck)"
apt_get update -qq
tcmalloc=libgoogle-perftools4t64
apt-cache show "$tcmalloc" >/dev/null 2>&1 || tcmalloc=libgoogle-perftools4
apt_get install -y -qq --no-install-recommends \
  openssh-server openssh-client iproute2 util-linux procps "$tcmalloc" \
  python3 python3-venv python3-dev gcc numactl shellcheck ca-certificates
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
echo "== the local nodes' software: the stock profile's wheelhouse and shared venv (about 40 s on a fresh machine)"
"$VENV/bin/python" -m tests.ssh.node_software
echo "== ready: . $VENV/bin/activate (puts fab and python on PATH)"
