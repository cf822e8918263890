"""`fab preflight --pick-zone`: the region's zones ranked by spot placement score, then spot price;
a capacity refusal names the next-best zone.

moto has the zones and the instance type offerings, but no spot placement scores and only one
constant spot price; `ScoresAndPricesEc2` is the test double that adds both over a moto client.
"""

import datetime as dt

import boto3
import pytest
from botocore.exceptions import ClientError

moto = pytest.importorskip("moto")

from node_setup.aws import preflight as pf  # noqa: E402
from node_setup.aws import zones  # noqa: E402
from node_setup.aws.quotas import SPOT_QUOTA_CODE  # noqa: E402
from node_setup.stack_edit import set_stack_value  # noqa: E402
from tests.aws.test_preflight import (  # noqa: E402
    MY_ADDRESS,
    canonical_image,
    clients,
    spec_for,
    stubbed_service_quotas,
)


class ScoresAndPricesEc2:
    """Test double: a moto EC2 client plus placement scores (by zone name, asked for one zone) and
    the latest spot price per zone; `capacity_refused` makes the dry run fail as EC2 does when a zone
    has no room. Everything else is moto."""

    def __init__(self, ec2, scores, prices, capacity_refused=False):
        self._ec2, self.scores, self.prices, self.capacity_refused = ec2, scores, prices, capacity_refused
        self.score_requests = []

    def __getattr__(self, name):
        return getattr(self._ec2, name)

    def get_spot_placement_scores(self, **kwargs):
        self.score_requests.append(kwargs)
        ids = {z["ZoneName"]: z["ZoneId"] for z in self._ec2.describe_availability_zones()["AvailabilityZones"]}
        return {"SpotPlacementScores": [{"Region": "us-east-1", "AvailabilityZoneId": ids[zone], "Score": score}
                                        for zone, score in self.scores.items()]}

    def get_paginator(self, operation):
        if operation != "describe_spot_price_history":
            return self._ec2.get_paginator(operation)
        prices = self.prices

        class Pages:
            def paginate(self, **kwargs):
                now = dt.datetime.now(dt.timezone.utc)
                yield {"SpotPriceHistory": [{"AvailabilityZone": zone, "SpotPrice": str(price), "Timestamp": now}
                                            for zone, price in prices.items()]}
        return Pages()

    def run_instances(self, **kwargs):
        if self.capacity_refused:
            raise ClientError({"Error": {"Code": "InsufficientInstanceCapacity",
                                         "Message": "We currently do not have sufficient capacity"}}, "RunInstances")
        return self._ec2.run_instances(**kwargs)


SCORES = {"us-east-1a": 3, "us-east-1b": 9, "us-east-1c": 9, "us-east-1e": 10}  # 1e does not offer r7iz
PRICES = {"us-east-1a": 1.1, "us-east-1b": 2.5, "us-east-1c": 1.9}


def test_zones_rank_by_placement_score_then_price(mocked_aws):
    ec2 = ScoresAndPricesEc2(boto3.client("ec2", region_name="us-east-1"), SCORES, PRICES)
    ranked = zones.rank_zones(ec2, spec_for())
    assert [r.zone for r in ranked] == ["us-east-1c", "us-east-1b", "us-east-1a", "us-east-1d", "us-east-1f"]
    assert (ranked[0].score, ranked[0].price) == (9, 1.9) and ranked[-1].score is None
    (asked,) = ec2.score_requests
    assert asked["SingleAvailabilityZone"] is True and asked["TargetCapacity"] == 4  # master + 3 workers
    table = zones.zone_table(ranked, current="us-east-1a")
    assert table.splitlines()[1].startswith("us-east-1c") and "us-east-1a" in table and "<- the stack's zone" in table


def test_capacity_refusal_names_the_next_best_zone(mocked_aws):
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    ec2 = ScoresAndPricesEc2(boto3.client("ec2", region_name="us-east-1"), SCORES, PRICES, capacity_refused=True)
    aws = clients(quotas=quotas)
    aws.ec2 = ec2
    report = pf.run_preflight(spec_for(baseAmi=canonical_image(), availabilityZone="us-east-1b"), clients=aws,
                              public_ip=lambda: MY_ADDRESS)
    dry = next(f for f in report.findings if f.check == "dry-run")
    assert report.exit_code == 1 and dry.status == pf.FAIL
    assert "the next-best zone is us-east-1c (placement score 9/10, spot $1.9000/h)" in dry.fix
    assert "fab preflight --pick-zone --write" in dry.fix


