"""Hourly price of an instance type: spot price history, else the Pricing API, else a static table.

Every answer says where it came from (`Price.source`), and `fab plan` prints it: a spot price is
what the last hours cost in one availability zone, not a promise. Without spot price history
`fab plan` prices a spot plan at a stated estimate (`plan_price`); `fab status` at on-demand.
"""

from __future__ import annotations

import datetime as dt
import json

from botocore.exceptions import BotoCoreError, ClientError

from cluster.cost.costplan import Price, spot_estimate
from node_setup.aws import clients as aws
from node_setup.aws import errors

# The Pricing API answers only in a few regions; us-east-1 serves every region's prices.
PRICING_API_REGION = "us-east-1"
SPOT_HISTORY_HOURS = 6

# On-demand Linux prices in us-east-1 (USD per hour), from the AWS "Amazon EC2 On-Demand Pricing"
# page; used only when the Pricing API cannot be reached or denies access. Other regions cost
# somewhat more; the printed source says that this table was used.
STATIC_ON_DEMAND_USD = {
    "r7iz.metal-16xl": 5.952,
    "r7iz.metal-32xl": 11.904,
    "c6i.16xlarge": 2.72,
    "c6i.32xlarge": 5.44,
    "c6in.32xlarge": 7.2576,
    "c7i.16xlarge": 2.856,
    "c7i.metal-24xl": 4.284,
    "c7i.metal-48xl": 8.568,
    "m7i.48xlarge": 9.6768,
    "c7i.48xlarge": 8.568,
    "r7i.48xlarge": 12.7008,
    "m7i.metal-48xl": 9.6768,
    "r7i.metal-48xl": 12.7008,
    "m6i.16xlarge": 3.072,
    "r6i.16xlarge": 4.032,
    "m6i.32xlarge": 6.144,
    "r6i.32xlarge": 8.064,
}
STATIC_SOURCE = "on-demand, static table (us-east-1 Linux list price; may be out of date)"


def latest_spot_prices(ec2, instance_type: str, zones: list[str] | None = None,
                       now: dt.datetime | None = None) -> dict[str, tuple[float, dt.datetime]]:
    """Zone -> (latest Linux spot price, its time) over the last SPOT_HISTORY_HOURS hours."""
    now = now or dt.datetime.now(dt.timezone.utc)
    kwargs = dict(InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                  StartTime=now - dt.timedelta(hours=SPOT_HISTORY_HOURS), EndTime=now)
    if zones:
        kwargs["Filters"] = [{"Name": "availability-zone", "Values": list(zones)}]
    latest: dict[str, tuple[float, dt.datetime]] = {}
    for page in ec2.get_paginator("describe_spot_price_history").paginate(**kwargs):
        for entry in page.get("SpotPriceHistory", []):
            zone, stamp = entry["AvailabilityZone"], entry["Timestamp"]
            if zones and zone not in zones:
                continue
            if zone not in latest or stamp > latest[zone][1]:
                latest[zone] = (float(entry["SpotPrice"]), stamp)
    return latest


def spot_price(ec2, instance_type: str, region: str, zones: list[str] | None = None) -> Price | None:
    """The cheapest zone's latest spot price, or None when there is no history."""
    latest = latest_spot_prices(ec2, instance_type, zones)
    if not latest:
        return None
    zone = min(latest, key=lambda z: (latest[z][0], z))
    price, stamp = latest[zone]
    return Price(price, "spot", f"spot price history, {zone}, {stamp:%Y-%m-%d %H:%M} UTC", zone)


