"""The workers' Auto Scaling group: how it spreads over several instance types, and why it has fewer instances
than it wants, in one line (pure).

With `instanceTypes` (several types of one shape) the group launches from a mixed instances policy
(infra/node_group.py): its launch template's type is the first, each listed type an override in the stack's
order, and the instances distribution below. Spot uses AWS's recommended `price-capacity-optimized`
allocation (the pools least likely to be interrupted, then the cheapest of them); it does not follow the
order: `capacity-optimized-prioritized` would, on a best-effort basis, at the price of launching into a
pool with less room. On-demand (`workerSpot: false`) follows the order (`prioritized`): the first type that
has capacity. The launch template holds no spot market options then: AWS refuses a template that asks for
spot in a mixed instances policy, whose distribution chooses the market.

Two readers share these rules: the Pulumi program's error hook on the group (a `pulumi up` whose
group could not be filled) and `fab status` (node_setup/aws/worker_group.py, from
DescribeScalingActivities). The AWS provider's wait for capacity already fails with the group's own
reason: it reads the scaling activities and fails on the first one that ended `Failed`, its error
reading `scaling activity (<id>): Failed: <status message>`; a plain timeout means no activity had
failed yet. These rules find that message and add what to change for it.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

SPOT_ALLOCATION = "price-capacity-optimized"
ON_DEMAND_ALLOCATION = "prioritized"
# The field of the policy `fab up` raises for onDemandFallback (the program leaves it to it: ignore_changes).
FALLBACK_FIELD = "mixedInstancesPolicy.instancesDistribution.onDemandBaseCapacity"


def mixed(types: Sequence[str]) -> bool:
    """Whether the group spreads over several types: more than one type listed."""
    return len(types) > 1


def uses_policy(types: Sequence[str], fallback: bool) -> bool:
    """Whether the group launches from a mixed instances policy: several types, or onDemandFallback on (whose
    on-demand base `fab up` raises; a one-type policy then)."""
    return mixed(types) or fallback


def fallback_base(wanted: int, in_service: int, base: int, reason: str | None) -> int | None:
    """onDemandFallback, after its wait: the on-demand base that fills the missing workers on demand (the group's
    base so far plus the missing ones; it keeps its spot workers), or None when nothing is missing or the group's
    latest failure is not one of capacity."""
    missing = wanted - in_service
    if missing <= 0 or not reason or advice(reason) != _ADVICE[0][1]:
        return None
    return min(wanted, base + missing)


def fallback_line(group: str, base: int, waited: str, reason: str) -> str:
    """`fab up`'s line when it turns to on demand."""
    return (f"{group}: no spot capacity for {waited} ({reason}); onDemandFallback: the group's on-demand base is "
            f"now {base}, so it launches {base} worker(s) on demand, of the same types (`fab status` shows each "
            "node's market); after the idle auto-stop the next `fab up` asks for spot again")


def distribution(spot: bool, max_price: float | None) -> dict[str, Any]:
    """The mixed instances policy's instances distribution (the provider's argument names): every worker spot,
    or every worker on-demand, none as a base."""
    return {"on_demand_base_capacity": 0, "on_demand_percentage_above_base_capacity": 0 if spot else 100,
            "on_demand_allocation_strategy": ON_DEMAND_ALLOCATION, "spot_allocation_strategy": SPOT_ALLOCATION,
            "spot_max_price": f"{max_price:.4f}" if spot and max_price else ""}


# The provider's error for a failed scaling activity (terraform-provider-aws, the group's capacity wait).
_ACTIVITY = re.compile(r"scaling activity \(([^)]*)\): Failed: (.+?)(?:\n|$)")