def test_the_stack_zone_is_the_one_preflight_checks(mocked_aws):
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    report = pf.run_preflight(spec_for(baseAmi=canonical_image(), availabilityZone="us-east-1c"),
                              clients=clients(quotas=quotas), public_ip=lambda: MY_ADDRESS)
    assert "the cluster will use us-east-1c" in next(f for f in report.findings if f.check == "offering").message
    bad = pf.run_preflight(spec_for(availabilityZone="us-east-1e"), clients=clients(quotas=quotas), public_ip=None)
    offering = next(f for f in bad.findings if f.check == "offering")
    assert offering.status == pf.FAIL and "us-east-1c" in offering.fix


def test_write_sets_the_zone_in_the_stack_file_and_keeps_the_rest(tmp_path):
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text("# my stack\nconfig:\n  aws:region: us-east-1\n  xeon-cluster:workerCount: \"3\"  # four nodes\n")
    set_stack_value(path, "availabilityZone", "us-east-1c")
    set_stack_value(path, "availabilityZone", "us-east-1b")
    text = path.read_text()
    assert text.count("availabilityZone") == 1 and "xeon-cluster:availabilityZone: us-east-1b" in text
    assert "# my stack" in text and "# four nodes" in text


def _lowest_subnet_not_in_the_first_zone(ec2):
    """A VPC with a subnet in us-east-1a and one in us-east-1b, the lower id in us-east-1b (not the first
    zone by name): subnet ids are random, so both are made again until the us-east-1a one's id sorts last
    (half the time each try; a us-east-1b id kept from the first try could sort above nearly every other)."""
    vpc = ec2.create_vpc(CidrBlock="10.30.0.0/16")["Vpc"]["VpcId"]
    for block in range(0, 200, 2):
        other = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{block}.0/24",
                                  AvailabilityZone="us-east-1b")["Subnet"]["SubnetId"]
        first = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.30.{block + 1}.0/24",
                                  AvailabilityZone="us-east-1a")["Subnet"]["SubnetId"]
        if first > other:
            return vpc, other, "us-east-1b"
        ec2.delete_subnet(SubnetId=first)
        ec2.delete_subnet(SubnetId=other)
    raise AssertionError("could not set up the subnets")


def test_preflight_checks_the_zone_of_the_subnet_the_program_picks(mocked_aws):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc, subnet, zone = _lowest_subnet_not_in_the_first_zone(ec2)
    quotas, _ = stubbed_service_quotas(**{SPOT_QUOTA_CODE: 512})
    sent = []
    ec2_seen = clients(quotas=quotas)
    ec2_seen.ec2.meta.events.register("provide-client-params.ec2.RunInstances",
                                      lambda params, **kw: sent.append(params))
    report = pf.run_preflight(spec_for(baseAmi=canonical_image(), vpcId=vpc), clients=ec2_seen, public_ip=None)
    offering = next(f for f in report.findings if f.check == "offering")
    assert f"the cluster will use {zone} (subnet {subnet}" in offering.message, offering.message
    assert sent and all(p["Placement"]["AvailabilityZone"] == zone for p in sent)  # the dry run launches there


def test_pick_zone_marks_the_zone_the_program_will_use(mocked_aws, monkeypatch, capsys, tmp_path):
    from node_setup.tasks import costs

    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc, _, zone = _lowest_subnet_not_in_the_first_zone(ec2)
    ranked = [zones.ZoneRank(z, f"use1-az{i}", None, None)
              for i, z in enumerate(["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"])]
    monkeypatch.setattr(zones, "rank_zones", lambda ec2, spec: ranked)  # moto has no placement scores
    costs._pick_zone(spec_for(vpcId=vpc), "", write=False)
    marked = [line for line in capsys.readouterr().out.splitlines() if "<-" in line]
    assert len(marked) == 1 and marked[0].startswith(zone) and "the zone `pulumi up` will use" in marked[0]


def test_with_instance_types_the_zones_offer_every_type_and_are_scored_for_all_of_them(mocked_aws):
    types = ["m7i.48xlarge", "c7i.48xlarge", "r7i.48xlarge"]
    ec2 = ScoresAndPricesEc2(boto3.client("ec2", region_name="us-east-1"), SCORES, PRICES)
    ranked = zones.rank_zones(ec2, spec_for(instanceType="", instanceTypes=types))
    every = set.intersection(*zones.offered(ec2, "availability-zone", types).values())
    assert {r.zone for r in ranked} == every and ranked
    (asked,) = ec2.score_requests
    assert asked["InstanceTypes"] == types and asked["TargetCapacity"] == 4
