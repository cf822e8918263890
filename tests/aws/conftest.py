"""moto fixture chain: fake credentials (tests/conftest.py) -> mock_aws() -> clients made in each test."""

import pytest

from tests.conftest import AWS_TEST_REGION as REGION

moto = pytest.importorskip("moto")


@pytest.fixture
def mocked_aws(aws_credentials):
    with moto.mock_aws():
        yield REGION
