"""`fab preflight` warns when a stack-file change would replace nodes: the comparison
(cluster/stack/node_replacement.py) and the reading of the last `pulumi up`'s `nodeSettings` output, with a
test double for the Pulumi CLI (the real one would need a deployed stack)."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from cluster.stack import node_replacement as nr
from cluster.stack.spec import ClusterSpec
from node_setup.aws.findings import OK, SKIPPED, WARN, Report
from node_setup.tasks import costs
from tests.infra.conftest import PUBLIC_KEY, minimal_config

OTHER_KEY = PUBLIC_KEY.replace("AAAAICEC", "AAAAIDED")


def spec(**cfg):
    return ClusterSpec.from_config(minimal_config(**cfg), stack="dev", region="us-east-1")


def test_each_replacing_change_is_named_with_what_it_replaces():
    deployed = nr.node_settings(spec())
    wanted = nr.node_settings(spec(publicKey=OTHER_KEY, placementGroup=False, instanceType="c6i.16xlarge",
                                   masterSpot=False, workerSpot=False))
    lines = nr.replacements(wanted, deployed)
    assert [line.split(":")[0] for line in lines] == ["publicKey", "instanceType", "masterSpot", "workerSpot",
                                                      "placementGroup"]
    assert lines[0] == "publicKey: changed; `pulumi up` replaces every node"
    assert f"instanceType: {spec().instance_type} -> c6i.16xlarge; `pulumi up` replaces every node" in lines
    assert "masterSpot: true -> false; `pulumi up` replaces the master" in lines
    assert ("workerSpot: true -> false; `pulumi up` replaces every worker (the group is replaced, deleting first)"
            in lines)
    assert PUBLIC_KEY.split()[1] not in json.dumps(deployed)  # a digest, not the key
    tagged = json.loads(json.dumps(nr.node_settings(spec(tags=["team=ml"]))))  # as the stack output returns it
    # The tags are in both groups' templates: every node.
    assert nr.replacements(nr.node_settings(spec(tags=["team=ml", "env=dev"])), tagged) == [
        "tags: team=ml -> env=dev,team=ml; `pulumi up` replaces every node"]


def test_no_change_and_settings_that_replace_nothing_give_no_line():
    deployed = nr.node_settings(spec())
    assert nr.replacements(nr.node_settings(spec(workerCount=7, destroyBucket=True)), deployed) == []
    older = {k: v for k, v in deployed.items() if k != "workerSpot"}  # an output without a key: not compared
    assert nr.replacements(nr.node_settings(spec(workerSpot=False)), older) == []
    assert nr.deployed_settings(None) is None and nr.deployed_settings({"clusterName": "x"}) is None


def test_preflight_names_a_zone_move_as_replacing_every_node_and_a_first_choice_zone_as_nothing():
    moving = nr.node_settings(spec(availabilityZone="us-east-1a", zoneMove=True))
    assert nr.replacements(nr.node_settings(spec(availabilityZone="us-east-1c", zoneMove=True)), moving) == [
        "availabilityZone: us-east-1a -> us-east-1c; `pulumi up` replaces every node when availabilityZone's "
        "subnet is not the kept one (the zone move: the master's and the workers' groups, deleting first)"]
    first_choice = nr.node_settings(spec(availabilityZone="us-east-1a"))
    assert nr.replacements(nr.node_settings(spec(availabilityZone="us-east-1c")), first_choice) == []
    turned_on = nr.replacements(nr.node_settings(spec(availabilityZone="us-east-1a", zoneMove=True)), first_choice)
    assert turned_on == ["zoneMove: false -> true; `pulumi up` replaces every node when availabilityZone's subnet "
                         "is not the kept one (the zone move: the master's and the workers' groups, deleting first)"]
    fallback = nr.node_settings(spec(onDemandFallback="20m"))
    assert nr.replacements(nr.node_settings(spec(onDemandFallback="40m")), fallback) == []  # only the wait
    assert nr.replacements(nr.node_settings(spec()), fallback) == [
        "onDemandFallback: 20m -> off; `pulumi up` replaces every worker (the group is replaced, deleting first)"]
    listed = nr.replacements(nr.node_settings(spec(instanceTypes=["m7i.48xlarge", "c7i.48xlarge"])),
                             nr.node_settings(spec(instanceType="m7i.48xlarge")))
    assert listed == ["instanceTypes: (not set) -> m7i.48xlarge,c7i.48xlarge; `pulumi up` replaces every worker "
                      "(the group is replaced, deleting first)"]


@pytest.fixture
def fake_pulumi(tmp_path, monkeypatch):
    """Test double for the Pulumi CLI on PATH: `stack output --json` prints $FAKE_OUTPUTS, or fails with
    $FAKE_STDERR and exit 255 (as for a stack that does not exist)."""
    script = tmp_path / "bin" / "pulumi"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n"
                      "import os, sys\n"
                      "assert sys.argv[1:4] == ['stack', 'output', '--json'], sys.argv\n"
                      "if os.environ.get('FAKE_STDERR'):\n"
                      "    sys.stderr.write(os.environ['FAKE_STDERR'] + '\\n'); sys.exit(255)\n"
                      "print(os.environ.get('FAKE_OUTPUTS', '{}'))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return monkeypatch


def test_preflight_warns_for_a_change_the_deployed_stack_would_replace_nodes_for(fake_pulumi):
    outputs = {"clusterName": "xeon-dev", nr.OUTPUT: nr.node_settings(spec())}
    fake_pulumi.setenv("FAKE_OUTPUTS", json.dumps(outputs))
    report = Report(region="us-east-1")
    costs.check_node_replacement(report, spec(instanceType="c6i.16xlarge"))
    (finding,) = report.findings
    assert finding.status == WARN and finding.check == "replace"
    assert "instanceType" in finding.message and "replaces every node" in finding.message
    same = Report(region="us-east-1")
    costs.check_node_replacement(same, spec())
    assert [f.status for f in same.findings] == [OK]


@pytest.mark.parametrize("outputs, stderr, why", [
    ("{}", "", "has no nodeSettings output"),
    ("", "error: no stack named 'dev' found", "no stack named 'dev' found"),
])
def test_preflight_cannot_tell_without_deployed_settings(fake_pulumi, outputs, stderr, why):
    fake_pulumi.setenv("FAKE_OUTPUTS", outputs)
    fake_pulumi.setenv("FAKE_STDERR", stderr)
    report = Report(region="us-east-1")
    costs.check_node_replacement(report, spec(instanceType="c6i.16xlarge"))
    (finding,) = report.findings
    assert finding.status == SKIPPED and nr.CANNOT_TELL in finding.message and why in finding.message


def test_preflight_cannot_tell_without_the_pulumi_cli(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    report = Report(region="us-east-1")
    costs.check_node_replacement(report, spec())
    (finding,) = report.findings
    assert finding.status == SKIPPED and "the Pulumi CLI is not installed" in finding.message


def test_the_bake_tag_depends_on_the_software_only():
    assert nr.bake_tag("a") == nr.bake_tag("a") != nr.bake_tag("b")
