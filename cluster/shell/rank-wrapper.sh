#!/bin/sh
# The rank wrapper (cluster/job/launch.py RANK_WRAPPER), run as: sh -c WRAPPER xeon-rank PROGRAM ARGS
# It travels in mpirun's command line, so it stays short. It exports what PyTorch's own launcher sets
# (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK = GROUP_RANK; from MPI's variables, or
# kept as torchrun set them), XEON_CLUSTER_NOTICE_FILE and XEON_CLUSTER_RANK_DIR (the ranks folder,
# where the runner writes the world record each rank joined); sets GLOO_SOCKET_IFNAME towards
# MASTER_ADDR unless given; for a user's program (XEON_CLUSTER_WORKDIR set) makes
# XEON_CLUSTER_OUTPUT_DIR absolute, enters the job's workdir and, on local rank 0, starts the node's
# spot-notice watcher. Then it runs the program as its child (a user's program runs through
# `python -m xeon_cluster.run`, cluster/job/userjob.py: unchanged, then ended cleanly), records "pid
# pgid host" of the program for fab stop, forwards TERM, INT, HUP, USR1 and USR2 to it, and when it
# fails prints "[xeon-cluster] rank R on host H (pid P): exited with code C" (or "killed by signal
# S"; "on node N" under torchrun; cluster/job/joblog.py failure_report reads it) and exits with the
# program's code, which it also writes to exit-RANK in the ranks folder (the job script reads rank 0's).
# The program's stderr and the wrapper's line go to its stdout: one stream per rank, in
# the order they were written (cluster/job/logstream.py joins a rank's pieces into lines).
# Under torchrun (XEON_CLUSTER_NODE set: the node's name) every line of the program is labelled
# "[N rR] ", as mpirun's -prepend-rank labels it "[R] ", and with XEON_CLUSTER_CPUS (each local
# rank's cores, space-separated) the program runs under `taskset -c` of its local rank's cores.
# Header: JOBS_DIR. Environment: XEON_CLUSTER_JOB, MASTER_ADDR, the MPI rank or torchrun's; for a
# user's program XEON_CLUSTER_WORKDIR, XEON_CLUSTER_OUTPUT_DIR, XEON_CLUSTER_PYTHON,
# XEON_CLUSTER_NOTICE_SIGNAL.
j="$HOME/$JOBS_DIR/$XEON_CLUSTER_JOB"; d="$j/ranks"
RANK="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${RANK:-0}}}"
WORLD_SIZE="${PMI_SIZE:-${OMPI_COMM_WORLD_SIZE:-${WORLD_SIZE:-1}}}"
LOCAL_RANK="${MPI_LOCALRANKID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${LOCAL_RANK:-0}}}"
LOCAL_WORLD_SIZE="${MPI_LOCALNRANKS:-${OMPI_COMM_WORLD_LOCAL_SIZE:-${LOCAL_WORLD_SIZE:-1}}}"
if [ -n "${TORCHELASTIC_RUN_ID:-}" ] && [ -n "${GROUP_RANK:-}" ]; then NODE_RANK=$GROUP_RANK
else NODE_RANK=$((RANK / LOCAL_WORLD_SIZE)); GROUP_RANK=$NODE_RANK; fi
XEON_CLUSTER_NOTICE_FILE="$j/notice"; XEON_CLUSTER_RANK_DIR="$d"
export RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK XEON_CLUSTER_NOTICE_FILE XEON_CLUSTER_RANK_DIR
mkdir -p "$d" || exit 1
if [ -z "${GLOO_SOCKET_IFNAME:-}" ] && command -v ip >/dev/null 2>&1; then
  GLOO_SOCKET_IFNAME=$(ip -o -4 addr show | awk -v a="$MASTER_ADDR" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}')
  [ -n "$GLOO_SOCKET_IFNAME" ] || GLOO_SOCKET_IFNAME=$(ip -o route get "$MASTER_ADDR" | sed -n 's/.* dev \([^ ]*\).*/\1/p')
  export GLOO_SOCKET_IFNAME
fi
if [ -n "${XEON_CLUSTER_WORKDIR:-}" ]; then
  case "${XEON_CLUSTER_OUTPUT_DIR:-}" in /*) ;; *) XEON_CLUSTER_OUTPUT_DIR="$HOME/$XEON_CLUSTER_OUTPUT_DIR" ;; esac
  export XEON_CLUSTER_OUTPUT_DIR
  if [ "$LOCAL_RANK" = 0 ]; then
    (cd / && exec "$XEON_CLUSTER_PYTHON" -I -m xeon_cluster.notice_watch "$j" "$XEON_CLUSTER_NOTICE_SIGNAL") \
      </dev/null >>"$d/watcher.log" 2>&1 &
  fi
  cd "$HOME/$XEON_CLUSTER_WORKDIR" || { echo "rank $RANK: no workdir $HOME/$XEON_CLUSTER_WORKDIR" >&2; exit 2; }
fi
where="host $(hostname)"; label=""
if [ -n "${XEON_CLUSTER_NODE:-}" ]; then where="node $XEON_CLUSTER_NODE"; label="[$XEON_CLUSTER_NODE r$RANK] "; fi
if [ -n "${XEON_CLUSTER_CPUS:-}" ]; then  # torchrun with pinning: this local rank's cores
  cpus=$(printf '%s\n' "$XEON_CLUSTER_CPUS" | cut -d ' ' -f "$((LOCAL_RANK + 1))")
  [ -n "$cpus" ] && set -- taskset -c "$cpus" "$@"
fi
child=""
for s in TERM:15 INT:2 HUP:1 USR1:10 USR2:12; do  # (Linux's numbers)
  # shellcheck disable=SC2064  # the name and number are meant to expand now: one trap per signal
  trap "if [ -n \"\$child\" ]; then kill -${s%:*} \"\$child\" 2>/dev/null; else exit $((128 + ${s#*:})); fi" "${s%:*}"
done
exec 3<&0
if [ -n "$label" ]; then
  fifo="$d/out-$RANK-$$"; rm -f "$fifo"; mkfifo "$fifo" || exit 1
  sed -u "s/^/$(printf '%s' "$label" | sed 's/[\/&]/\\&/g')/" <"$fifo" & labeller=$!
  "$@" <&3 3<&- >"$fifo" 2>&1 &
else  # one stream per rank: mpirun forwards stdout and stderr apart, out of order with each other
  "$@" <&3 3<&- 2>&1 &
fi
child=$!
exec 3<&-
# its process group: the third field after the ")" that ends its name; "-" when the program has already
# ended (and been reaped: waiting for the command substitution reaps any child)
pgid=$(sed 's/.*) //' "/proc/$child/stat" 2>/dev/null | cut -d ' ' -f 3)
echo "$child ${pgid:--} $(hostname)" > "$d/rank-$RANK"
wait "$child" 2>/dev/null; code=$?  # (dash would print "Terminated")
while kill -0 "$child" 2>/dev/null; do wait "$child" 2>/dev/null; code=$?; done
if [ -n "$label" ]; then wait "$labeller"; rm -f "$fifo"; fi
if [ "$code" -gt 128 ] && [ "$code" -lt 160 ]; then how="killed by signal $((code - 128))"
else how="exited with code $code"; fi
[ "$code" = 0 ] || echo "${label}[xeon-cluster] rank $RANK on $where (pid $child): $how"
echo "$code" > "$d/exit-$RANK"
exit "$code"
