"""The stack marker `fab sweep` reads (tests/aws/test_sweep_stack_marker.py), as the program writes it.

Under Pulumi's mocks (tests/infra/conftest.py): exactly one resource carries
`xeon-cluster:stack-marker`, the cluster security group, valued with the stack's name; every node
carries that group (so destroy deletes it only after every node), and it is not kept on destroy
(so `pulumi destroy` removes it, and the sweep then finds what is left).
"""

from __future__ import annotations

import pytest

from cluster.stack import leftovers
from cluster.stack.tags import STACK_MARKER_KEY
from infra.image import BUILDER_SUFFIX
from tests.infra.conftest import STACK, master_template, minimal_config, worker_template
from tests.infra.test_program import SG, STACK_CONFIGS, groups, template_groups


@pytest.mark.parametrize("name", list(STACK_CONFIGS))
def test_the_cluster_group_carries_the_stack_marker_and_nothing_else_does(harness, name):
    harness.run(minimal_config(**STACK_CONFIGS[name], tags=["team=ml"]))
    monitor = harness.monitor
    cluster, ssh = groups(monitor)
    marked = [r for r in monitor.aws_resources() if STACK_MARKER_KEY in (r.inputs.get("tags") or {})]
    assert [r.urn for r in marked] == [cluster.urn]
    assert cluster.inputs["tags"][STACK_MARKER_KEY] == STACK and leftovers.marks_stack(cluster.inputs["tags"])
    assert not leftovers.marks_stack(ssh.inputs["tags"])
    # it outlives every node: each one is launched into the marked group
    nodes = [master_template(monitor), worker_template(monitor)]
    assert all(cluster.id in template_groups(node) for node in nodes)
    # and `pulumi destroy` removes it
    assert not cluster.retain_on_delete and not cluster.deleted_with
    # The image's build instance has a group of its own (infra/image.py), unmarked: it is not the stack's marker.
    assert len([g for g in monitor.of_type(SG) if not g.name.endswith(BUILDER_SUFFIX)]) == 2
