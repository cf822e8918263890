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
