#!/bin/bash
# xeon-cluster install (cluster/node/setup_script.py install_script): the profile's OS packages, the
# shared venv, this project's wheel. Reports through `::xc::` lines (parse_events).
# Header: APT_LOCK_TIMEOUT APT_ATTEMPTS APT_RETRY_DELAY VENV_LOCK_TIMEOUT NODE_ROOT VENV OS_PYTHON
# PROFILE DIGEST PROFILE_MARKER PROJECT_MARKER PROJECT_WHEEL PROJECT_VERSION (and the setup lock's), and the arrays
# APT_PACKAGES TCMALLOC_PACKAGES PIP_SOURCE (pip's options for the pins: none, PyPI alone; or the
# wheelhouse) PIP_COMPILE (none, or --no-compile: the jobs' first imports write the bytecode) INDEX_URLS
# INDEX_REQUIREMENTS (the index-only packages: each requirement line, with its hashes, installed from its
# index alone, first) PINS.
# The commands down to the first blank line are its preamble (cluster.shell.preamble), which
# autostop's own install script (cluster/node/autostop.py install_script) starts with too.
set -uo pipefail
CHANGED=0
xc() { echo "::xc:: $*"; }
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi

apt_get() {  # apt-get that waits for the dpkg lock, then retries a bounded number of times
  local attempt out rc
  for attempt in $(seq 1 "$APT_ATTEMPTS"); do
    out=$($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_TIMEOUT" "$@" 2>&1)
    rc=$?
    [ -n "$out" ] && printf '%s\n' "$out"
    [ "$rc" = 0 ] && return 0
    if printf '%s' "$out" | grep -qiE 'could not get lock|unable to acquire the dpkg|unable to lock'; then
      if [ "$attempt" -lt "$APT_ATTEMPTS" ]; then
        xc progress apt "the dpkg lock is held by another process (unattended-upgrades?); retry $attempt/$((APT_ATTEMPTS - 1)) in ${APT_RETRY_DELAY}s"
        sleep "$APT_RETRY_DELAY"
        continue
      fi
      xc step apt failed "the dpkg lock was still held after $APT_ATTEMPTS attempts"
      return "$rc"
    fi
    return "$rc"
  done
  return 1
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
known_to_apt() { apt-cache policy "$1" 2>/dev/null | grep -q 'Candidate: [^(]'; }

# ---- 1. OS packages: tcmalloc (first name apt knows) and the profile's packages, only if missing
need=()
for p in "${APT_PACKAGES[@]}"; do installed "$p" || need+=("$p"); done
tcmalloc=""
for p in "${TCMALLOC_PACKAGES[@]}"; do if installed "$p"; then tcmalloc="$p"; break; fi; done
if [ -n "$tcmalloc" ] && [ "${#need[@]}" = 0 ]; then
  xc step apt unchanged "tcmalloc ($tcmalloc) and ${APT_PACKAGES[*]} already installed"
else
  wanted="${need[*]}"; [ -n "$tcmalloc" ] || wanted="$wanted tcmalloc"
  xc progress apt "installing:$wanted"
  apt_get update -qq || { xc step apt failed "apt-get update failed"; exit 10; }
  if [ -z "$tcmalloc" ]; then
    for p in "${TCMALLOC_PACKAGES[@]}"; do if known_to_apt "$p"; then tcmalloc="$p"; break; fi; done
    [ -n "$tcmalloc" ] || { xc step apt failed "apt knows none of ${TCMALLOC_PACKAGES[*]} (tcmalloc)"; exit 11; }
    need+=("$tcmalloc")
  fi
  apt_get install -y -qq --no-install-recommends "${need[@]}" || { xc step apt failed "apt-get install ${need[*]} failed"; exit 12; }
  xc step apt changed "installed ${need[*]}"
  CHANGED=1
fi

# ---- 2. the venv, from the OS Python, shared by every node that sees the same /opt
[ -x "$OS_PYTHON" ] || { xc step venv failed "$OS_PYTHON not found: install python3 and python3-venv"; exit 20; }
case "$(readlink -f "$OS_PYTHON")" in
  /root/*) xc step venv failed "$OS_PYTHON resolves under /root; the nodes need an OS Python"; exit 21 ;;
esac
if [ ! -d "$NODE_ROOT" ] || [ ! -w "$NODE_ROOT" ]; then
  if ! { $SUDO mkdir -p "$NODE_ROOT" && $SUDO chown "$(id -u):$(id -g)" "$NODE_ROOT"; }; then
    xc step venv failed "cannot create $NODE_ROOT (needs root or passwordless sudo)"; exit 22
  fi
fi
# the setup lock (setup_lock: cluster/shell/setup-lock.sh, put in by with_setup_lock): nodes sharing /opt
setup_lock "$NODE_ROOT/.setup-$PROFILE.lock" "$VENV_LOCK_TIMEOUT" \
  || { xc step venv failed "timed out waiting for the setup lock $NODE_ROOT/.setup-$PROFILE.lock"; exit 23; }
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/$PROFILE_MARKER" 2>/dev/null)" = "$DIGEST" ]; then
  xc step venv unchanged "$VENV already has profile $PROFILE ($DIGEST)"
else
  if [ ! -x "$VENV/bin/python" ]; then
    xc progress venv "creating $VENV from $OS_PYTHON"
    "$OS_PYTHON" -m venv "$VENV" 9>&- || { xc step venv failed "$OS_PYTHON -m venv $VENV failed (is python3-venv installed?)"; exit 24; }
  fi
  rm -f "$VENV/$PROFILE_MARKER" "$VENV/$PROJECT_MARKER"
  xc progress venv "pip install (profile $PROFILE): ${PINS[*]}"
  for i in "${!INDEX_REQUIREMENTS[@]}"; do
    # hashes go in a requirements file; --index-url alone and --no-deps: never PyPI for this name
    printf '%s\n' "${INDEX_REQUIREMENTS[$i]}" > "$VENV/.index-requirement.txt"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "${PIP_COMPILE[@]}" --no-deps \
      --index-url "${INDEX_URLS[$i]}" -r "$VENV/.index-requirement.txt" 9>&- \
      || { xc step venv failed "pip install of ${INDEX_REQUIREMENTS[$i]%% *} from ${INDEX_URLS[$i]} failed"; exit 25; }
  done
  rm -f "$VENV/.index-requirement.txt"
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "${PIP_COMPILE[@]}" "${PIP_SOURCE[@]}" \
    "${PINS[@]}" 9>&- \
    || { xc step venv failed "pip install of the profile's pins failed"; exit 25; }
  echo "$DIGEST" > "$VENV/$PROFILE_MARKER.tmp" && mv "$VENV/$PROFILE_MARKER.tmp" "$VENV/$PROFILE_MARKER"
  xc step venv changed "$VENV has profile $PROFILE ($DIGEST)"
  CHANGED=1
fi

# ---- 3. this project, at the controller's exact version
if [ -z "$PROJECT_WHEEL" ]; then
  xc step project skipped "no project wheel given"
elif [ "$(cat "$VENV/$PROJECT_MARKER" 2>/dev/null)" = "$PROJECT_VERSION" ]; then
  xc step project unchanged "xeon-cluster $PROJECT_VERSION already installed"
else
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "${PIP_COMPILE[@]}" --no-deps \
    --force-reinstall "$PROJECT_WHEEL" 9>&- \
    || { xc step project failed "pip install $PROJECT_WHEEL failed"; exit 30; }
  echo "$PROJECT_VERSION" > "$VENV/$PROJECT_MARKER.tmp" && mv "$VENV/$PROJECT_MARKER.tmp" "$VENV/$PROJECT_MARKER"
  xc step project changed "xeon-cluster $PROJECT_VERSION installed"
  CHANGED=1
fi
flock -u 9
xc "done" "$CHANGED"
