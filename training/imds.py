"""Spot interruption and rebalance notices from the EC2 instance metadata service (IMDSv2).

A daemon thread per rank asks for a session token (PUT), then polls the two notices every few
seconds. The training loop reads `notice` between steps; the ranks agree through an all-reduce
(training/callbacks.py), so it does not matter which rank saw it first.
XEON_IMDS_ENDPOINT points the client elsewhere (the tests' fake server on 127.0.0.1).
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_VARIABLE = "XEON_IMDS_ENDPOINT"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_SECONDS = 21600
NOTICE_PATHS = (("spot interruption", "/latest/meta-data/spot/instance-action"),
                ("rebalance recommendation", "/latest/meta-data/events/recommendations/rebalance"))


def endpoint(env=None) -> str:
    env = os.environ if env is None else env
    return (env.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT).rstrip("/")


def watch_enabled(mode: str, env=None, on_ec2: bool = False) -> bool:
    """auto: only on EC2 or with an explicit endpoint, so no other machine ever calls 169.254.169.254."""
    env = os.environ if env is None else env
    if mode in ("on", "off"):
        return mode == "on"
    return bool(env.get(ENDPOINT_VARIABLE)) or on_ec2


class ImdsClient:
    def __init__(self, base_url: str, timeout: float = 2.0):
        self.base_url = base_url
        self.timeout = timeout
        self._token: str | None = None

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str]:
        request = urllib.request.Request(self.base_url + path, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""

    def token(self) -> str:
        status, body = self._request("PUT", TOKEN_PATH,
                                     {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
        if status != 200 or not body:
            raise ConnectionError(f"IMDSv2 token request returned HTTP {status}")
        return body

    def _get(self, path: str) -> tuple[int, str]:
        if self._token is None:
            self._token = self.token()
        status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        if status == 401:  # token expired: fetch a new one once
            self._token = self.token()
            status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        return status, body

    def notice(self) -> str | None:
        """'spot interruption: {...}' or 'rebalance recommendation: {...}', or None."""
        for name, path in NOTICE_PATHS:
            status, body = self._get(path)
            if status == 200:
                return f"{name}: {body.strip()}"
        return None


class InterruptionWatcher(threading.Thread):
    """Polls the metadata service until a notice appears or stop() is called."""

    def __init__(self, client: ImdsClient, interval_seconds: float = 5.0):
        super().__init__(name="imds-watcher", daemon=True)
        self.client = client
        self.interval = interval_seconds
        self.notice: str | None = None
        self.polls = 0
        self._stop_event = threading.Event()
        self._reported_failure = False

    def poll_once(self) -> str | None:
        self.polls += 1
        try:
            notice = self.client.notice()
        except (OSError, ConnectionError) as exc:
            if not self._reported_failure:
                log.warning("instance metadata service at %s not reachable (%s); still polling",
                            self.client.base_url, exc)
                self._reported_failure = True
            return None
        if notice and self.notice is None:
            self.notice = notice
            log.warning("metadata service announces %s", notice)
        return notice

    def run(self) -> None:
        while not self._stop_event.is_set() and self.notice is None:
            self.poll_once()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
