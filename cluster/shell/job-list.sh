#!/bin/sh
# On the master, as `sh -c <this> xeon-cluster` (node_setup/ssh/job.py list_jobs): every job
# directory's records as one JSON object, read by cluster/job/joblist.py:
#   {"now": <epoch seconds>, "jobs": [{"id", "state", "pid", "ended", "stopped", "exit_code", "job_json",
#    "summary", "progress"}, ...]}
# "state" is running, stopped, exited or lost (as job-state.sh says it); "ended" the epoch seconds
# when exit_code (else stopped) was written, or null; "stopped", "exit_code" and "job_json" are the
# first bytes of those files in base64 ("" when there is none), "summary" and "progress" those of
# summary.json (the built-in job's in its output folder, through the directory's `output` link, else
# the one fab writes beside a program of your own) and progress.json in the output folder. Only a
# directory whose name can be a job id and that holds a job.json is listed, so every value written here
# is digits, a fixed word or base64: whatever a file holds, the answer stays JSON and one job's record
# cannot make another's.
# Header: JOBS_DIR.
digits() { head -c 32 "$1" 2>/dev/null | tr -cd 0-9; }
b64() { if [ -f "$1" ]; then head -c "$2" "$1" | base64 | tr -d '\n'; fi; }
printf '{"now": %s, "jobs": [' "$(date +%s)"
sep=""
for d in "$HOME/$JOBS_DIR"/*/; do
  d="${d%/}"; job="${d##*/}"
  if [ ! -d "$d" ] || [ -L "$d" ]; then continue; fi
  # a job's directory holds its job.json from its start; a supervised run's folder of the same id
  # form (its workdir, its data files) holds none: not a job
  if [ ! -f "$d/job.json" ] && [ ! -L "$d/job.json" ]; then continue; fi
  case "$job" in
    [0-9][0-9][0-9][0-9][0-9][0-9][0-9][0-9]-[0-9][0-9][0-9][0-9][0-9][0-9]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]) ;;
    *) continue ;;
  esac
  pid=$(digits "$d/pid")
  if [ -n "$pid" ] && grep -qF "$job" "/proc/$pid/cmdline" 2>/dev/null; then state=running
  elif [ -f "$d/stopped" ]; then state=stopped
  elif [ -f "$d/exit_code" ]; then state=exited
  else state=lost; fi
  summary="$d/output/summary.json"; [ -f "$summary" ] || summary="$d/summary.json"
  ended=""
  for f in "$d/exit_code" "$d/stopped"; do
    if [ -f "$f" ]; then ended=$(date -r "$f" +%s 2>/dev/null | tr -cd 0-9); break; fi
  done
  printf '%s{"id": "%s", "state": "%s", "pid": "%s", "ended": %s, "stopped": "%s", "exit_code": "%s", "job_json": "%s", "summary": "%s", "progress": "%s"}' \
    "$sep" "$job" "$state" "$pid" "${ended:-null}" "$(b64 "$d/stopped" 64)" "$(b64 "$d/exit_code" 64)" \
    "$(b64 "$d/job.json" 65536)" "$(b64 "$summary" 65536)" "$(b64 "$d/output/progress.json" 4096)"
  sep=", "
done
printf ']}\n'
