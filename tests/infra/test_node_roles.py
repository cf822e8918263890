"""The nodes' two roles under the Pulumi mocks (infra/node_role.py): the workers' role holds the bucket
and nothing else, the master's adds the worker group's stop (to 0 only) and the supervisor's reads;
docs/security.md's table of what each role allows is checked, row for row, against the policies the
real program builds."""

from __future__ import annotations

import json
import re

import pytest

from cluster.run.runspec import STORE_ROOT
from cluster.stack import image_build
from cluster.stack.tags import CLUSTER_KEY
from infra.image import BUILDER_SUFFIX
from infra.node_role import MASTER_SUFFIX
from tests.infra.conftest import (REGION, ROOT, master_group, master_template, minimal_config, worker_group,
                                  worker_template)

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
BUCKET = "aws:s3/bucket:Bucket"
SECURITY_DOC = ROOT / "docs" / "security.md"
TABLE_HEADING = "## The nodes' roles"
# How the table says a condition holds: the operators it may stand for.
IS_OPERATORS = ("NumericEquals", "StringEquals")


def _roles(monitor) -> dict[str, tuple]:
    """{"workers": (role, profile, [policy documents]), "master": ...} from the registrations."""
    roles = {r.urn: r for r in monitor.of_type(ROLE)}
    found = {}
    for role in roles.values():
        kind = ("builder" if role.name.endswith(BUILDER_SUFFIX) else "master" if role.name.endswith(MASTER_SUFFIX)
                else "workers")
        (profile,) = [p for p in monitor.of_type(INSTANCE_PROFILE) if p.inputs["role"] == role.id]
        policies = [p for p in monitor.of_type(ROLE_POLICY) if p.inputs["role"] == role.id]
        assert kind not in found, f"two {kind} roles"
        found[kind] = (role, profile, policies)
    assert set(found) in ({"workers", "master"}, {"workers", "master", "builder"})
    return found


def _statements(policies) -> set[tuple]:
    """(actions, resource, conditions) of every statement, each an Allow with no Not* element."""
    found = set()
    for policy in policies:
        for statement in json.loads(policy.inputs["policy"])["Statement"]:
            assert statement["Effect"] == "Allow" and set(statement) <= {"Sid", "Effect", "Action", "Resource",
                                                                         "Condition"}, statement
            conditions = set()
            for operator, pairs in statement.get("Condition", {}).items():
                assert operator in IS_OPERATORS, f"{operator}: the table has no word for it"
                conditions |= {(key, str(value)) for key, value in pairs.items()}
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            found.add((frozenset(actions), statement["Resource"], frozenset(conditions)))
    return found


def _documented(words: dict[str, str]) -> dict[str, set[tuple]]:
    """docs/security.md's table under TABLE_HEADING as {role: statements}, its words read with `words`."""
    text = SECURITY_DOC.read_text().split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    found: dict[str, set[tuple]] = {"workers": set(), "master": set(), "builder": set()}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] not in found:
            continue
        role, actions, resource, conditions = cells
        pairs = {(key, words.get(value, value)) for key, value in re.findall(r"`([^`]+)` is ([^,]+)", conditions)}
        assert len(pairs) == (conditions.count(" is ") if conditions else 0), line
        found[role].add((frozenset(re.findall(r"`([^`]+)`", actions)), words.get(resource, resource),
                         frozenset(pairs)))
    return found


