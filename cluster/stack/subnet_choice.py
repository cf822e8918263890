"""Which subnet (and so which zone) the cluster goes into when the stack names no subnetId: one rule,
used by the Pulumi program (infra/lookups.py) and by `fab preflight` and `--pick-zone`
(node_setup/aws/preflight.py, node_setup/tasks/costs.py), so the checks look at the zone the program
will really launch in.

The rule: among the candidate subnets (the default subnets, or the subnets of vpcId, in a zone that
offers the instance type, and in availabilityZone when it is set), the lowest-sorting subnet id. Not
the first zone by name: a region's subnet ids do not sort in the order of their zones.
"""

from __future__ import annotations

from typing import Iterable, Mapping


def choose_subnet(subnet_ids: Iterable[str]) -> str | None:
    """The subnet the program uses among candidates already narrowed to the right zones; None if none."""
    ids = sorted(subnet_ids)
    return ids[0] if ids else None


def candidates(subnet_zones: Mapping[str, str], offered_zones: Iterable[str],
               availability_zone: str | None = None) -> dict[str, str]:
    """Subnet id -> zone, kept only where the zone offers the type (and is availabilityZone when set)."""
    offered = set(offered_zones)
    return {subnet: zone for subnet, zone in subnet_zones.items()
            if zone in offered and (not availability_zone or zone == availability_zone)}


def chosen(subnet_zones: Mapping[str, str], offered_zones: Iterable[str],
           availability_zone: str | None = None) -> tuple[str, str] | None:
    """(subnet id, zone) the program will use, or None when no subnet qualifies."""
    kept = candidates(subnet_zones, offered_zones, availability_zone)
    subnet = choose_subnet(kept)
    return (subnet, kept[subnet]) if subnet else None
