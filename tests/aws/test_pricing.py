"""Prices: spot history (moto and a stubbed history), Pricing API, static fallback, printed source.

moto's spot price history is fake (every zone offering the type at $0.00001, dated 2006) and moto
has no Pricing API. `stubbed_spot_history` and `stubbed_pricing` are test doubles built on botocore's
Stubber over real clients: they check our requests and their answers against the API's shapes.
"""

import datetime as dt
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

pytest.importorskip("moto")

from node_setup.aws import pricing  # noqa: E402

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_moto_spot_history_gives_a_spot_price_in_an_offering_zone(mocked_aws):
    ec2 = boto3.client("ec2", region_name=mocked_aws)
    price = pricing.spot_price(ec2, "r7iz.metal-16xl", mocked_aws)
    assert price.market == "spot" and price.zone in {"us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d",
                                                      "us-east-1f"}
    assert price.source.startswith(f"spot price history, {price.zone}")
    only_b = pricing.spot_price(ec2, "r7iz.metal-16xl", mocked_aws, zones=["us-east-1b"])
    assert only_b.zone == "us-east-1b"
    assert pricing.spot_price(ec2, "r7iz.metal-16xl", mocked_aws, zones=["us-east-1e"]) is None


def stubbed_spot_history(entries):
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(ec2)
    stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"AvailabilityZone": zone, "InstanceType": "r7iz.metal-16xl", "ProductDescription": "Linux/UNIX",
         "SpotPrice": price, "Timestamp": NOW - dt.timedelta(hours=hours_ago)} for zone, price, hours_ago in entries]},
        {"InstanceTypes": ["r7iz.metal-16xl"], "ProductDescriptions": ANY, "StartTime": ANY, "EndTime": ANY})
    stub.activate()
    return ec2


def test_the_latest_price_per_zone_counts_and_the_cheapest_zone_wins():
    ec2 = stubbed_spot_history([("us-east-1a", "1.90", 5), ("us-east-1a", "2.40", 1),  # a went up
                                ("us-east-1b", "2.60", 4), ("us-east-1b", "2.10", 2)])  # b went down
    latest = pricing.latest_spot_prices(ec2, "r7iz.metal-16xl", now=NOW)
    assert {z: p for z, (p, _) in latest.items()} == {"us-east-1a": 2.40, "us-east-1b": 2.10}


def test_spot_price_picks_the_cheapest_latest_zone():
    ec2 = stubbed_spot_history([("us-east-1a", "2.40", 1), ("us-east-1b", "2.10", 2), ("us-east-1c", "2.20", 3)])
    price = pricing.spot_price(ec2, "r7iz.metal-16xl", "us-east-1")
    assert (price.usd_per_hour, price.zone) == (2.10, "us-east-1b")