@pytest.mark.parametrize("config", [{}, {"bake": False}], ids=["baked", "no bake"])
def test_the_workers_profile_holds_the_bucket_alone_and_the_master_its_own(harness, config):
    harness.run(minimal_config(**config))
    monitor = harness.monitor
    roles = _roles(monitor)
    master, template = master_template(monitor), worker_template(monitor)
    (bucket,) = monitor.of_type(BUCKET)
    assert master.inputs["iamInstanceProfile"] == {"name": roles["master"][1].state["name"]}
    assert template.inputs["iamInstanceProfile"] == {"name": roles["workers"][1].state["name"]}
    for role, profile, _ in (roles["workers"], roles["master"]):
        trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert trust == [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]
        # both names match the `<cluster>-node-*` that fab preflight's PassRole check asks about
        assert role.state["name"].startswith("xeon-dev-node-") and profile.inputs["role"] == role.id
    # Any rank's code on a worker can read and write the bucket, and do nothing else in AWS.
    arn = bucket.state["arn"]
    workers = _statements(roles["workers"][2])
    assert {resource for _, resource, _ in workers} == {arn, f"{arn}/*"}
    assert all(a.startswith("s3:") for actions, _, _ in workers for a in actions)
    # A profile waits for the policies its role has at boot: no node boots without its permissions.
    for kind, (_, profile, policies) in roles.items():
        at_boot = [p for p in policies if not p.name.endswith("-worker-group")]
        assert at_boot and all(p.urn in profile.dependencies for p in at_boot), kind


def test_the_master_may_set_both_groups_to_zero_and_hand_back_one_of_its_workers_and_nothing_else(harness):
    harness.run(minimal_config())
    monitor = harness.monitor
    group, own = worker_group(monitor), master_group(monitor)
    _, _, policies = _roles(monitor)["master"]
    (policy,) = [p for p in policies if p.name.endswith("-worker-group")]
    statement, stop_own, hand_back = json.loads(policy.inputs["policy"])["Statement"]
    # Both sizes of the request must be 0 (a request without one fails NumericEquals), so the desired
    # capacity, which AWS keeps between them, is 0 too: no request can start, add or keep a node. The master's
    # own group too: the auto-stop sets it to 0 last, or the group would launch the powered-off master again.
    stopped = {"NumericEquals": {"autoscaling:MinSize": "0", "autoscaling:MaxSize": "0"}}
    assert statement == {"Sid": "StopOwnWorkerGroup", "Effect": "Allow",
                         "Action": ["autoscaling:UpdateAutoScalingGroup"], "Resource": group.state["arn"],
                         "Condition": stopped}
    assert stop_own == {"Sid": "StopOwnMasterGroup", "Effect": "Allow",
                        "Action": ["autoscaling:UpdateAutoScalingGroup"], "Resource": own.state["arn"],
                        "Condition": stopped}
    assert group.urn in policy.dependencies and own.urn in policy.dependencies and "*" not in statement["Resource"]
    # The supervisor's hand-back of a replacement it cannot admit, on this group alone (min = max = desired,
    # so AWS refuses a call that would lower the group's size: another worker comes instead).
    assert hand_back == {"Sid": "HandBackOwnWorker", "Effect": "Allow",
                         "Action": ["autoscaling:TerminateInstanceInAutoScalingGroup"], "Resource": group.state["arn"]}


def test_docs_security_states_what_each_role_allows_as_the_program_builds_it(harness):
    harness.run(minimal_config())
    monitor = harness.monitor
    (bucket,), group = monitor.of_type(BUCKET), worker_group(monitor)
    cluster = worker_template(monitor).inputs["tags"][CLUSTER_KEY]
    arn = bucket.state["arn"]
    words = {"the bucket": arn, "the bucket's objects": f"{arn}/*", "the worker group": group.state["arn"],
             "the master's group": master_group(monitor).state["arn"],
             "`*`": "*", "the region's instances": f"arn:aws:ec2:{REGION}:*:instance/*",
             "the stack's region": REGION, "the cluster's name": cluster,
             "the bucket's install scripts": f"{arn}/{image_build.INSTALL_PREFIX}/*",
             "the bucket's build logs": f"{arn}/{image_build.LOG_PREFIX}/*",
             "the cluster's run store": f"arn:aws:ssm:{REGION}:*:parameter{STORE_ROOT}/{cluster}/*",
             "the region's SSM": f"ssm.{REGION}.amazonaws.com"}
    documented = _documented(words)
    built = {kind: _statements(policies) for kind, (_, _, policies) in _roles(monitor).items()}
    assert documented == built
