"""`fab preflight` with instanceTypes, against moto: the offering, quota and dry-run checks cover every listed
type, and a capacity refusal of one type is a warning while the group has others (a failure for the master,
which takes the first). moto refuses no launch for capacity: `FirstTypeRefused` (a test double over moto's
client) refuses the first type's dry run as EC2 does."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError

from node_setup.aws import preflight as pf
from node_setup.aws.quotas import SPOT_QUOTA_CODE
from tests.aws.test_preflight import (MOTO_CALLER, MY_ADDRESS, canonical_image, clients, spec_for, stubbed_iam,
                                      stubbed_service_quotas)

pytest.importorskip("moto")

TYPES = ["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]


class FirstTypeRefused:
    """Test double: moto's EC2 client, but a dry run of `refused` answers InsufficientInstanceCapacity (moto
    models no capacity); the types each dry run asked for are kept."""

    def __init__(self, ec2, refused: str):
        self._ec2, self.refused, self.launched = ec2, refused, []

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def run_instances(self, **kwargs):
        self.launched.append(kwargs["InstanceType"])
        if kwargs["InstanceType"] == self.refused:
            raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity", "Message": (
                f"We currently do not have sufficient {self.refused} capacity in the Availability Zone you "
                "requested")}}, "RunInstances")
        return self._ec2.run_instances(**kwargs)

    def get_spot_placement_scores(self, **kwargs):  # moto lacks it: no zone is scored
        return {"SpotPlacementScores": []}


def test_every_listed_type_is_checked_for_offering_quota_and_a_dry_run(mocked_aws):
    quotas, stub = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 1024})
    iam, _ = stubbed_iam(("simulate", MOTO_CALLER, "allowed"), ("console", MOTO_CALLER, "allowed"))
    aws = clients(quotas=quotas, iam=iam)
    aws.ec2 = FirstTypeRefused(aws.ec2, refused="none")
    report = pf.run_preflight(spec_for(baseAmi=canonical_image(), instanceType="", instanceTypes=TYPES),
                              clients=aws, public_ip=lambda: MY_ADDRESS)
    stub.assert_no_pending_responses()
    assert report.exit_code == 0, report.render()
    offering = [f.message for f in report.findings if f.check == "offering"]
    # one line per type with its zones (moto's real offerings), then the cluster's zone: one offering all three
    assert [m.split()[0] for m in offering[:3]] == TYPES and all(" is offered in us-east-1" in m for m in offering[:3])
    assert offering[3].startswith(", ".join(TYPES) + " is offered (each of them) in ")
    (quota,) = [f.message for f in report.findings if f.check == "quota"]
    assert "4 x m7i.48xlarge/c7i.48xlarge/r7i.48xlarge (the master and 3 workers of the group) need 768" in quota
    # the master (the first type), then one worker of each type
    assert aws.ec2.launched == ["m7i.48xlarge", *TYPES]


def test_capacity_for_the_first_type_refused_the_group_goes_on_with_the_next_the_master_fails(mocked_aws):
    ec2 = FirstTypeRefused(boto3.client("ec2", region_name="us-east-1"), refused="m7i.48xlarge")
    report = pf.Report(region="us-east-1")
    pf.check_dry_run(report, pf.AwsClients(sts=None, ec2=ec2, quotas=None),
                     spec_for(baseAmi=canonical_image(), instanceType="", instanceTypes=TYPES), "us-east-1a")
    master, *workers = report.findings
    assert master.status == pf.FAIL and "spot m7i.48xlarge launch of the master" in master.message
    assert "sufficient m7i.48xlarge capacity" in master.message
    assert master.fix.startswith("list another type first in instanceTypes (the master takes the first; next: "
                                 "c7i.48xlarge)")
    assert [w.status for w in workers] == [pf.WARN, pf.OK, pf.OK]
    assert workers[0].message.endswith("the group launches its workers from its other types "
                                       "(c7i.48xlarge, r7i.48xlarge)")
    assert "c7i.48xlarge" in workers[1].message and "any of 3 types" in workers[1].message