def on_demand_price(pricing, instance_type: str, region: str) -> Price | None:
    """Linux, shared tenancy, no pre-installed software, from the Pricing API (None if not listed).

    Filtered on the region code (`regionCode`, e.g. `eu-north-1`), not on the `location` name:
    the Pricing API's names differ from botocore's region descriptions in EU and South America
    regions ("EU (Stockholm)" against "Europe (Stockholm)"), and a name that matches nothing
    silently fell back to the static us-east-1 table.
    """
    filters = {"ServiceCode": "AmazonEC2", "Filters": [
        {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
            ("instanceType", instance_type), ("regionCode", region), ("operatingSystem", "Linux"),
            ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]}
    for page in pricing.get_paginator("get_products").paginate(**filters):
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dimension in term.get("priceDimensions", {}).values():
                    usd = float(dimension.get("pricePerUnit", {}).get("USD", 0) or 0)
                    if usd > 0 and dimension.get("unit") in ("Hrs", "Hours", None):
                        return Price(usd, "on-demand", f"on-demand, AWS Pricing API ({region})")
    return None


def static_on_demand_price(instance_type: str) -> Price | None:
    usd = STATIC_ON_DEMAND_USD.get(instance_type)
    return Price(usd, "on-demand", STATIC_SOURCE) if usd else None


def hourly_price(instance_type: str, region: str, *, spot: bool = True, zones: list[str] | None = None,
                 ec2=None, pricing=None, notes: list[str] | None = None) -> Price:
    """The best price we can know for one instance-hour; `notes` collects why a source was skipped."""
    notes = notes if notes is not None else []
    if spot:
        try:
            found = spot_price(ec2 or aws.client("ec2", region), instance_type, region, zones)
            if found:
                return found
            notes.append(f"no spot price history for {instance_type} in {region}")
        except (ClientError, BotoCoreError) as exc:
            notes.append(f"spot price history unavailable ({errors.describe(exc, 160)})")
    try:
        found = on_demand_price(pricing or aws.client("pricing", PRICING_API_REGION), instance_type, region)
        if found:
            return found
        notes.append(f"the Pricing API lists no on-demand price for {instance_type} in {region}")
    except (ClientError, BotoCoreError) as exc:
        notes.append(f"Pricing API unavailable ({errors.describe(exc, 160)})")
    found = static_on_demand_price(instance_type)
    if found:
        return found
    raise LookupError(f"no price for instance type {instance_type!r} in {region}: "
                      + "; ".join(notes) + f"; the static table knows {', '.join(sorted(STATIC_ON_DEMAND_USD))}. "
                      "Pass --hourly-usd to give the price yourself")


def plan_price(instance_type: str, region: str, *, spot: bool = True, ec2=None, pricing=None,
               notes: list[str] | None = None) -> Price:
    """`fab plan`'s price: as `hourly_price`, except that a spot plan without spot price history is
    priced at the stated spot estimate (cluster/cost/costplan.py `spot_estimate`) of the on-demand price,
    not at the on-demand price itself (which `fab status` keeps as its upper bound)."""
    found = hourly_price(instance_type, region, spot=spot, ec2=ec2, pricing=pricing, notes=notes)
    return spot_estimate(found) if spot and found.market != "spot" else found


class PriceBook:
    """Each node's hourly price, by (instance type, spot or on-demand, zone), looked up once per `fab` run.

    A spot node is priced at its own zone's latest spot price; when there is none, at the
    on-demand price (an upper bound), and the source says why.
    """

    def __init__(self, region: str, *, ec2=None, pricing=None):
        self.region, self._ec2, self._pricing = region, ec2, pricing
        self._known: dict[tuple[str, bool, str | None], Price] = {}

    def price(self, instance_type: str, *, spot: bool, zone: str | None = None) -> Price:
        """The price of one instance-hour; LookupError (with why) when no source knows one."""
        key = (instance_type, spot, zone)
        if key not in self._known:
            self._ec2 = self._ec2 or (aws.client("ec2", self.region) if spot else None)
            skipped: list[str] = []
            found = hourly_price(instance_type, self.region, spot=spot, zones=[zone] if zone else None,
                                 ec2=self._ec2, pricing=self._pricing, notes=skipped)
            if spot and found.market != "spot":
                found = Price(found.usd_per_hour, found.market, f"{found.source} ({'; '.join(skipped)})", zone)
            self._known[key] = found
        return self._known[key]
