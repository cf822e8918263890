#!/bin/sh
# The job's copy of the user's workdir on one node (node_setup/ssh/workdir.py), as
# `sh -c <this> xeon-cluster MODE JOB_DIR WORKDIR` (both relative to $HOME). JOB_DIR/workdir.manifest
# holds "<stored name><TAB><path>" per file (cluster/userjob.py CopyPlan.manifest).
#   missing: print the stored names this node's store lacks (one per line)
#   link:    move newly received files (<name>.part) into the store, read-only, then hard-link
#            every file of the manifest into WORKDIR
# Header: STORE (the content-addressed store, relative to $HOME).
mode="$1"; manifest="$HOME/$2/workdir.manifest"; w="$HOME/$3"; s="$HOME/$STORE"
tab=$(printf '\t')
mkdir -p "$s" || exit 1
if [ "$mode" = missing ]; then
  while IFS="$tab" read -r name _; do [ -e "$s/$name" ] || echo "$name"; done < "$manifest" | sort -u
  exit 0
fi
mkdir -p "$w" || exit 1
n=0
while IFS="$tab" read -r name path; do
  if [ -e "$s/$name.part" ]; then
    case "$name" in *.x) chmod 0555 "$s/$name.part" ;; *) chmod 0444 "$s/$name.part" ;; esac
    mv -f "$s/$name.part" "$s/$name" || exit 1
  fi
  if ! { mkdir -p "$w/$(dirname "$path")" && ln -f "$s/$name" "$w/$path"; }; then
    echo "cannot link $path from $s/$name"; exit 1
  fi
  n=$((n + 1))
done < "$manifest"
echo "linked $n file(s) into ~/$3"
