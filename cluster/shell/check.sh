#!/bin/bash
# xeon-cluster check (cluster/node/setup_script.py check_script): prints the facts evaluate_check
# compares with the profile, as `::xc:: fact <name> <value...>` lines. Changes nothing.
# Header: VENV PROFILE_MARKER PROJECT_MARKER TCMALLOC_PATH NODE_ROOT, and the arrays PACKAGES
# (distributions whose installed version to report) and CPU_FLAGS (the /proc/cpuinfo flags to report).
set -u
xc() { echo "::xc:: $*"; }
if [ -x "$VENV/bin/python" ]; then
  xc fact python "$VENV/bin/python" "$("$VENV/bin/python" -c 'import platform; print(platform.python_version())')"
  "$VENV/bin/python" - "${PACKAGES[@]}" <<'PY'
import importlib.metadata as m, sys
for n in sys.argv[1:]:
    try: print('::xc:: fact pkg', n, m.version(n))
    except m.PackageNotFoundError: print('::xc:: fact pkg', n, 'MISSING')
PY
else
  xc fact python MISSING
fi
xc fact profile_marker "$(cat "$VENV/$PROFILE_MARKER" 2>/dev/null || echo MISSING)"
xc fact project_marker "$(cat "$VENV/$PROJECT_MARKER" 2>/dev/null || echo MISSING)"
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xFf <(printf '%s\n' "${CPU_FLAGS[@]}") | sort | paste -sd ' ' -)
xc fact cpu_flags "${flags:-none}"
if [ -e "$TCMALLOC_PATH" ]; then xc fact tcmalloc "$TCMALLOC_PATH"; else xc fact tcmalloc MISSING; fi
target="$VENV"; [ -e "$target" ] || target="$NODE_ROOT"; [ -e "$target" ] || target=/
xc fact disk_free_kib "$(df -Pk "$target" | awk 'NR==2 {print $4}')" "$target"
xc fact cpu_model "$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
