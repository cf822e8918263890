#!/bin/sh
# The job script (cluster/job/launch.py LaunchPlan.script): the master runs it detached, from $HOME so
# that every rank's working directory exists on every node. It writes its pid, its log (mpirun's
# output), and mpirun's exit code into the job directory.
# Header: the exported environment of mpirun (XEON_CLUSTER_JOB, MASTER_ADDR, MASTER_PORT and the
# flavour's own), JOB_DIR (relative to $HOME), WORLD_SIZE, RANKS_PER_NODE, PATH_PREPEND and
# LD_LIBRARY_PATH_PREPEND (the venv's directories, put in front of the node's own values),
# ONECCL_PYTHON (non-empty: source the oneCCL bindings' setvars.sh, found by this Python),
# HYDRA_IFACE (yes: point Hydra at the interface holding MASTER_ADDR), INTERRUPTED (the program's exit
# code after a spot notice: rank 0's, when mpirun returned another, is the job's), OUTCOME_PREFIX (the file
# name's start of a rank's recorded outcome: xeon_cluster/run.py record_outcome), ENV_FILE (relative
# to $HOME: the user's --env as export lines, 0600; mpirun passes them on by name) and the mpirun
# command line as the positional parameters.
cd "$HOME" || exit 1
d="$HOME/$JOB_DIR"
echo $$ > "$d/pid"
exec >> "$d/log" 2>&1

# The only values that expand here: the node's own PATH and LD_LIBRARY_PATH, extended.
if [ -n "$PATH_PREPEND" ]; then PATH="$PATH_PREPEND:$PATH"; export PATH; fi
if [ -n "$LD_LIBRARY_PATH_PREPEND" ]; then
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH_PREPEND${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; export LD_LIBRARY_PATH
fi

# Called without arguments, so that setvars.sh does not take mpirun's command line for its own.
oneccl_env() {
  # find_spec locates the bindings without importing torch
  ccl_dir=$("$ONECCL_PYTHON" -c "import importlib.util as u; print(u.find_spec('oneccl_bindings_for_pytorch').submodule_search_locations[0])") \
    || { echo "oneccl_bindings_for_pytorch is not installed in the node's venv: run fab setup"; exit 2; }
  # shellcheck source=/dev/null  # a file of the installed bindings, not of this project
  . "$ccl_dir/env/setvars.sh"
}
if [ -n "$ONECCL_PYTHON" ]; then oneccl_env; fi

# Hydra's remote proxies call the launching node back by its host name, which other nodes may not
# resolve (the local cluster's nodes only know themselves); naming the interface that holds
# MASTER_ADDR makes Hydra hand out that address instead.
if [ "$HYDRA_IFACE" = yes ] && [ -z "${I_MPI_HYDRA_IFACE:-}" ] && command -v ip >/dev/null 2>&1; then
  I_MPI_HYDRA_IFACE=$(ip -o -4 addr show | awk -v a="$MASTER_ADDR" '{split($4, p, "/"); if (p[1] == a) {print $2; exit}}')
  if [ -n "$I_MPI_HYDRA_IFACE" ]; then export I_MPI_HYDRA_IFACE; else unset I_MPI_HYDRA_IFACE; fi
fi

echo "[xeon-cluster] job $XEON_CLUSTER_JOB started $(date -u +%Y-%m-%dT%H:%M:%SZ): $WORLD_SIZE ranks, $RANKS_PER_NODE per node, MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
trap ':' TERM  # `fab stop` ends the session: the launcher's code is still recorded (fab jobs shows it)
# shellcheck source=/dev/null  # the job's own env file (cluster/job/launch.py ENV_FILE)
( if [ -e "$HOME/$ENV_FILE" ]; then . "$HOME/$ENV_FILE" || exit 2; fi; exec "$@" )
code=$?
# rank 0 (on this node) ended INTERRUPTED at a spot notice, its checkpoint saved (its exit code, or the
# outcome it recorded before its exit, when the launcher killed it during that exit), and mpirun returned
# another code once a reclaimed node was gone: the job's outcome is the program's, the launcher's kept
own=$(cat "$d/ranks/exit-0" 2>/dev/null)
[ "$own" = "$INTERRUPTED" ] || own=$(cat "$d/ranks/${OUTCOME_PREFIX}0" 2>/dev/null)
if [ "$code" != 0 ] && [ "$code" != "$INTERRUPTED" ] && [ "$own" = "$INTERRUPTED" ]; then
  echo "[xeon-cluster] job $XEON_CLUSTER_JOB: rank 0 ended with code $own (interrupted); the launcher returned $code"
  echo "$code" > "$d/launcher_exit_code"; code=$own
fi
if [ -f "$d/stopped" ]; then echo "[xeon-cluster] job $XEON_CLUSTER_JOB was stopped"; fi  # fab stop marked it
echo "[xeon-cluster] job $XEON_CLUSTER_JOB exited with code $code"
echo "$code" > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
exit "$code"
