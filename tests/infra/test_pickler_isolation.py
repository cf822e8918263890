"""What pulumi.dynamic leaves on pickle's Pickler does not outlive a test (tests/isolation.py): every dynamic
provider it serialises wraps the Pickler's methods once more, and given back they are the methods the test
started with. (Without it, after some 950 providers in one worker the next datasets Dataset failed with
RecursionError: the training tests of a worker that had run the infra tests.)"""

import pickle

import pytest

from tests.isolation import PICKLER_METHODS, stdlib_pickler

pytest.importorskip("pulumi")


def methods() -> dict:
    return {name: pickle._Pickler.__dict__[name] for name in PICKLER_METHODS}


def test_a_pickler_wrapped_by_dynamic_providers_is_given_back_as_it_was():
    from pulumi.dynamic import ResourceProvider
    from pulumi.dynamic.dynamic import serialize_provider

    class Provider(ResourceProvider):
        pass

    before = methods()
    with stdlib_pickler():
        serialize_provider(Provider())
        once = methods()
        serialize_provider(Provider())
        twice = methods()
        assert once != before and twice["_batch_setitems"] is not once["_batch_setitems"]  # stacked, not replaced
    assert methods() == before
