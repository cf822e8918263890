"""The one rule for the subnet (and zone) a cluster without subnetId goes into: the program and
`fab preflight` both use cluster/stack/subnet_choice.py."""

from cluster.stack import subnet_choice


SUBNETS = {"subnet-0c": "us-east-1a", "subnet-0a": "us-east-1c", "subnet-0b": "us-east-1b", "subnet-09": "us-east-1e"}


def test_the_lowest_subnet_id_in_an_offering_zone_not_the_first_zone_by_name():
    # us-east-1e does not offer the type: its lower id does not count.
    assert subnet_choice.chosen(SUBNETS, {"us-east-1a", "us-east-1b", "us-east-1c"}) == ("subnet-0a", "us-east-1c")


def test_availability_zone_narrows_the_choice_and_nothing_left_is_none():
    assert subnet_choice.chosen(SUBNETS, {"us-east-1a", "us-east-1c"}, "us-east-1a") == ("subnet-0c", "us-east-1a")
    assert subnet_choice.chosen(SUBNETS, {"us-east-1a"}, "us-east-1b") is None
    assert subnet_choice.choose_subnet([]) is None
    assert subnet_choice.choose_subnet(["subnet-2", "subnet-10", "subnet-1"]) == "subnet-1"  # as strings sort
