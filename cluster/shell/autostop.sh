#!/bin/bash
# xeon-cluster idle auto-stop (cluster/node/autostop.py): installed on every node as SERVICE_PATH, acts
# only on the master it was armed on (the hostname recorded when arming; an instance made from the
# image has another). Subcommands:
#   arm IDLE POLL   arm it (seconds), start the loop unless it runs; then `status`
#   arm-default IDLE POLL   the same, unless it is armed or was cancelled on this master
#   cancel          disarm it; then `status`
#   status          key=value lines: armed idle poll mode since deadline running last now powered_off
#                   loop unstopped unstopped_at
#   run             the loop: every POLL seconds, power the cluster off once it is due
# Idle rule (the only implementation): deadline = max(armed at, last activity) + IDLE; due when
# nothing runs and now >= deadline. Activity: the job directories (a job runs while its recorded
# pid runs the job script; its files' times are its activity) and the `fab exec` records (one runs
# while a process with the recorded pid AND start time exists; a stale record is removed).
# Power-off: every worker of the full node list (NODES_FILE, reached through SSH_CONFIG_FILE) and
# of ~/HOSTS_FILE; each counts as stopped once its power-off command answered ACK. The master goes
# last and only when every worker stopped and a full list exists; else UNSTOPPED_FILE names the
# rest (UNLISTED for a missing list), the master stays up, and the next poll tries them again.
# Header: STATE_DIR, JOBS_DIR, ACTIVITY_DIR (relative to $HOME), HOSTS_FILE (in $HOME on the
# master: one alias per line, master first), DEFAULT_POLL, POWEROFF (the power-off command), ACK,
# NODES_FILE SSH_CONFIG_FILE UNSTOPPED_FILE STOPPED_FILE (in STATE_DIR), UNLISTED, STOP_GROUP (sets
# the worker group in GROUP_FILE to 0 before any worker goes: else the group relaunches them;
# refused: GROUP_UNSTOPPED in UNSTOPPED_FILE and nothing powered off), GROUP_FILE, GROUP_UNSTOPPED.
set -uo pipefail
S="$HOME/$STATE_DIR"; J="$HOME/$JOBS_DIR"; A="$HOME/$ACTIVITY_DIR"
mkdir -p "$S" || exit 1

log() { echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $*" >> "$S/log"; }
field() { sed -n "s/^$1=//p" "$S/armed" 2>/dev/null | head -n 1; }
armed_here() { [ -f "$S/armed" ] && [ "$(field host)" = "$(hostname)" ]; }

arm() {  # IDLE POLL
  printf 'idle=%s\npoll=%s\nsince=%s\nhost=%s\nmode=%s\n' "$1" "$2" "$(date +%s)" "$(hostname)" "$("$POWEROFF" mode)" \
    > "$S/armed.tmp" && mv "$S/armed.tmp" "$S/armed" || return 1
  rm -f "$S/cancelled" "$S/powered-off" "$S/$UNSTOPPED_FILE" "$S/$STOPPED_FILE"
  log "armed: idle ${1}s, poll ${2}s, mode $(field mode)"
}

loop_pid() {
  local pid
  pid=$(cat "$S/pid" 2>/dev/null)
  if [ -n "$pid" ] && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q "autostop run"; then echo "$pid"; fi
}

started_at() {  # PID: its start time (field 22 of /proc/PID/stat, after `pid (comm) `), empty if none
  sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20
}

exec_running() {  # RECORD: its command runs (the recorded pid, started when recorded); a stale one is removed
  local pid recorded now_start
  read -r pid recorded < "$1" 2>/dev/null
  now_start=$(started_at "${1##*/exec-}")
  if [ -n "$recorded" ] && [ "$pid" = "${1##*/exec-}" ] && [ "$now_start" = "$recorded" ]; then return 0; fi
  rm -f "$1" && log "removed the stale record ${1##*/} (that command is gone)"
  return 1
}

facts() {  # sets NOW RUNNING LAST ARMED IDLE POLL SINCE MODE DEADLINE
  local d pid f start
  NOW=$(date +%s); RUNNING=0
  for d in "$J"/*/; do
    [ -d "$d" ] || continue
    pid=$(cat "$d/pid" 2>/dev/null)
    if [ -n "$pid" ] && grep -qF "$(basename "$d")" "/proc/$pid/cmdline" 2>/dev/null; then RUNNING=$((RUNNING + 1)); fi
  done
  for f in "$A"/exec-*; do
    [ -f "$f" ] || continue
    if exec_running "$f"; then RUNNING=$((RUNNING + 1)); fi
  done
  LAST=$(find "$J" "$A" -mindepth 1 -maxdepth 2 -printf '%T@\n' 2>/dev/null | sort -n | tail -n 1)
  LAST=${LAST%.*}
  ARMED=no; IDLE=""; POLL=""; SINCE=""; MODE=""; DEADLINE=""
  if armed_here; then
    ARMED=yes; IDLE=$(field idle); POLL=$(field poll); SINCE=$(field since); MODE=$(field mode)
    start=$SINCE
    if [ -n "$LAST" ] && [ "$LAST" -gt "$start" ]; then start=$LAST; fi
    DEADLINE=$((start + IDLE))
  fi
}

status() {
  facts
  printf 'armed=%s\nidle=%s\npoll=%s\nmode=%s\nsince=%s\ndeadline=%s\nrunning=%s\nlast=%s\nnow=%s\n' \
    "$ARMED" "$IDLE" "$POLL" "$MODE" "$SINCE" "$DEADLINE" "$RUNNING" "$LAST" "$NOW"
  printf 'powered_off=%s\nloop=%s\n' "$(cat "$S/powered-off" 2>/dev/null)" "$(loop_pid)"
  printf 'unstopped=%s\nunstopped_at=%s\n' "$(sed -n 's/^node=\([^ ]*\).*/\1/p' "$S/$UNSTOPPED_FILE" 2>/dev/null | tr '\n' ' ')" \
    "$(sed -n 's/^at=//p' "$S/$UNSTOPPED_FILE" 2>/dev/null)"
  printf 'nodes=%s\n' "$(tr '\n' ' ' < "$S/$NODES_FILE" 2>/dev/null)"
}

workers() {  # every worker to stop: the full list's (tagged L) and ~/HOSTS_FILE's (tagged H), once each
  local h
  if [ -f "$S/$NODES_FILE" ]; then tail -n +2 "$S/$NODES_FILE" | while read -r h; do [ -n "$h" ] && echo "L $h"; done; fi
  if [ -f "$HOME/$HOSTS_FILE" ]; then
    tail -n +2 "$HOME/$HOSTS_FILE" | while read -r h; do
      h=${h%%:*}
      [ -n "$h" ] || continue
      grep -qxF "$h" "$S/$NODES_FILE" 2>/dev/null || echo "H $h"
    done
  fi
}

stop_worker() {  # TAG NAME: run the power-off command on it; 0 once it answered ACK
  local out
  if [ "$1" = L ]; then
    out=$(timeout 60 ssh -F "$S/$SSH_CONFIG_FILE" -n -o BatchMode=yes -o ConnectTimeout=10 "$2" "$POWEROFF $MODE" 2>&1)
  else
    out=$(timeout 60 ssh -n -o BatchMode=yes -o ConnectTimeout=10 "$2" "$POWEROFF $MODE" 2>&1)
  fi
  printf '%s\n' "$out" | sed "s/^/  $2: /" >> "$S/log"
  printf '%s\n' "$out" | grep -q "^$ACK" && return 0
  printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1 | tr -d '\n' | cut -c1-200 > "$S/why.$2"
  return 1
}

power_off() {
  local tag h left="" at
  case "$MODE" in system|local) ;; *) log "unknown mode '$MODE': disarmed"; rm -f "$S/armed"; return 1 ;; esac
  log "idle for ${IDLE}s since $((DEADLINE - IDLE)): powering off the cluster (mode $MODE)"
  touch "$S/$STOPPED_FILE"
  if [ -f "$S/$GROUP_FILE" ]; then
    local said
    said=$("$STOP_GROUP" 2>&1); local rc=$?
    printf '%s\n' "$said" | sed 's/^/  group: /' >> "$S/log"
    if [ $rc -ne 0 ]; then
      at=$(date +%s)
      printf 'at=%s\nnode=%s %s\n' "$at" "$GROUP_UNSTOPPED" "$(printf '%s' "$said" | tail -n 1 | cut -c1-200)" \
        > "$S/$UNSTOPPED_FILE.tmp" && mv -f "$S/$UNSTOPPED_FILE.tmp" "$S/$UNSTOPPED_FILE"
      log "worker group not set to 0: no worker powered off, this node stays up, next try in ${POLL:-$DEFAULT_POLL}s"
      return 1
    fi
  fi
  while read -r tag h; do
    grep -qxF "$h" "$S/$STOPPED_FILE" && continue
    log "powering off $h"
    { if stop_worker "$tag" "$h"; then echo "$h" >> "$S/$STOPPED_FILE"; fi; } &
  done < <(workers)
  wait
  while read -r tag h; do
    grep -qxF "$h" "$S/$STOPPED_FILE" && continue
    left="${left}node=$h $(cat "$S/why.$h" 2>/dev/null)"$'\n'
  done < <(workers)
  rm -f "$S"/why.*
  [ -f "$S/$NODES_FILE" ] || left="${left}node=$UNLISTED no full node list on this master"$'\n'
  if [ -n "$left" ]; then
    at=$(date +%s)
    printf 'at=%s\n%s' "$at" "$left" > "$S/$UNSTOPPED_FILE.tmp" && mv -f "$S/$UNSTOPPED_FILE.tmp" "$S/$UNSTOPPED_FILE"
    log "not stopped: $(sed -n 's/^node=//p' "$S/$UNSTOPPED_FILE" | tr '\n' ';'): this node stays up, next try in ${POLL:-$DEFAULT_POLL}s"
    return 1
  fi
  rm -f "$S/$UNSTOPPED_FILE"
  date +%s > "$S/powered-off"
  log "every worker stopped; powering off this node"
  if ! "$POWEROFF" "$MODE" >> "$S/log" 2>&1; then
    log "power-off failed (above): disarmed"
    rm -f "$S/armed" "$S/powered-off"
    return 1
  fi
}

