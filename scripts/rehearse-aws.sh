#!/usr/bin/env bash
# Rehearse a user's whole sitting with the AWS path, with only the EC2 API and the Pulumi engine
# replaced: local-up (3 nodes) -> fab preflight -> pulumi up of a stack with keepImage (the real program
# under moto-backed mocks; the setup step over real SSH) -> fab train --cluster NAME -> fab status -> a
# worker terminated, replaced by the workers' Auto Scaling group, shown by fab status -> pulumi destroy
# (the image kept) -> fab sweep, then a second stack that boots every node from the kept image (no
# install, no image made), fab images and --remove, then a stack whose destroy leaves its image behind,
# caught and removed by `fab sweep --delete --yes`. Prints each step and its result (tests/rehearsal/sitting.py).
# Everything it writes (the stack file, the local cluster's key and state) goes to a temporary
# directory, removed at the end; nothing is written to the checkout.
#
# Needs root (network namespaces), as the local cluster does, and the venv of scripts/setup-dev.sh;
# no AWS account, no Pulumi CLI, no network.
#   bash scripts/rehearse-aws.sh [--verbose] [--keep-workdir]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${XEON_CLUSTER_VENV:-.venv}/bin/python" -m tests.rehearsal.sitting "$@"
