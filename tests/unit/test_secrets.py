"""cluster/job/secrets.py: which --env settings are secrets, both ways (no secret missed, no ordinary
setting flagged). Every value here is made up; none is a real credential."""

from __future__ import annotations

import pytest

from cluster.job import secrets

# Made-up values in the shapes the services publish.
GITHUB = "ghp_" + "a1B2c3D4e5" * 4
HUGGING_FACE = "hf_" + "AbCdEfGhIj" * 4
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret key
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN", "AWS_SESSION_TOKEN", "NODE_AUTH_TOKEN", "NGROK_AUTHTOKEN",
    "WANDB_API_KEY", "OPENAI_API_KEY", "KAGGLE_KEY", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "PRIVATE_KEY",
    "DD_APIKEY", "AZURE_CLIENT_SECRET", "SECRET_KEY", "CLIENTSECRET", "db_password", "PGPASSWORD",
    "MLFLOW_TRACKING_PASSWORD", "SMTP_PASSWD", "SMTP_PASS", "MYSQL_PWD", "GPG_PASSPHRASE",
    "DATABASE_URL", "SQLALCHEMY_DATABASE_URI", "ANALYTICS_DB_URL", "AZURE_STORAGE_CONNECTION_STRING",
    "PG_CONN_STR", "SENTRY_DSN", "DSN", "GITHUB_PAT", "AZURE_DEVOPS_PAT", "REDISCLI_AUTH", "NPM_CONFIG__AUTH",
    "PROXY_AUTHORIZATION", "GOOGLE_APPLICATION_CREDENTIALS", "REGISTRY_CREDS", "SLACK_WEBHOOK_URL",
    "SESSION_COOKIE", "API_JWT", "X-Amz-Signature", "SSHPASS", "DOCKER_AUTH_CONFIG",
])
def test_a_secret_name_is_a_secret(name):
    assert secrets.secret_name(name) and secrets.is_secret(name, "some-value")


@pytest.mark.parametrize("name", [
    "OMP_NUM_THREADS", "CCL_LOG_LEVEL", "KEYBOARD_LAYOUT", "TOKENIZERS_PARALLELISM", "MAX_NEW_TOKENS", "PATH",
    "LD_LIBRARY_PATH", "PWD", "OLDPWD", "GIT_AUTHOR_NAME", "SSH_AUTH_SOCK", "FI_PROVIDER", "KMP_AFFINITY",
    "I_MPI_PIN_DOMAIN", "MASTER_ADDR", "HF_HOME", "HF_HUB_OFFLINE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI",
    "HTTP_PROXY", "PYTHONHASHSEED", "BYPASS_CACHE", "PATIENCE", "DATABASE_NAME", "PYTHON_KEYRING_BACKEND",
])
def test_an_ordinary_setting_is_not(name):
    assert not secrets.secret_name(name)


@pytest.mark.parametrize("value", [
    "https://user:pw@mlflow.example.com", "postgres://app:s3cret@db.internal:5432/app",
    "redis://:hunter2@cache:6379/0", f"https://{GITHUB}@github.com/org/repo.git",
    "https://x-access-token:abc@github.com/o/r", "https://oauth2:whatever@gitlab.example.com",
    "https://" + "a" * 40 + "@host.example.com/",
    "https://bucket.s3.amazonaws.com/k?X-Amz-Credential=x&X-Amz-Security-Token=y&X-Amz-Signature=abc",
    "https://acct.blob.core.windows.net/c?sv=2022&sig=abcdef", "https://api.example.com/hook?access_token=abc",
    "Server=db;Database=app;User Id=app;Password=s3cret;",
    "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=abc==;EndpointSuffix=core.windows.net",
    "Driver={x};Server=db;Uid=app;Pwd=s3cret", "host=db user=app password=s3cret dbname=app",
    "--hub_token=abc --other=1", "AKIAIOSFODNN7EXAMPLE", AWS_SECRET, GITHUB, "github_pat_" + "A1b2" * 8,
    "glpat-" + "a1B2c3D4e5" * 2, "glrt-" + "a1B2c3D4e5" * 2, "gldt-" + "Zz9_x" * 5,
    HUGGING_FACE, "xoxb-123456789012-abcdefghij", "sk-proj-" + "Ab1" * 10,
    "sk_live_" + "a1B2" * 6, "AIza" + "B" * 35, "ya29." + "c" * 30, "npm_" + "d1" * 18, "pypi-AgE" + "e" * 60, JWT,
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn...\n-----END OPENSSH PRIVATE KEY-----",
])
def test_a_secret_value_is_a_secret_whatever_its_name(value):
    assert secrets.secret_value(value) and secrets.is_secret("ANY_SETTING", value)


@pytest.mark.parametrize("value", [
    "info", "tcp", "8", "close", "granularity=fine,compact,1,0", "https://mlflow.example.com:5000",
    "ssh://git@github.com/org/repo.git", "https://user@example.com/", "mailto:someone@example.com",
    "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4", "/home/ubuntu/xeon-cluster-runs/qa-20240101-000000-abcd",
    "0123456789abcdef0123456789abcdef01234567",  # a git commit (hex: one case)
    "https://example.com/search?q=tokens&page=2", "--max_tokens=5 --learning_rate=3e-5",
    "sqlite:///tmp/app.db", "http://proxy.internal:3128", "--use_auth_token=true",
])
def test_an_ordinary_value_is_not(value):
    assert not secrets.secret_value(value)


@pytest.mark.parametrize("value", ["", "0", "1", "true", "False", "yes", "off"])
def test_an_empty_or_switch_value_is_never_a_secret_whatever_its_name(value):
    assert not secrets.is_secret("HF_HUB_DISABLE_IMPLICIT_TOKEN", value)
    assert secrets.is_secret("HF_HUB_DISABLE_IMPLICIT_TOKEN", "hf_abc")


def test_secret_looking_and_split_keep_the_order_and_never_lose_a_setting():
    env = {"MLFLOW_TRACKING_URI": "https://u:pw@mlflow.example.com", "OMP_NUM_THREADS": "8",
           "GITHUB_PAT": "x", "CCL_LOG_LEVEL": "info", "HF_TOKEN": "hf_x", "EMPTY_TOKEN": ""}
    assert secrets.secret_looking(env) == ["MLFLOW_TRACKING_URI", "GITHUB_PAT", "HF_TOKEN"]
    plain, secret = secrets.split(env)
    assert list(secret) == ["MLFLOW_TRACKING_URI", "GITHUB_PAT", "HF_TOKEN"]
    assert plain == {"OMP_NUM_THREADS": "8", "CCL_LOG_LEVEL": "info", "EMPTY_TOKEN": ""}
    assert {**plain, **secret} == env