run() {
  exec 9> "$S/lock"
  flock -n 9 || exit 0
  echo $$ > "$S/pid"
  log "service started (pid $$)"
  while :; do
    facts
    if [ "$ARMED" = yes ] && [ ! -f "$S/powered-off" ] && [ "$RUNNING" = 0 ] && [ "$NOW" -ge "$DEADLINE" ]; then
      power_off
    fi
    sleep "${POLL:-$DEFAULT_POLL}"
  done
}

case "${1:-}" in
  arm|arm-default)
    case "${2:-}${3:-x}" in *[!0-9]*) echo "usage: $0 $1 IDLE_SECONDS POLL_SECONDS" >&2; exit 2 ;; esac
    if [ "$1" = arm ] || { ! armed_here && [ ! -f "$S/cancelled" ]; }; then arm "$2" "$3" || exit 1; fi
    if armed_here && [ -z "$(loop_pid)" ]; then setsid nohup /bin/bash "$0" run < /dev/null >> "$S/log" 2>&1 & fi
    i=0; while [ -z "$(loop_pid)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    status ;;
  cancel)
    rm -f "$S/armed"; date +%s > "$S/cancelled"; log "cancelled"
    status ;;
  status) status ;;
  run) run ;;
  *) echo "usage: $0 arm IDLE POLL | cancel | status | run" >&2; exit 2 ;;
esac
