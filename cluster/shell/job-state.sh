#!/bin/sh
# On the master, as `sh -c <this> xeon-cluster JOB` (node_setup/ssh/job.py job_state): one line,
# "running <pid>", "stopped <when>", "exited <code>", "lost" or "missing".
# Header: JOBS_DIR.
job="$1"; d="$HOME/$JOBS_DIR/$job"
[ -d "$d" ] || { echo "missing"; exit 0; }
pid=$(cat "$d/pid" 2>/dev/null)
if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then echo "running $pid"
elif [ -f "$d/stopped" ]; then echo "stopped $(cat "$d/stopped")"
elif [ -f "$d/exit_code" ]; then echo "exited $(cat "$d/exit_code")"
else echo "lost"; fi
