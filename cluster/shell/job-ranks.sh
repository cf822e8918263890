#!/bin/sh
# On every node, as `sh -c <this> xeon-cluster JOB` (node_setup/ssh/job.py rank_states): the job's
# recorded ranks and whether each still runs, one "<rank> <pid> running|gone" line each.
# Header: JOBS_DIR.
job="$1"; d="$HOME/$JOBS_DIR/$job/ranks"
for f in "$d"/rank-*; do
  [ -f "$f" ] || continue
  read -r pid _ < "$f"
  if grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$pid/environ" 2>/dev/null; then s=running; else s=gone; fi
  echo "${f##*/rank-} $pid $s"
done
