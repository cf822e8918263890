"""Which availability zone: the zones that offer the instance type(s), ranked by EC2's spot placement
score and the latest spot price (`fab preflight --pick-zone`, `fab up --zone auto`), and the next-best zone
named when a launch is refused for capacity."""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import ClientError

from cluster.stack.spec import ClusterSpec
from node_setup.aws.pricing import latest_spot_prices


def offered(ec2, location_type: str, types: list[str]) -> dict[str, set[str]]:
    """Instance type -> the locations (region or zones) where it is offered."""
    found: dict[str, set[str]] = {t: set() for t in types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType=location_type, Filters=[{"Name": "instance-type", "Values": types}])
    for page in pages:
        for offer in page.get("InstanceTypeOfferings", []):
            found.setdefault(offer["InstanceType"], set()).add(offer["Location"])
    return found


@dataclass(frozen=True)
class ZoneRank:
    zone: str
    zone_id: str
    score: int | None  # EC2's spot placement score, 1 (unlikely) to 10 (very likely); None: not scored
    price: float | None  # latest spot price in USD per hour; None: no history

    def row(self) -> str:
        score = "-" if self.score is None else str(self.score)
        price = "-" if self.price is None else f"{self.price:.4f}"
        return f"{self.zone:<16} {self.zone_id:<12} {score:>5} {price:>12}"


ZONE_TABLE_HEADER = f"{'zone':<16} {'zone id':<12} {'score':>5} {'spot $/hour':>12}"


def rank_zones(ec2, spec: ClusterSpec) -> list[ZoneRank]:
    """The region's zones that offer the instance type (with instanceTypes: every listed type, as the program
    picks its zone), best first: placement score (high first), then spot price (low first), then name. The
    score is asked for the cluster's node count in a single zone, as the cluster is placed (one subnet, one
    placement group), over all of its types (the score of the group's choice among them); the price is the
    cheapest listed type's there."""
    by_type = offered(ec2, "availability-zone", list(spec.types))
    zones = sorted(set.intersection(*(by_type.get(t, set()) for t in spec.types)))
    if not zones:
        return []
    ids = {z["ZoneName"]: z["ZoneId"] for z in ec2.describe_availability_zones(ZoneNames=zones)["AvailabilityZones"]}
    scores: dict[str, int] = {}
    answer = ec2.get_spot_placement_scores(InstanceTypes=list(spec.types), TargetCapacity=spec.node_count,
                                           TargetCapacityUnitType="units", SingleAvailabilityZone=True,
                                           RegionNames=[spec.region])
    for entry in answer.get("SpotPlacementScores", []):
        if entry.get("AvailabilityZoneId"):
            scores[entry["AvailabilityZoneId"]] = int(entry["Score"])
    prices: dict[str, float] = {}
    for itype in spec.types:
        for zone, (price, _) in latest_spot_prices(ec2, itype, zones).items():
            prices[zone] = min(price, prices.get(zone, price))
    ranked = [ZoneRank(z, ids.get(z, "?"), scores.get(ids.get(z, "")), prices.get(z)) for z in zones]
    return sorted(ranked, key=lambda r: (-(r.score or 0), r.price if r.price is not None else float("inf"), r.zone))


def zone_table(ranked: list[ZoneRank], current: str | None = None, label: str = "the stack's zone") -> str:
    """The ranking, one zone a row; `current` (the zone the program will use) marked with `label`."""
    lines = [ZONE_TABLE_HEADER]
    lines += [r.row() + (f"  <- {label}" if r.zone == current else "") for r in ranked]
    return "\n".join(lines)


def next_best_zone_fix(ec2, spec: ClusterSpec, zone: str | None) -> str | None:
    """"try <zone> (score, price)" for the best-ranked zone other than `zone`; None if none is known."""
    try:
        ranked = [r for r in rank_zones(ec2, spec) if r.zone != zone]
    except ClientError:
        return None
    if not ranked:
        return None
    best = ranked[0]
    score = "no placement score" if best.score is None else f"placement score {best.score}/10"
    price = "" if best.price is None else f", spot ${best.price:.4f}/h"
    return (f"{zone or 'this zone'} has no capacity for it now; the next-best zone is {best.zone} ({score}{price}): "
            f"`fab preflight --pick-zone --write` sets availabilityZone to it (or wait and retry)")
