"""moto fixture chain: fake credentials -> mock_aws() -> clients made inside each test."""

import pytest

moto = pytest.importorskip("moto")

REGION = "us-east-1"


@pytest.fixture
def aws_credentials(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def mocked_aws(aws_credentials):
    with moto.mock_aws():
        yield REGION
