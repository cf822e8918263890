"""`fab preflight`'s worker dry run sends what the workers' launch template holds: the program runs under
the Pulumi mocks and the template's inputs are compared with `dry_run_params` for a worker (pure: no
AWS call). The instance profile is the one part left out: it does not exist before `pulumi up`."""

from __future__ import annotations

import pytest

from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import ROLE_WORKER
from node_setup.aws import preflight as pf
from tests.infra.conftest import REGION, STACK, minimal_config, worker_template


@pytest.mark.parametrize("config", [{"spotMaxPrice": 4.5, "tags": ["team=ml"]}, {"workerSpot": False}],
                         ids=["spot at a max price", "on-demand"])
def test_the_worker_dry_run_sends_the_launch_templates_parameters(harness, config):
    harness.run(minimal_config(**config))
    template = worker_template(harness.monitor)
    t = template.inputs
    spec = ClusterSpec.from_config(minimal_config(**config), stack=STACK, region=REGION)
    sent = pf.dry_run_params(spec, {"ImageId": "ami-0base", "RootDeviceName": "/dev/xvda"}, "us-east-1a",
                             spec.worker_spot, role=ROLE_WORKER)

    assert sent["InstanceType"] == t["instanceType"]
    assert sent["InstanceInitiatedShutdownBehavior"] == t["instanceInitiatedShutdownBehavior"]
    metadata = t["metadataOptions"]
    assert sent["MetadataOptions"] == {"HttpTokens": metadata["httpTokens"], "HttpEndpoint": metadata["httpEndpoint"],
                                       "HttpPutResponseHopLimit": metadata["httpPutResponseHopLimit"]}
    (device,) = t["blockDeviceMappings"]
    (root,) = sent["BlockDeviceMappings"]
    # The template's device, not the image's: the dry run asks for the volume the template asks for.
    assert root["DeviceName"] == device["deviceName"] != "/dev/xvda"
    ebs = device["ebs"]
    assert root["Ebs"] == {"VolumeSize": ebs["volumeSize"], "VolumeType": ebs["volumeType"],
                           "Encrypted": ebs["encrypted"] == "true",
                           "DeleteOnTermination": ebs["deleteOnTermination"] == "true"}
    assert root["Ebs"]["Encrypted"] is True
    market = t.get("instanceMarketOptions")
    if market:
        options = market["spotOptions"]
        assert sent["InstanceMarketOptions"] == {"MarketType": market["marketType"], "SpotOptions": {
            "SpotInstanceType": options["spotInstanceType"],
            "InstanceInterruptionBehavior": options["instanceInterruptionBehavior"],
            "MaxPrice": options["maxPrice"]}}
    else:
        assert "InstanceMarketOptions" not in sent
    for spec_tags in t["tagSpecifications"]:
        kind = spec_tags["resourceType"]
        (sent_tags,) = [s["Tags"] for s in sent["TagSpecifications"] if s["ResourceType"] == kind]
        assert {x["Key"]: x["Value"] for x in sent_tags} == spec_tags["tags"]
    # What `pulumi up` makes first is not named: the instance profile, the key pair, the placement group.
    assert t["iamInstanceProfile"] and "IamInstanceProfile" not in sent
    assert "KeyName" not in sent and "GroupName" not in sent.get("Placement", {})


def test_the_program_records_the_settings_that_replace_nodes(harness):
    """`fab preflight` compares the stack file with this output of the last `pulumi up`."""
    from cluster.stack import node_replacement

    config = minimal_config(instanceType="c6i.16xlarge", workerSpot=False)
    outputs = harness.run(config)
    recorded = outputs[node_replacement.OUTPUT]
    spec = ClusterSpec.from_config(config, stack=STACK, region=REGION)
    assert recorded == node_replacement.node_settings(spec)
    assert recorded["instanceType"] == "c6i.16xlarge" and recorded["workerSpot"] is False
    assert recorded["publicKey"].startswith("sha256:")
