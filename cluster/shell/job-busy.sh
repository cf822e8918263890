#!/bin/sh
# On every node before a launch, as `sh -c <this> xeon-cluster JOB` (node_setup/ssh/job.py
# prepare_nodes): one "xeon-cluster busy: <job> script" or "xeon-cluster busy: <job> rank <r>" line
# for each other job that still runs here (its job script on the master, a recorded rank on any
# node); exits 4 when it found one, so that the launch's later steps do not run.
# Header: JOBS_DIR.
new="$1"; found=0
for d in "$HOME/$JOBS_DIR"/*/; do
  d="${d%/}"; job="${d##*/}"
  if [ ! -d "$d" ] || [ -L "$d" ] || [ "$job" = "$new" ]; then continue; fi
  pid=$(cat "$d/pid" 2>/dev/null)
  if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then
    echo "xeon-cluster busy: $job script"; found=1
  fi
  for f in "$d"/ranks/rank-*; do
    [ -f "$f" ] || continue
    read -r rpid _ < "$f"
    if grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$rpid/environ" 2>/dev/null; then
      echo "xeon-cluster busy: $job rank ${f##*/rank-}"; found=1
    fi
  done
done
[ "$found" = 0 ] || exit 4
