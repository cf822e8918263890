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


def _groups(config, stashes):
    """One `pulumi up` of the stack whose engine record is `stashes`: (master's group, workers' group)."""
    from tests.infra.conftest import fresh_run, master_group, worker_group

    monitor, _ = fresh_run(minimal_config(**config), fake=ZonedSubnets(stashes=stashes))
    return master_group(monitor), worker_group(monitor)


def test_a_zone_move_replaces_the_master_and_the_workers_group_together_deleting_first():
    stack: dict = {}
    before = _groups({"availabilityZone": "us-east-1a", "zoneMove": True}, stack)
    after = _groups({"availabilityZone": "us-east-1c", "zoneMove": True}, stack)
    # One subnet decision for both, decided again for the new zone: both groups move to its subnet.
    assert [g.inputs["vpcZoneIdentifiers"] for g in before] == [["subnet-0aaa"]] * 2
    assert [g.inputs["vpcZoneIdentifiers"] for g in after] == [["subnet-0ccc"]] * 2
    # Each group is replaced (its trigger names the subnet), deleting first: never nodes in two zones.
    for old, new in zip(before, after):
        assert new.replacement_trigger != old.replacement_trigger and new.replacement_trigger["subnet"] == "subnet-0ccc"
        assert new.delete_before_replace and not new.ignore_changes


def test_without_zone_move_the_zone_stays_a_first_choice_a_running_cluster_keeps():
    stack: dict = {}
    before = _groups({"availabilityZone": "us-east-1a"}, stack)
    after = _groups({"availabilityZone": "us-east-1c"}, stack)
    assert [g.inputs["vpcZoneIdentifiers"] for g in after] == [["subnet-0aaa"]] * 2  # the kept subnet, both
    assert [g.replacement_trigger for g in after] == [g.replacement_trigger for g in before]
