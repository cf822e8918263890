#!/bin/sh
# On the master, as `sh -c <this> xeon-cluster` (node_setup/ssh/job.py list_jobs): every job
# directory's records in one answer, read by cluster/job/joblist.py. First "now <epoch seconds>", then
# per job "@@job <id>", its state as job-state.sh says it ("running <pid>", "stopped <when>",
# "exited <code>" or "lost"), "ended <epoch>" (when exit_code or stopped was written), its
# job.json between "@@json" and "@@end".
# Header: JOBS_DIR.
echo "now $(date +%s)"
for d in "$HOME/$JOBS_DIR"/*/; do
  d="${d%/}"; job="${d##*/}"
  if [ ! -d "$d" ] || [ -L "$d" ]; then continue; fi
  echo "@@job $job"
  pid=$(cat "$d/pid" 2>/dev/null)
  if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then echo "running $pid"
  elif [ -f "$d/stopped" ]; then echo "stopped $(head -c 64 "$d/stopped" | head -n 1)"
  elif [ -f "$d/exit_code" ]; then echo "exited $(head -c 64 "$d/exit_code" | head -n 1)"
  else echo "lost"; fi
  for f in "$d/stopped" "$d/exit_code"; do
    if [ -f "$f" ]; then echo "ended $(date -r "$f" +%s 2>/dev/null)"; break; fi
  done
  echo "@@json"
  head -c 65536 "$d/job.json" 2>/dev/null
  echo
  echo "@@end"
done
