"""The user's whole sitting with the AWS path, in one test (tests/rehearsal/sitting.py does the steps).

Only the EC2 API (a moto server on 127.0.0.1, with named test doubles for what moto lacks) and the
Pulumi engine (mocks backed by that server) are replaced: the unmodified `fab` runs as a subprocess
with the repository's fabfile, the real infra/__main__.py is evaluated, its setup step runs over
SSH, and the instances are a local cluster's nodes. `bash scripts/rehearse-aws.sh` runs the same
steps.

About a minute once the nodes' shared venv exists (its first build takes a few minutes).
"""

import pytest

from node_setup.local import state as local_state
from node_setup.local import system as local_system
from tests.rehearsal.sitting import NODES, Sitting
from tests.ssh.warm_nodes import WarmNodes
from tests.ssh.conftest import REPO_ROOT, local_cluster_unavailable

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

STEPS = ["local-up", "account", "stack file", "fab preflight", "pulumi up", "security groups", "fab train", "fab train",
         "fab status", "terminate the worker", "pulumi destroy", "fab sweep", "second stack", "fab images",
         "third stack", "fab sweep", "fab sweep --delete --yes", "fab sweep"]


@pytest.mark.timeout(1800)
def test_pulumi_up_then_fab_train_status_destroy_and_sweep_on_the_nodes_the_program_made(tmp_path):
    reason = local_cluster_unavailable()
    if reason:
        pytest.skip(reason)
    sitting = Sitting(tmp_path, warm=WarmNodes())
    steps = sitting.run()  # each step checks its own result; a failed one raises with the output
    names = [s.name for s in steps if not s.name.startswith("prepare:")]
    assert len(names) == len(STEPS) and all(n.startswith(want) for n, want in zip(names, STEPS)), names
    # Nothing is left behind: no stack file in the repository, no namespace of the local cluster.
    assert sitting.stack_file.parent == tmp_path / "stack"
    assert not (REPO_ROOT / sitting.stack_file.name).exists()
    left = {local_state.namespace_name(sitting.local_name, i) for i in range(NODES)} & local_system.namespaces()
    assert not left, f"namespaces left after the sitting: {sorted(left)}"
