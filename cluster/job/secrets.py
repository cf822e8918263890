"""Which environment settings are secrets (pure): the one rule for every --env that is written down.

A `--env NAME=VALUE` of `fab train` or `fab k8s-job` may end up in a file: the supervised run's spec
beside the checkpoints and in the output folder (cluster/run/runspec.py), the PyTorchJob manifest
(cluster/job/k8s.py warns). What is a secret is decided here, once, by its name or by its value:

- by name (`secret_name`, case, '-' and '.' aside): SECRET, PASSWORD, PASSWD, CREDENTIAL or WEBHOOK
  anywhere in it; then the name cut into its '_' words (GIT_AUTHOR_NAME is not an AUTH, nor
  TOKENIZERS_PARALLELISM a TOKEN, nor KEYBOARD_LAYOUT a KEY): a word ending in TOKEN, KEY,
  PASSPHRASE or SIGNATURE (HF_TOKEN, AUTHTOKEN, WANDB_API_KEY, APIKEY); a word PASS, CREDS,
  COOKIE(S), JWT, BEARER, SIG or DSN; a last word AUTH, AUTHORIZATION, PAT or PWD after another
  (GITHUB_PAT, REDISCLI_AUTH, MYSQL_PWD; the shell's PWD and PATH are not); DATABASE_URL/_URI,
  DB_URL/_URI and a connection string (*_CONNECTION_STRING, *_CONN_STR); SSHPASS and DOCKER_AUTH_CONFIG;
- by value (`secret_value`), anywhere in it: credentials in a URL (scheme://user:password@host, or
  a token as the user), a secret-named parameter (`?access_token=`, `&X-Amz-Signature=`, a connection
  string's `Password=`/`AccountKey=`, libpq's `password=`, `--hub_token=`), an AWS access key id or a
  secret-access-key-shaped word (40 of base64's letters, upper and lower case and digits), a private
  key block, a JWT, and the tokens of the common services by their published prefixes (GitHub,
  GitLab's glpat-, glrt-, gldt-, ..., Hugging Face, Slack, OpenAI/Anthropic/Stripe `sk-`/`sk_live_`,
  Google API keys and OAuth access tokens, npm, PyPI).

A value that is empty or a switch word (0, 1, true, false, yes, no, on, off) is never a secret,
whatever its name (HF_HUB_DISABLE_IMPLICIT_TOKEN=1 is a setting): there is nothing to keep apart.

API: `secret_name(name)`, `secret_value(value)`, `is_secret(name, value)`; for a mapping,
`secret_looking(env)` (the secret names, in env's order) and `split(env)` -> (plain, secret).
"""

from __future__ import annotations

import re
from typing import Mapping

# A '_' word of the name that ends in one of these (HF_TOKEN, AUTHTOKEN, WANDB_API_KEY, APIKEY,
# X_AMZ_SIGNATURE).
_WORD_ENDINGS = ("TOKEN", "KEY", "PASSPHRASE", "SIGNATURE")
# A '_' word that is one of these, anywhere in the name; or a name that holds one of _NAME_PARTS
# (CLIENT_SECRET, PGPASSWORD, GOOGLE_APPLICATION_CREDENTIALS, SLACK_WEBHOOK_URL).
_WORDS = frozenset({"PASS", "CREDS", "COOKIE", "COOKIES", "JWT", "BEARER", "SIG", "DSN"})
_NAME_PARTS = ("SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "WEBHOOK")
# The last word, after at least one other (GITHUB_PAT, NPM_CONFIG__AUTH, MYSQL_PWD: not PWD, PATH).
_LAST_WORDS = frozenset({"AUTH", "AUTHORIZATION", "PAT", "PWD"})
_NAME_RES = (re.compile(r"(?:^|_)(?:DATABASE|DB)_UR[IL]\Z"),
             re.compile(r"CONN(?:ECTION)?_?STR(?:ING)?(?:\Z|_)"))
# Whole names of well-known tools' secrets the rules above miss: sshpass(1)'s password, Docker's registry
# credentials (GitLab CI's DOCKER_AUTH_CONFIG, a config.json with base64 user:password).
_SECRET_NAMES = frozenset({"SSHPASS", "DOCKER_AUTH_CONFIG"})
SWITCH_VALUES = frozenset({"", "0", "1", "TRUE", "FALSE", "YES", "NO", "ON", "OFF"})

_URL_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#@\s]+)@")
# NAME=VALUE inside a value: a URL's query, a connection string (;), libpq keywords, a --flag=.
_PAIR = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z][A-Za-z0-9_.-]*)[ \t]*=[ \t]*([^;&\s]*)")
_AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)"
                         r"[A-Z0-9]{16}(?![A-Z0-9])")
