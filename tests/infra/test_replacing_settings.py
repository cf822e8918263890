"""One list of the settings that replace nodes or re-bake (cluster/stack/node_replacement.py), read by the
program's triggers and by `fab preflight`'s warning: the program runs under the Pulumi mocks before and after
one setting changes, and whatever its own triggers do (each group's replacement trigger, the master's and the
workers', and the image's built image) is what preflight's line for that setting says.

Not here, because the mocks keep a replaced resource's id: a new VPC or subnet (new security groups) and a
new public key (a new key pair) change the template through new resources; node_replacement lists them."""

from __future__ import annotations

import pytest

from cluster.stack import node_replacement as nr
from cluster.stack.spec import ClusterSpec
from tests.infra.conftest import (BUILT, REGION, STACK, fresh_run, master_group, minimal_config, worker_group,
                                  worker_template)

# A setting, another value for it, and the base config it changes (bake or not).
CHANGES = [
    ({"tags": ["team=ml"]}, {}),
    ({"rootVolumeGib": 300}, {}),
    ({"spotMaxPrice": 4.5}, {}),
    ({"sshUser": "admin"}, {}),
    ({"placementGroup": False}, {}),
    ({"softwareProfile": "intel"}, {}),
    ({"baseAmi": "ami-0other"}, {}),  # with a bake: a new image, built from it, and every node
    ({"baseAmi": "ami-0other"}, {"bake": False}),  # without one the workers boot it
    ({"workerCount": 7}, {}),  # resizes the group in place
    ({"masterSpot": False}, {}),  # the master only
    ({"workerSpot": False}, {}),  # the workers only
]


def _run(config: dict):
    monitor, _ = fresh_run(minimal_config(**config))
    (image,) = monitor.of_type(BUILT) or [None]
    return (worker_group(monitor).replacement_trigger, master_group(monitor).replacement_trigger,
            image.state["outputResources"][0]["amis"][0]["image"] if image else None)


def _settings(config: dict) -> dict:
    return nr.node_settings(ClusterSpec.from_config(minimal_config(**config), stack=STACK, region=REGION))


@pytest.mark.parametrize("change, base", CHANGES, ids=lambda v: ",".join(map(str, v)) or "baked")
def test_preflight_names_every_setting_whose_change_the_programs_triggers_answer_with_new_nodes(change, base):
    (key,) = change
    before, after = _run(base), _run({**base, **change})
    workers_replaced, master_replaced, rebaked = (b != a for b, a in zip(before, after))
    lines = [line for line in nr.replacements(_settings({**base, **change}), _settings(base))
             if line.startswith(f"{key}:")]
    says_workers = any(what in line for line in lines for what in ("every worker", "every node", "the image"))
    says_master = any(what in line for line in lines for what in ("the master", "every node", "the image"))
    assert says_workers is workers_replaced, (key, lines)
    assert says_master is master_replaced, (key, lines)
    assert any("the image" in line for line in lines) is rebaked, (key, lines)


def test_the_templates_fields_are_the_lists_fields(harness):
    """Every field of the launch template but its user data, image and own description and tags is one of
    node_replacement.WORKER_TEMPLATE's (infra/node_group.py builds each group's trigger from that list)."""
    harness.run(minimal_config())
    template = worker_template(harness.monitor)
    camel = {"".join(w.title() if i else w for i, w in enumerate(f.split("_"))) for f in nr.WORKER_TEMPLATE}
    own = {"userData", "imageId", "description", "tags", "updateDefaultVersion"}
    assert set(template.inputs) - own <= camel and set(template.inputs) - own
