"""`availabilityZone` (written by `fab preflight --pick-zone --write`) steers the placement lookup."""

from __future__ import annotations

import pulumi
import pytest

from infra.lookups import AccountLookupError
from tests.infra.conftest import (
    OFFERED_ZONES,
    STACK,
    FakeAws,
    Harness,
    RecordingMonitor,
    minimal_config,
)

SUBNETS = "aws:ec2/getSubnets:getSubnets"


def subnet_zone_filters(fake: FakeAws) -> list[list[str]]:
    return [next(f["values"] for f in args["filters"] if f["name"] == "availability-zone")
            for token, args in fake.calls if token == SUBNETS]


def test_the_zone_setting_narrows_the_subnet_lookup_to_that_zone(harness):
    harness.run(minimal_config(availabilityZone="us-east-1c"))
    assert subnet_zone_filters(harness.fake) == [["us-east-1c"]]


def test_without_the_zone_setting_every_offering_zone_is_a_candidate(harness):
    harness.run(minimal_config())
    assert subnet_zone_filters(harness.fake) == [sorted(OFFERED_ZONES)]


def test_a_zone_that_does_not_offer_the_type_stops_before_anything_is_registered():
    fake = FakeAws()
    monitor = RecordingMonitor(fake)
    pulumi.runtime.set_mocks(fake, project="xeon-cluster", stack=STACK, preview=False, monitor=monitor)
    try:
        with pytest.raises(AccountLookupError, match=r"availabilityZone: 'us-east-1e' does not offer r7iz.metal-16xl; "
                                                     r"allowed: us-east-1a, us-east-1c"):
            Harness(fake, monitor).run(minimal_config(availabilityZone="us-east-1e"))
    finally:
        pulumi.runtime.set_all_config({})
    assert monitor.registrations == []


class ZonedSubnets(FakeAws):
    """Test double for the account: one default subnet per offering zone, found by the zone filter."""

    SUBNETS = {"us-east-1a": "subnet-0aaa", "us-east-1c": "subnet-0ccc"}

    def call(self, args):
        if args.token == SUBNETS:
            self.calls.append((args.token, dict(args.args)))
            zones = next(f["values"] for f in args.args["filters"] if f["name"] == "availability-zone")
            return {"ids": [self.SUBNETS[z] for z in zones], "id": "us-east-1"}
        return super().call(args)


def _moved(config):
    from tests.infra.conftest import GROUP, INSTANCE, fresh_run

    monitor, _ = fresh_run(minimal_config(**config), fake=ZonedSubnets())
    (master,), (group,) = monitor.of_type(INSTANCE), monitor.of_type(GROUP)
    return master, group


def test_a_zone_move_replaces_the_master_and_the_workers_group_together_deleting_first():
    master_a, group_a = _moved({"availabilityZone": "us-east-1a", "zoneMove": True})
    master_c, group_c = _moved({"availabilityZone": "us-east-1c", "zoneMove": True})
    # One subnet decision for both: the master's subnet is the new zone's (no longer kept: the AWS provider
    # replaces an instance whose subnet changes), and the workers follow the master's.
    assert (master_a.inputs["subnetId"], master_c.inputs["subnetId"]) == ("subnet-0aaa", "subnet-0ccc")
    assert "subnetId" not in master_c.ignore_changes and master_c.delete_before_replace
    assert group_c.inputs["vpcZoneIdentifiers"] == ["subnet-0ccc"]
    assert "vpcZoneIdentifiers" not in group_c.ignore_changes
    # The group is replaced (its trigger names the zone), deleting first: never workers in two zones.
    assert group_c.replacement_trigger != group_a.replacement_trigger
    assert group_c.replacement_trigger["zone"] == "us-east-1c" and group_c.delete_before_replace


def test_without_zone_move_the_zone_stays_a_first_choice_a_running_cluster_keeps():
    master_a, group_a = _moved({"availabilityZone": "us-east-1a"})
    master_c, group_c = _moved({"availabilityZone": "us-east-1c"})
    assert "subnetId" in master_c.ignore_changes and "vpcZoneIdentifiers" in group_c.ignore_changes
    assert group_c.replacement_trigger == group_a.replacement_trigger and "zone" not in group_c.replacement_trigger
