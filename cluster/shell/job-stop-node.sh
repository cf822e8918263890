#!/bin/sh
# On every node, as `sh -c <this> xeon-cluster JOB GRACE` (node_setup/ssh/job.py stop): ends the
# node's torchrun first if the job has one (its elastic agent would restart the ranks; it stops
# them itself on TERM), then the job's recorded rank process groups, then anything still marked with the job id (TERM, then KILL
# after GRACE seconds). Exits 1 if a process of the job is left.
# Header: JOBS_DIR, AGENT_FILE (the torchrun record in the job directory).
job="$1"; grace="$2"; d="$HOME/$JOBS_DIR/$job/ranks"; me=$$
marked() { grep -lxzF "XEON_CLUSTER_JOB=$job" /proc/[0-9]*/environ 2>/dev/null | sed -n 's#^/proc/\([0-9]*\)/environ$#\1#p' | grep -vx "$me"; }
a="$HOME/$JOBS_DIR/$job/$AGENT_FILE"
if [ -f "$a" ]; then
  read -r agent < "$a"
  if grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$agent/environ" 2>/dev/null; then
    kill -TERM "$agent" 2>/dev/null && echo "torchrun: sent TERM to pid $agent"
    i=0; while [ -d "/proc/$agent" ] && [ $i -lt $((grace * 5)) ]; do sleep 0.2; i=$((i + 1)); done
  fi
fi
for f in "$d"/rank-*; do
  [ -f "$f" ] || continue
  read -r pid pgid _ < "$f"
  grep -qxzF "XEON_CLUSTER_JOB=$job" "/proc/$pid/environ" 2>/dev/null || continue
  if [ "${pgid:-0}" -gt 1 ] 2>/dev/null; then kill -s TERM -- "-$pgid" 2>/dev/null; fi
  kill -TERM "$pid" 2>/dev/null
  echo "rank ${f##*/rank-}: sent TERM to pid $pid (group $pgid)"
done
# $left is a list of pids: split on purpose
# shellcheck disable=SC2086
{
  left=$(marked); [ -n "$left" ] && kill -TERM $left 2>/dev/null
  i=0; while [ -n "$(marked)" ] && [ $i -lt $((grace * 5)) ]; do sleep 0.2; i=$((i + 1)); done
  left=$(marked)
  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null; echo "sent KILL to:" $left; sleep 0.5; fi
  left=$(marked)
  if [ -n "$left" ]; then echo "still running:" $left; exit 1; fi
}
echo "no process of job $job left"
