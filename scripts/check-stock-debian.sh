#!/usr/bin/env bash
# Proves README's two set-up commands on a stock Debian 12: a fresh `debootstrap` chroot (minbase:
# no python, no pip, no git), a clone of this checkout's HEAD in it, then README's commands run
# verbatim as root inside the chroot.
#
#   bash scripts/check-stock-debian.sh [--full] [ROOT]
#
# Default: command 1 verbatim (set-up without the IPEX stack, a 4-node local cluster, the demo
# trained, the cluster removed), then command 2's set-up verbatim and its test command limited to
# the tests that need no local cluster (-m "not ssh and not mpi and not slow and not ipex"), so the
# check takes minutes, not the whole suite's half hour. --full runs command 2 verbatim (the 7 GB
# IPEX stack and the whole suite).
#
# What is carried from this machine into the chroot is only what reaching the package registries
# needs here: /etc/resolv.conf, extra CA certificates (/usr/local/share/ca-certificates), pip's
# configuration (/etc/pip.conf, /etc/xdg/pip, PIP_* variables) and the local wheel folders that
# configuration names (bind-mounted read-only). Nothing of this machine's Python is visible in it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
FULL=0
[ "${1:-}" = "--full" ] && { FULL=1; shift; }
ROOT="${1:-/var/lib/xeon-cluster/stock-debian12}"
INNER="not ssh and not mpi and not slow and not ipex"
SUITE="${XC_DEBIAN_SUITE:-bookworm}"
MIRROR="${XC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
[ "$(id -u)" = 0 ] || { echo "check-stock-debian: run as root (debootstrap and chroot need it)"; exit 2; }
case "$ROOT" in /*) ;; *) echo "check-stock-debian: ROOT must be an absolute path, not '$ROOT'"; exit 2;; esac
[ -e "$ROOT" ] && { echo "check-stock-debian: $ROOT exists; remove it or name another folder (a fresh chroot each time)"; exit 2; }

# README's two commands, exactly as written: the lines after "# 1." and "# 2." in its first block.
command_after() { awk -v tag="# $1." 'index($0, tag) == 1 { getline; print; exit }' README.md; }
CMD1="$(command_after 1)"; CMD2="$(command_after 2)"
if [ -z "$CMD1" ] || [ -z "$CMD2" ]; then echo "check-stock-debian: README.md has no '# 1.'/'# 2.' command lines"; exit 2; fi

MOUNTS=()
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  local i
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${MOUNTS[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind SRC [ro]: SRC at the same path inside the chroot
  mkdir -p "$ROOT$1"; mount --bind "$1" "$ROOT$1"; MOUNTS+=("$ROOT$1")
  [ "${2:-}" = ro ] && mount -o remount,bind,ro "$ROOT$1"
  return 0
}

started=$(date +%s)
mkdir -p "$(dirname "$ROOT")"
echo "== debootstrap $SUITE (minbase) into $ROOT"
command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 \
  || { tail -20 "$ROOT.debootstrap.log"; exit 1; }
for tool in python python3 pip pip3 git; do
  if chroot "$ROOT" /bin/sh -c "command -v $tool" >/dev/null; then echo "   $tool: present"; else echo "   $tool: absent"; fi
done

echo "== mounts, DNS and this machine's registry settings"
# The chroot's / is a mount point of its own, as a real root is (`ip netns exec` re-mounts / as a slave).
mount --bind "$ROOT" "$ROOT"; MOUNTS+=("$ROOT")
mount -t proc proc "$ROOT/proc"; MOUNTS+=("$ROOT/proc")
mount -t sysfs sysfs "$ROOT/sys"; MOUNTS+=("$ROOT/sys")
bind /dev; bind /dev/pts
mount -t tmpfs tmpfs "$ROOT/run"; MOUNTS+=("$ROOT/run")
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# What the Debian installer writes and debootstrap does not: the machine's /etc/hosts.
[ -e "$ROOT/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT/etc/hosts"
# As in any chroot or container build: packages' install scripts must not start daemons (sshd) here.
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"; chmod +x "$ROOT/usr/sbin/policy-rc.d"
[ -d /usr/local/share/ca-certificates ] && cp -r /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOT/etc/pip.conf"
[ -d /etc/xdg/pip ] && { mkdir -p "$ROOT/etc/xdg"; cp -r /etc/xdg/pip "$ROOT/etc/xdg/pip"; }
wheel_dirs="$(env | sed -n 's/^PIP_FIND_LINKS=//p') $(cat /etc/pip.conf /etc/xdg/pip/pip.conf 2>/dev/null \
  | sed -n 's/^[[:space:]]*\(find-links\|extra-index-url\|index-url\)[[:space:]]*=//p')"
for url in $wheel_dirs; do
  dir="${url#file://}"; dir="${dir%/simple}"
  case "$dir" in /*) [ -d "$dir" ] && bind "$dir" ro ;; esac
done

echo "== a clone of this checkout's HEAD ($(git rev-parse --short HEAD)) at /root/xeon-cluster"
git clone -q "$REPO" "$ROOT/root/xeon-cluster"
ENV=(env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 TERM=dumb)
while IFS= read -r var; do ENV+=("$var"); done < <(env | grep -E '^(PIP_|SSL_CERT_|REQUESTS_CA_BUNDLE=|CURL_CA_BUNDLE=)' || true)
in_chroot() { chroot "$ROOT" "${ENV[@]}" /bin/bash -c "cd /root/xeon-cluster && $1"; }

echo "== README command 1, verbatim: $CMD1"
log1="$ROOT.command1.log"
in_chroot "$CMD1" 2>&1 | tee "$log1" | grep -E '^(==|local cluster|layout:|job .* (started|finished|failed)|removed)' || true
grep -q "finished: exit code 0" "$log1" || { echo "FAILED: command 1 did not train (log: $log1)"; tail -30 "$log1"; exit 1; }
grep -q "local cluster 'local' removed" "$log1" || { echo "FAILED: command 1 left its cluster (log: $log1)"; exit 1; }
echo "   command 1: the demo trained on 4 local nodes (exit code 0), cluster removed"

rc=0
if [ "$FULL" = 1 ]; then
  echo "== README command 2, verbatim: $CMD2"
  in_chroot "$CMD2" >"$ROOT.command2.log" 2>&1 || rc=$?
else
  setup2="${CMD2%% && *}"; test2="${CMD2#* && }"
  echo "== README command 2's set-up, verbatim (IPEX stack skipped): $setup2"
  in_chroot "XEON_CLUSTER_SKIP_IPEX=1 $setup2" >"$ROOT.command2.log" 2>&1 || rc=$?
  if [ "$rc" = 0 ]; then
    echo "== README command 2's test command on the tests that need no local cluster: $test2 -m '$INNER'"
    in_chroot "$test2 -q -m '$INNER' -p no:cacheprovider" >>"$ROOT.command2.log" 2>&1 || rc=$?
  fi
fi
grep -E '^(==|[0-9]+ (passed|failed))|passed|failed' "$ROOT.command2.log" | grep -v '^ ' | tail -12
[ "$rc" = 0 ] || echo "FAILED: command 2 exited $rc (log: $ROOT.command2.log)"
echo "== done in $(( $(date +%s) - started )) s; chroot left at $ROOT (remove it with: rm -rf --one-file-system $ROOT)"
exit "$rc"