def _price_list_item(usd):
    return json.dumps({"product": {"attributes": {"instanceType": "r7iz.metal-16xl"}}, "terms": {"OnDemand": {
        "T1": {"priceDimensions": {"T1.D1": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}}})


def stubbed_pricing(*, items=None, error=None):
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if error:
        stub.add_client_error("get_products", service_error_code=error, http_status_code=400)
    else:
        stub.add_response("get_products", {"PriceList": items or [], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "Filters": ANY})
    stub.activate()
    return client


def test_on_demand_price_from_the_pricing_api_names_the_region():
    price = pricing.on_demand_price(stubbed_pricing(items=[_price_list_item("5.9520000000")]), "r7iz.metal-16xl",
                                    "eu-west-1")
    assert price.usd_per_hour == pytest.approx(5.952)
    assert price.source == "on-demand, AWS Pricing API (eu-west-1)"


@pytest.mark.parametrize("region", ["eu-north-1", "sa-east-1", "eu-west-1", "us-east-1"])
def test_the_pricing_api_is_asked_by_region_code_not_by_location_name(region):
    """botocore's region names ("Europe (Stockholm)") are not the Pricing API's ("EU (Stockholm)")."""
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("get_products", {"PriceList": [_price_list_item("1.5")], "FormatVersion": "aws_v1"},
                      {"ServiceCode": "AmazonEC2", "Filters": [
                          {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
                              ("instanceType", "c6i.16xlarge"), ("regionCode", region), ("operatingSystem", "Linux"),
                              ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]})
    stub.activate()
    price = pricing.on_demand_price(client, "c6i.16xlarge", region)
    stub.assert_no_pending_responses()
    assert price.usd_per_hour == 1.5 and region in price.source


def test_no_spot_history_falls_back_to_the_pricing_api():
    notes = []
    price = pricing.hourly_price("r7iz.metal-16xl", "us-east-1", ec2=stubbed_spot_history([]),
                                 pricing=stubbed_pricing(items=[_price_list_item("5.952")]), notes=notes)
    assert price.market == "on-demand" and "Pricing API" in price.source
    assert notes == ["no spot price history for r7iz.metal-16xl in us-east-1"]


def test_unreachable_pricing_api_falls_back_to_the_static_table_and_says_so():
    notes = []
    price = pricing.hourly_price("c6i.16xlarge", "us-east-1", spot=False,
                                 pricing=stubbed_pricing(error="AccessDeniedException"), notes=notes)
    assert price.usd_per_hour == pricing.STATIC_ON_DEMAND_USD["c6i.16xlarge"]
    assert "static table" in price.source and "AccessDeniedException" in notes[0]


def test_no_source_at_all_says_what_to_do():
    with pytest.raises(LookupError, match="--hourly-usd"):
        pricing.hourly_price("x9z.tiny", "us-east-1", spot=False, pricing=stubbed_pricing(items=[]))


def test_fab_plan_prices_spot_from_the_history_when_there_is_one():
    price = pricing.plan_price("r7iz.metal-16xl", "us-east-1", ec2=stubbed_spot_history([("us-east-1b", "2.10", 1)]),
                               pricing=stubbed_pricing(items=[_price_list_item("5.952")]))
    assert (price.market, price.usd_per_hour, price.estimate) == ("spot", 2.10, False)


def test_fab_plan_without_spot_history_states_a_spot_estimate_not_the_on_demand_price():
    from cluster.cost.costplan import SPOT_ESTIMATE_FRACTION

    notes = []
    price = pricing.plan_price("r7iz.metal-16xl", "us-east-1", ec2=stubbed_spot_history([]),
                               pricing=stubbed_pricing(items=[_price_list_item("5.952")]), notes=notes)
    assert price.market == "spot" and price.estimate
    assert price.usd_per_hour == pytest.approx(5.952 * SPOT_ESTIMATE_FRACTION)
    assert price.source.startswith(f"spot estimate: {SPOT_ESTIMATE_FRACTION:g} x the on-demand $5.9520 "
                                   "(on-demand, AWS Pricing API (us-east-1))")
    assert notes == ["no spot price history for r7iz.metal-16xl in us-east-1"]
    on_demand = pricing.plan_price("r7iz.metal-16xl", "us-east-1", spot=False,
                                   pricing=stubbed_pricing(items=[_price_list_item("5.952")]))
    assert (on_demand.market, on_demand.usd_per_hour, on_demand.estimate) == ("on-demand", 5.952, False)


def test_fab_plan_prices_an_on_demand_master_against_a_quoted_spot_price_from_the_pricing_api():
    """A spot price from the history has no on-demand basis: `fab plan` asks the Pricing API for the master's."""
    from cluster.cost import costplan, plan_options
    from node_setup.tasks.costs import _on_demand_price

    inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(nodes="4", single_node_time="1h"))
    spot = pricing.plan_price("r7iz.metal-16xl", "us-east-1", ec2=stubbed_spot_history([("us-east-1b", "2.10", 1)]),
                              pricing=stubbed_pricing(items=[]))
    on_demand, why = _on_demand_price(inputs, spot, "us-east-1",
                                      pricing_client=stubbed_pricing(items=[_price_list_item("5.952")]))
    assert (on_demand.market, on_demand.usd_per_hour, why) == ("on-demand", 5.952, "")
    rows, line = costplan.with_on_demand_master(costplan.plan_rows(inputs, spot), spot, on_demand)
    row = rows[0]
    # by hand: (5.952 - 2.10) $/hour over the master's 12m 30s of provisioning (cluster/stack/lifecycle.py's steps:
    # its metal boot's typical 9m, cloud-init 3m, the check 30s; not the image's build) + the run + the 30 min idle
    # tail
    assert row.on_demand_master_usd == pytest.approx(3.852 * ((540 + 180 + 30) / 3600 + 0.5
                                                              + row.prediction.run_seconds / 3600))
    assert "the master at $5.9520/hour on demand (on-demand, AWS Pricing API (us-east-1)) instead of $2.1000 spot" \
        in line
