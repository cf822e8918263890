#!/bin/bash
# The job script of `fab train --launcher torchrun` (cluster/job/launch.py LaunchPlan.script, planned by
# cluster/job/torchrun.py plan_torchrun_launch): the master runs it detached, from $HOME. It starts one
# torchrun per node, its own locally and every other node's over SSH (the master's ssh config names
# the nodes), labels each agent's own lines "[node torchrun] " (the rank wrapper labels the ranks'
# lines "[node rR] "), and writes its pid, its log and the job's exit code into the job directory:
# with a fixed node count the first non-zero code of any node's torchrun (which ends the others), in
# an elastic run the master's (it holds the rendezvous; another node may leave without ending the job).
# Once the master's torchrun has ended (rank 0 and the rendezvous are done), a node's torchrun still
# running END_WAIT seconds later is ended, and its code no longer changes the job's.
# Header: the exported XEON_CLUSTER_JOB, MASTER_ADDR (the rendezvous host), MASTER_PORT (its port);
# JOB_DIR (relative to $HOME), WORLD_SIZE, RANKS_PER_NODE, NNODES (N or MIN:MAX), ELASTIC (yes/no),
# NODES (node names, master first), COMMANDS (each node's command line, shell-quoted) and
# STOP_COMMAND (what ends a node's torchrun: TERM to the pid it recorded), END_WAIT (seconds), ENV_FILE
# (relative to $HOME: the user's --env as export lines, 0600), which each node's command reads from its
# stdin, so that no value is on the ssh command line; INTERRUPTED (the program's exit code after a spot
# notice) and OUTCOME_PREFIX (the file name's start of a rank's recorded outcome: xeon_cluster/run.py
# record_outcome): rank 0's, when it ran here, is the job's code, as in job.sh.
cd "$HOME" || exit 1
d="$HOME/$JOB_DIR"
echo $$ > "$d/pid"
exec >> "$d/log" 2>&1
set -o pipefail

label() {
  local name
  name=$(printf '%s' "$1" | sed 's/[\/&]/\\&/g')
  sed -u "/^\[[A-Za-z0-9_.-]* r[0-9]*\] /!s/^/[$name torchrun] /"
}

echo "[xeon-cluster] job $XEON_CLUSTER_JOB started $(date -u +%Y-%m-%dT%H:%M:%SZ): $WORLD_SIZE ranks, $RANKS_PER_NODE per node, torchrun --nnodes $NNODES, rendezvous $MASTER_ADDR:$MASTER_PORT"
# Run $2 on node number $1: the master itself, or the others over SSH.
on_node() {
  if [ "$1" = 0 ]; then sh -c "$2"; else ssh -o BatchMode=yes -o ConnectTimeout=10 -- "${NODES[$1]}" "$2"; fi
}
trap ':' TERM  # `fab stop` ends the session: the nodes' codes are still collected and recorded (fab jobs)
pids=()
for i in "${!NODES[@]}"; do
  { on_node "$i" "${COMMANDS[$i]}" <"$HOME/$ENV_FILE" 2>&1 | label "${NODES[$i]}"; exit "${PIPESTATUS[0]}"; } &
  pids+=("$!")
done
# Collect every node's code as it ends. The job ends with the master's torchrun in an elastic run
# (it holds the rendezvous), and with the first failure of any node otherwise: a failure sends the
# other nodes' torchrun TERM at once (STOP_COMMAND: they stop their ranks, as mpirun ends the other
# ranks when one dies); nodes still running END_WAIT seconds after the job's end get it too, and
# END_WAIT seconds later their SSH sessions are closed (a node that is gone cannot hold the job).
codes=(); code=""; over=""; stopped=no; left=${#pids[@]}
stop_others() {
  stopped=yes
  echo "[xeon-cluster] ending torchrun on the nodes still running"
  for j in "${!pids[@]}"; do
    [ -n "${codes[j]+x}" ] || on_node "$j" "$STOP_COMMAND" </dev/null >/dev/null 2>&1 &
  done
}
while [ "$left" -gt 0 ]; do
  for i in "${!pids[@]}"; do
    if [ -n "${codes[i]+x}" ] || kill -0 "${pids[i]}" 2>/dev/null; then continue; fi
    wait "${pids[i]}"; c=$?; codes[i]=$c; left=$((left - 1))
    [ "$c" = 0 ] || echo "[xeon-cluster] node ${NODES[i]}: torchrun exited with code $c"
    if [ "$ELASTIC" != yes ] || [ "$i" = 0 ]; then
      if [ -z "$code" ] || { [ "$code" = 0 ] && [ "$stopped" = no ]; }; then code=$c; fi
      if [ "$i" = 0 ] || [ "$c" != 0 ]; then over=${over:-$SECONDS}; fi
      if [ "$c" != 0 ] && [ "$stopped" = no ] && [ "$left" -gt 0 ]; then stop_others; fi
    fi
  done
  if [ "$left" -gt 0 ] && [ -n "$over" ]; then
    if [ "$stopped" = no ] && [ $((SECONDS - over)) -ge "$END_WAIT" ]; then stop_others; fi
    if [ $((SECONDS - over)) -ge $((2 * END_WAIT)) ]; then
      for i in "${!pids[@]}"; do
        [ -n "${codes[i]+x}" ] && continue
        echo "[xeon-cluster] node ${NODES[i]}: no end after $((2 * END_WAIT)) s; its SSH session is closed"
        pkill -TERM -P "${pids[i]}"; kill -TERM "${pids[i]}" 2>/dev/null
        wait "${pids[i]}"; codes[i]=$?; left=$((left - 1))
      done
    fi
  fi
  [ "$left" = 0 ] || sleep 0.5
done
code=${code:-1}
# rank 0 (on this node) ended INTERRUPTED at a spot notice, its checkpoint saved (its exit code, or the
# outcome it recorded before its exit), and torchrun returned another code (its own 1 for any failed
# worker, ssh's 255 once a reclaimed node was gone): the job's outcome is the program's, the launcher's kept
own=$(cat "$d/ranks/exit-0" 2>/dev/null)
[ "$own" = "$INTERRUPTED" ] || own=$(cat "$d/ranks/${OUTCOME_PREFIX}0" 2>/dev/null)
if [ "$code" != 0 ] && [ "$code" != "$INTERRUPTED" ] && [ "$own" = "$INTERRUPTED" ]; then
  echo "[xeon-cluster] job $XEON_CLUSTER_JOB: rank 0 ended with code $own (interrupted); the launcher returned $code"
  echo "$code" > "$d/launcher_exit_code"; code=$own
fi
echo "[xeon-cluster] job $XEON_CLUSTER_JOB exited with code $code"
echo "$code" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
exit "$code"
