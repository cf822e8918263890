#!/bin/sh
# The job's copy of the user's workdir on one node (node_setup/ssh/workdir.py), as
# `sh -c <this> xeon-cluster MODE JOB_DIR WORKDIR` (both relative to $HOME). JOB_DIR/workdir.manifest
# holds "<stored name><TAB><path>" per file (cluster/job/userjob.py CopyPlan.manifest).
#   missing: print the stored names this node's store lacks (one per line); a stored file whose
#            content no longer matches its name (its SHA-256) is removed and printed too
#   link:    move newly received files (<name>.part) into the store, read-only, then copy every
#            file of the manifest into WORKDIR (copy-on-write where the filesystem can). A copy, not
#            a hard link: what the job writes into its workdir must reach neither the store nor
#            any other job (root writes through a read-only mode; every empty file has one digest).
# Header: STORE (the content-addressed store, relative to $HOME).
mode="$1"; manifest="$HOME/$2/workdir.manifest"; w="$HOME/$3"; s="$HOME/$STORE"
tab=$(printf '\t')
mkdir -p "$s" || exit 1
if [ "$mode" = missing ]; then
  cut -f1 < "$manifest" | sort -u | while IFS= read -r name; do
    if [ -e "$s/$name" ]; then
      sum=$(sha256sum < "$s/$name") && [ "${sum%% *}" = "${name%.x}" ] && continue
      rm -f "$s/$name" || exit 1
    fi
    echo "$name"
  done
  exit $?
fi
mkdir -p "$w" || exit 1
n=0
while IFS="$tab" read -r name path; do
  if [ -e "$s/$name.part" ]; then
    chmod 0444 "$s/$name.part" && mv -f "$s/$name.part" "$s/$name" || exit 1
  fi
  case "$name" in *.x) m=0755 ;; *) m=0644 ;; esac
  if ! { mkdir -p "$w/$(dirname "$path")" && cp -f --reflink=auto "$s/$name" "$w/$path" \
         && chmod "$m" "$w/$path"; }; then
    echo "cannot copy $path from $s/$name"; exit 1
  fi
  n=$((n + 1))
done < "$manifest"
echo "copied $n file(s) into ~/$3"