# What each kind of launch failure asks of the user (the status message's wording, then the advice).
_ADVICE = (
    (("InsufficientInstanceCapacity", "insufficient capacity", "no Spot capacity", "capacity-not-available"),
     "no capacity: run `pulumi up` again later, or change one of workerSpot: false (on-demand), subnetId "
     "(another zone), placementGroup: false, instanceType"),
    (("VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "quota", "limit"),
     "a quota: lower workerCount, or ask AWS for a larger vCPU quota (`fab preflight` shows it)"),
    (("placement group", "PlacementGroup", "InvalidPlacementGroup"),
     "the placement group: placementGroup: false, or another subnetId/instanceType"),
    (("price", "SpotMaxPriceTooLow", "bid"),
     "the spot price cap: raise or unset spotMaxPrice, or workerSpot: false"),
)


def activity_failure(error: str) -> tuple[str, str] | None:
    """(activity id, status message) of a failed scaling activity named in a provider error, or None."""
    found = _ACTIVITY.search(error or "")
    return (found.group(1), found.group(2).strip()) if found else None


def advice(reason: str) -> str:
    """What to change for a launch failure's status message ('' when the toolkit knows no advice)."""
    lowered = reason.lower()
    for markers, said in _ADVICE:
        if any(m.lower() in lowered for m in markers):
            return said
    return ""


def other_types(reason: str, types: Sequence[str]) -> list[str]:
    """The group's types besides the one a capacity failure names (its mixed instances policy goes on with
    them); [] for one type, another kind of failure, or a message that names none of the types."""
    if not mixed(types) or advice(reason) != _ADVICE[0][1]:  # (capacity: the first advice)
        return []
    named = [t for t in types if t in reason]
    return [t for t in types if t not in named] if named else []


# How a line names a group's nodes and the setting of their market: the workers' group, or the master's of one.
WORKERS_SAID = ("worker(s)", "workerSpot")
MASTER_SAID = ("master", "masterSpot")


def failure_line(group: str, wanted: int, reason: str, types: Sequence[str] = (),
                 said: tuple[str, str] = WORKERS_SAID) -> str:
    """One line: the group could not launch its nodes, AWS's reason, and what to change. `types`: the group's
    mixed instances policy's, in order: a capacity failure of one of them names the ones the group goes on
    with (the advice then is only to wait). `said`: how its nodes and their market's setting are named."""
    noun, spot = said
    others = other_types(reason, types)
    if others:
        hint = (f"the group goes on with its other type(s), {', '.join(others)} (next: {others[0]}; with spot, AWS "
                f"picks the pool by {SPOT_ALLOCATION}); if none has room either, one of: workerSpot: false, "
                "another zone, placementGroup: false")
    else:
        hint = advice(reason).replace(WORKERS_SAID[1], spot)
    return (f"{group}: AWS could not launch the {wanted} {noun} of the group: {reason}"
            + (f"; {hint}" if hint else "") + "; `fab preflight` checks new settings")


# What the group does after a wait for it ended short: it goes on launching.
KEEPS_TRYING = ("the group keeps trying to launch the missing worker(s): each one it launches later is billed "
                "and joins the cluster (`fab status` shows them); the idle auto-stop sets the group to 0 with "
                "the cluster, `fab down` removes it")


def timeout_line(group: str, wanted: int, timeout: str, said: tuple[str, str] = WORKERS_SAID) -> str:
    """The program's wait for the group ended without its nodes (the provider waits through failed
    scaling activities, so the reason is the group's latest one, which `fab up` reads)."""
    keeps_trying = KEEPS_TRYING.replace(WORKERS_SAID[0], said[0])
    return (f"{group}: the group's {wanted} {said[0]}: not in service within {timeout}; {keeps_trying}; "
            "`fab up` and `fab status` name the group's latest scaling activity (the reason)")


def capacity_line(group: str, wanted: int, in_service: int, reason: str | None, waited: str,
                  types: Sequence[str] = ()) -> str:
    """`fab up`'s line when the group had fewer workers in service than it wants after the wait: how many,
    the group's own reason (its latest scaling activity, when it failed) and what to change, and what the
    group does next."""
    why = failure_line(group, wanted, reason, types) if reason else (
        f"{group}: no scaling activity has failed (AWS is still launching or looking for capacity)")
    return f"{in_service} of {wanted} worker(s) in service after {waited}; {why}; {KEEPS_TRYING}"


def latest_failure(activities: Iterable[Mapping]) -> str | None:
    """The status message of the newest scaling activity if it failed (DescribeScalingActivities lists newest
    first), else None: an older failure that a later successful launch followed is history, not a reason."""
    for activity in activities:
        if activity.get("StatusCode") == "Failed":
            return str(activity.get("StatusMessage") or activity.get("Description") or "failed, no message")
        return None
    return None
