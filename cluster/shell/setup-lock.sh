#!/bin/bash
# The setup lock (cluster/node/setup_script.py with_setup_lock puts these functions into install.sh
# and install-requirements.sh): the nodes of a local cluster share /opt, so one setup at a time
# writes the shared venv. `setup_lock FILE TIMEOUT` takes FILE's lock on fd 9 and at once writes its
# holder's record into it: "PID START PIDNS" (this shell, its start time, so a recycled pid is not
# taken for it, and the PID namespace that numbers it: each local node has its own), the path that
# exists while the holder's node does (its network namespace's, where it has a named one: a local
# node; else empty), and who it is (LOCK_HOLDER: cluster and checkout, then the node). A waiter says
# who holds the lock, and breaks it when that holder is gone: its process ended (judged only by a
# waiter in the holder's own PID namespace: another node cannot see it, so there its node's
# namespace alone decides) or its node's namespace no longer exists, judged twice a poll apart on
# the same record (a record seen once may be a crashed holder's that the lock's new holder is about
# to replace). Commands run under the lock get fd 9
# closed (`9>&-`), so the lock ends with the shell that took it.
# Header: LOCK_HOLDER.
setup_lock_started() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }

setup_lock_inode() { stat -L -c %d:%i "$1" 2>/dev/null; }

setup_lock_pidns() { readlink /proc/self/ns/pid 2>/dev/null; }

setup_lock_gone() {  # the record names a holder that no longer exists (no record: not judged)
  local pid="" started="" pidns="" alive=""
  { read -r pid started pidns; read -r alive; } <<< "$1"
  case "$pid" in '' | *[!0-9]*) return 1 ;; esac
  if [ -z "$pidns" ] || [ "$pidns" = "$(setup_lock_pidns)" ]; then  # its pid is one this waiter can look up
    [ -e "/proc/$pid" ] || return 0
    if [ -n "$started" ] && [ "$(setup_lock_started "$pid")" != "$started" ]; then return 0; fi  # pid recycled
  fi
  [ -n "$alive" ] && [ ! -e "$alive" ]
}

setup_lock() {
  local file=$1 timeout=$2 waited=0 told="" judged="" record seen who alive
  alive=$(ip netns identify "$$" 2>/dev/null | head -n 1)
  record=$(printf '%s %s %s\n%s\n%s, node %s' "$$" "$(setup_lock_started "$$")" "$(setup_lock_pidns)" \
    "${alive:+/run/netns/$alive}" "$LOCK_HOLDER" "$(hostname)")
  while :; do
    exec 9<>"$file" || return 1
    if flock -n 9; then
      printf '%s\n' "$record" > "/proc/$$/fd/9"  # at once, through the locked file itself
      # held, on the file at that path now (a waiter that broke a lock replaced it), or try again
      [ "$(setup_lock_inode "/proc/$$/fd/9")" = "$(setup_lock_inode "$file")" ] && return 0
      exec 9>&-
      continue
    fi
    seen=$(head -c 2000 "$file" 2>/dev/null)
    who=$(sed -n 3p <<< "$seen")
    who=${who:-a setup that does not name itself}
    if [ -n "$seen" ] && [ "$seen" = "$judged" ] && setup_lock_gone "$seen"; then
      if exec 8<>"$file.break" && flock 8 && [ "$(head -c 2000 "$file" 2>/dev/null)" = "$seen" ] \
          && [ "$(setup_lock_inode "/proc/$$/fd/9")" = "$(setup_lock_inode "$file")" ]; then  # one waiter breaks it
        echo "::xc:: progress lock the setup lock $file was held by $who, which is gone; breaking it"
        rm -f "$file"
      fi
      exec 8>&- 9>&-
      judged=""
      continue
    fi
    judged=""
    if setup_lock_gone "$seen"; then judged=$seen; fi  # gone? judged again at the next poll
    if [ "$who" != "$told" ]; then
      echo "::xc:: progress lock waiting for the setup lock $file (up to ${timeout}s): held by $who"
      told=$who
    fi
    if [ "$waited" -ge "$timeout" ]; then
      echo "::xc:: progress lock gave up after ${timeout}s: the setup lock $file is still held by $who"
      exec 9>&-
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
}
