#!/bin/sh
# On the master, as `sh -c <this> xeon-cluster JOB` (node_setup/ssh/job.py stop): marks the job
# stopped (unless it already exited) and ends the job script's session (mpirun and its local
# children). Exits 3 when the job is not there.
# Header: JOBS_DIR.
job="$1"; d="$HOME/$JOBS_DIR/$job"
[ -d "$d" ] || { echo "no job $job here"; exit 3; }
[ -f "$d/exit_code" ] || date -u +%Y-%m-%dT%H:%M:%SZ > "$d/stopped"
pid=$(cat "$d/pid" 2>/dev/null)
if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then
  kill -s TERM -- "-$pid" 2>/dev/null; echo "job script (session $pid): sent TERM"
fi