_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_TOKEN_SHAPES = re.compile("|".join((
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----",
    r"(?<![A-Za-z0-9_])(?:"
    r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|gl(?:pat|rt|dt|ptt|cbt|ft|soat|imt)-[A-Za-z0-9_-]{20,}"  # GitLab: personal, runner, deploy, trigger ...
    r"|hf_[A-Za-z0-9]{30,}|xox[abeoprs]-[A-Za-z0-9-]{10,}"  # Hugging Face, Slack
    r"|sk-[A-Za-z0-9_-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"  # OpenAI, Anthropic; Stripe
    r"|AIza[0-9A-Za-z_-]{35}|ya29\.[0-9A-Za-z_-]{20,}"  # Google API key, OAuth access token
    r"|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{50,}"  # npm, PyPI
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"  # a JWT
    r")")))


def secret_name(name: str) -> bool:
    """Whether a setting of this name holds a secret (case does not matter)."""
    upper = name.upper().replace("-", "_").replace(".", "_")
    parts = upper.split("_")
    words = [w for w in parts if w]
    return (upper in _SECRET_NAMES or any(part in upper for part in _NAME_PARTS)
            or any(w.endswith(_WORD_ENDINGS) or w in _WORDS for w in words)
            or (len(parts) > 1 and bool(words) and words[-1] in _LAST_WORDS)
            or any(r.search(upper) for r in _NAME_RES))


def _switch(value: str) -> bool:
    return value.strip().upper() in SWITCH_VALUES


def _secret_userinfo(userinfo: str) -> bool:
    user, colon, password = userinfo.partition(":")
    return bool(colon and password) or bool(_TOKEN_SHAPES.search(user)) or len(user) >= 32


def secret_value(value: str) -> bool:
    """Whether `value` carries a secret whatever its name: see the module's docstring."""
    if _switch(value):
        return False
    if any(_secret_userinfo(m.group(1)) for m in _URL_USERINFO.finditer(value)):
        return True
    for key, found in _PAIR.findall(value):
        if found and not _switch(found) and (secret_name(key) or key.upper() == "PWD"):
            return True
    if _AWS_KEY_ID.search(value) or _TOKEN_SHAPES.search(value):
        return True
    return any(re.search(r"[A-Z]", m) and re.search(r"[a-z]", m) and re.search(r"[0-9]", m)
               for m in _AWS_SECRET_SHAPE.findall(value))


def is_secret(name: str, value: str) -> bool:
    """Whether the setting `name=value` is a secret: by its name (unless the value is empty or a
    switch word) or by its value."""
    return (secret_name(name) and not _switch(value)) or secret_value(value)


def secret_looking(env: Mapping[str, str]) -> list[str]:
    """The names in `env` whose setting is a secret (`is_secret`), in env's order."""
    return [name for name, value in env.items() if is_secret(name, value)]


def split(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`env` as (the settings that are not secrets, the secrets), each in env's order."""
    secret = set(secret_looking(env))
    return ({k: v for k, v in env.items() if k not in secret}, {k: v for k, v in env.items() if k in secret})
