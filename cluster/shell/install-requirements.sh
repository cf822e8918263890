#!/bin/bash
# The user's --requirements into the node's venv (node_setup/ssh/requirements.py), once per digest:
# a marker file per installed digest in the venv; under the setup lock (cluster/shell/setup-lock.sh),
# because the nodes of a local cluster share the venv (the first node installs for all, the others
# find the marker).
# The profile's exact pins go in as constraints, so no requirement can move them.
# Header: VENV, LOCK (the setup lock file), LOCK_TIMEOUT (and the setup lock's), MARKER_DIR (inside the venv), DIGEST,
# REQUIREMENTS and CONSTRAINTS (arrays), PIP_SOURCE (array: --no-index --find-links DIR, or empty:
# PyPI alone). Prints "::xc:: requirements unchanged|installed|failed DETAIL".
set -uo pipefail
marker="$VENV/$MARKER_DIR/$DIGEST"
setup_lock "$LOCK" "$LOCK_TIMEOUT" || { echo "::xc:: requirements failed another setup holds $LOCK"; exit 1; }
if [ -f "$marker" ]; then echo "::xc:: requirements unchanged already installed ($DIGEST)"; exit 0; fi
pins=$(mktemp) || exit 1
trap 'rm -f "$pins"' EXIT
printf '%s\n' "${CONSTRAINTS[@]}" > "$pins"
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q "${PIP_SOURCE[@]}" \
    -c "$pins" "${REQUIREMENTS[@]}" 9>&-; then
  echo "::xc:: requirements failed pip install ${REQUIREMENTS[*]}"; exit 1
fi
mkdir -p "$VENV/$MARKER_DIR" && echo "${REQUIREMENTS[*]}" > "$marker"
echo "::xc:: requirements installed ${REQUIREMENTS[*]}"
