#!/bin/sh
# On the master before a launch, as `sh -c <this> xeon-cluster JOB TTL` (cluster/job/jobcommands.py
# claim_command; `release` as the second word: `sh -c <this> xeon-cluster JOB release`): claims the
# cluster's next launch for JOB, so that the busy check and the start of two launches at once cannot
# interleave. Under flock(1) on one lock file, a claim file ("<job> <epoch seconds>") is read and
# written: another job's claim holds while that job has not started (no pid file in its directory)
# and is younger than TTL seconds, and then this prints "xeon-cluster busy: <job> launching" and exits
# 4; otherwise the claim becomes JOB's. A started job is the busy check's (job-busy.sh), so its claim
# no longer counts; the start command and a failed launch release it (only JOB's own).
# Header: JOBS_DIR.
new="$1"; ttl="$2"; root="$HOME/$JOBS_DIR"; claim="$root/launch-claim"
mkdir -p "$root" || exit 1
exec 9>>"$root/launch-claim.lock" || exit 1
flock -w 60 9 || { echo "cannot take the launch lock $root/launch-claim.lock within 60 s"; exit 1; }
other=""; since=0
if [ -f "$claim" ]; then read -r other since < "$claim" || true; fi
case "$since" in ''|*[!0-9]*) since=0 ;; esac
if [ "$ttl" = release ]; then
  if [ "$other" = "$new" ]; then rm -f "$claim"; fi
  exit 0
fi
now=$(date +%s)
if [ -n "$other" ] && [ "$other" != "$new" ] && [ ! -s "$root/$other/pid" ] && [ $((now - since)) -lt "$ttl" ]; then
  echo "xeon-cluster busy: $other launching"
  exit 4
fi
echo "$new $now" > "$claim.tmp" && mv "$claim.tmp" "$claim"
