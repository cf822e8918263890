"""Fixtures every test folder may use."""

import pytest

AWS_TEST_REGION = "us-east-1"


@pytest.fixture
def aws_credentials(monkeypatch):
    """Fake credentials and region, and no endpoint override: boto3 can only reach moto."""
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SECURITY_TOKEN": "testing", "AWS_SESSION_TOKEN": "testing",
                       "AWS_DEFAULT_REGION": AWS_TEST_REGION, "AWS_REGION": AWS_TEST_REGION}.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
