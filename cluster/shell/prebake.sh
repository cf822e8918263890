#!/bin/bash
# xeon-cluster pre-bake (cluster/node/setup_script.py prebake_script): removes what must not go into an
# image. SSH host keys move to the stash under /run (tmpfs, never in a snapshot) and, unless
# RESTORE_AFTER is empty, a detached process moves them back that many seconds later.
# Header: ROOT (prefixes every path; empty on a real node), STASH_DIR, RESTORE_AFTER,
# KEY_COMMENT_PREFIX (the comment that marks the cluster key's authorized_keys lines),
# HOME_LEFTOVERS (an array of paths relative to a home directory, glob patterns allowed: the
# credentials, tokens and job artefacts removed from root's and every /home/* directory),
# TOOLKIT_DIR (the toolkit's per-run tree in a home: everything in it is removed but the names in
# the array TOOLKIT_KEPT).
set -uo pipefail
R="$ROOT"
STASH="$R$STASH_DIR"
xc() { echo "::xc:: $*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
shopt -s nullglob

# ---- SSH host keys: a clone must never share them
keys=("$R"/etc/ssh/ssh_host_*)
if [ "${#keys[@]}" -gt 0 ]; then
  if ! { $SUDO mkdir -p "$STASH" && $SUDO chmod 700 "$STASH" && $SUDO mv "${keys[@]}" "$STASH/"; }; then
    xc step prebake failed "cannot move host keys"; exit 40
  fi
  if [ -n "$RESTORE_AFTER" ]; then
    # shellcheck disable=SC2016  # the inner script expands its own arguments, not this shell's
    nohup setsid sh -c 'sleep "$1"; mv -n "$2"/ssh_host_* "$3/etc/ssh/"' xeon-cluster-restore \
      "$RESTORE_AFTER" "$STASH" "$R" >/dev/null 2>&1 </dev/null &
    xc step prebake hostkeys "moved to $STASH; restored in ${RESTORE_AFTER}s"
  else
    xc step prebake hostkeys "moved to $STASH (not restored)"
  fi
else
  xc step prebake hostkeys "none present"
fi

# ---- shell history
hist=("$R"/root/.bash_history "$R"/root/.python_history "$R"/home/*/.bash_history "$R"/home/*/.python_history)
for f in "${hist[@]}"; do [ -e "$f" ] && $SUDO rm -f "$f"; done
xc step prebake history "removed"

# ---- cloud-init per-instance state (clones run cloud-init again as new instances)
if [ -z "$R" ] && command -v cloud-init >/dev/null 2>&1; then $SUDO cloud-init clean --logs >/dev/null 2>&1; fi
$SUDO rm -rf "$R"/var/lib/cloud/instances "$R"/var/lib/cloud/instance "$R"/var/lib/cloud/sem \
  "$R"/var/lib/cloud/data "$R"/var/log/cloud-init.log "$R"/var/log/cloud-init-output.log
xc step prebake cloud-init "per-instance state removed"

homes=("$R"/root "$R"/home/*)

# ---- private keys anywhere under any ~/.ssh, and the cluster key's authorized_keys lines
removed=0
for h in "${homes[@]}"; do
  [ -d "$h/.ssh" ] || continue
  while IFS= read -r -d '' f; do
    if $SUDO grep -qE -- '-----BEGIN ([A-Z]+ )?PRIVATE KEY-----' "$f" 2>/dev/null; then
      $SUDO rm -f "$f" && removed=$((removed+1))
    fi
  done < <($SUDO find "$h/.ssh" -type f -print0)
  [ -f "$h/.ssh/authorized_keys" ] && $SUDO sed -i "/ $KEY_COMMENT_PREFIX/d" "$h/.ssh/authorized_keys"
done
xc step prebake private-keys "removed $removed"

# ---- credentials, tokens and job artefacts in every home directory
gone=()
for h in "${homes[@]}"; do
  for rel in "${HOME_LEFTOVERS[@]}"; do
    # shellcheck disable=SC2206  # the pattern is ours (a glob of HOME_LEFTOVERS), expanded on purpose
    matches=("$h"/$rel)
    for f in "${matches[@]}"; do
      if [ -e "$f" ] || [ -L "$f" ]; then $SUDO rm -rf -- "$f" && gone+=("${f#"$R"}"); fi
    done
  done
done
for h in "${homes[@]}"; do
  for f in "$h/$TOOLKIT_DIR"/* "$h/$TOOLKIT_DIR"/.[!.]* "$h/$TOOLKIT_DIR"/..?*; do
    keep=0
    for k in "${TOOLKIT_KEPT[@]}"; do [ "${f##*/}" = "$k" ] && keep=1; done
    if [ "$keep" = 0 ]; then $SUDO rm -rf -- "$f" && gone+=("${f#"$R"}"); fi
  done
done
xc step prebake leftovers "removed ${#gone[@]}: ${gone[*]:-nothing}"
sync
xc "done" 1
