"""Spot interruption and rebalance notices from the EC2 instance metadata service (IMDSv2).

A daemon thread per rank asks for a session token (PUT), then polls the two notices every few
seconds. The training loop reads them between steps; the ranks agree through an all-reduce
(training/callbacks.py), so it does not matter which rank saw one first.

- An interruption notice (`spot/instance-action`, `{"action": ..., "time": ...}`) is acted on
  (checkpoint and stop) when it appears after the job started, or names a time still to come. One
  that is already there at the first answer and dated in the past is left over from before (the
  metadata service keeps it): it is reported once, not acted on, so `--resume` on the same nodes
  does not stop again after one step.
- A rebalance recommendation is advice (the instance is at higher risk): `rebalance` is set and the
  job checkpoints once and trains on.
- Any error (no answer, a reply that is not HTTP, a connection closed mid-reply, an unexpected
  status) is logged once and polling goes on.

XEON_IMDS_ENDPOINT points the client elsewhere (the tests' fake server on 127.0.0.1).

`--spot_watch auto` watches on EC2, with XEON_IMDS_ENDPOINT set, or where the metadata address is
held by this machine's own interface: a local cluster's node (`fab local-up`), whose metadata
service runs inside the node's network namespace. That test binds a socket to the address and
sends nothing, so no other machine ever calls 169.254.169.254.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime

log = logging.getLogger(__name__)

METADATA_ADDRESS = "169.254.169.254"
DEFAULT_ENDPOINT = f"http://{METADATA_ADDRESS}"
ENDPOINT_VARIABLE = "XEON_IMDS_ENDPOINT"
TOKEN_PATH = "/latest/api/token"
TOKEN_TTL_SECONDS = 21600
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


def endpoint(env=None) -> str:
    env = os.environ if env is None else env
    return (env.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT).rstrip("/")


def address_is_local(address: str = METADATA_ADDRESS) -> bool:
    """True when `address` belongs to an interface of this network namespace (binding succeeds).

    Nothing is sent: on EC2 and on an ordinary machine the metadata address is not local and
    the bind fails; on a local cluster's node it sits on the node's `lo`.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


def watch_enabled(mode: str, env=None, on_ec2: bool = False, local_service=address_is_local) -> bool:
    """auto: on EC2, with an explicit endpoint, or on a local node that holds the metadata address,
    so no other machine ever calls 169.254.169.254."""
    env = os.environ if env is None else env
    if mode in ("on", "off"):
        return mode == "on"
    return bool(env.get(ENDPOINT_VARIABLE)) or on_ec2 or local_service()


def notice_time(body: str) -> float | None:
    """The `time` of an instance-action notice as a Unix time, or None when it has none or is not JSON."""
    try:
        value = json.loads(body).get("time")
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except (ValueError, TypeError, AttributeError):
        return None


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

    def _get(self, path: str) -> str | None:
        """The body of `path` (200), None when there is nothing (404); ConnectionError otherwise."""
        if self._token is None:
            self._token = self.token()
        status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        if status == 401:  # token expired: fetch a new one once
            self._token = self.token()
            status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._token})
        if status == 404:
            return None
        if status != 200:
            raise ConnectionError(f"GET {path} returned HTTP {status}")
        return body.strip()

    def instance_action(self) -> str | None:
        """The spot interruption notice (JSON text), or None."""
        return self._get(INSTANCE_ACTION_PATH)

    def rebalance(self) -> str | None:
        """The rebalance recommendation (JSON text), or None."""
        return self._get(REBALANCE_PATH)


class InterruptionWatcher(threading.Thread):
    """Polls the metadata service until an interruption notice is to be acted on, or stop().

    `notice`: the interruption to act on; `rebalance`: a rebalance recommendation (advice);
    `stale_notice`: an interruption notice left from before the start, reported only.
    """

    def __init__(self, client: ImdsClient, interval_seconds: float = 5.0, clock=time.time):
        super().__init__(name="imds-watcher", daemon=True)
        self.client = client
        self.interval = interval_seconds
        self.clock = clock
        self.notice: str | None = None
        self.rebalance: str | None = None
        self.stale_notice: str | None = None
        self.polls = 0
        self._answered = False  # has the service answered once (what was there at the start is known)
        self._stop_event = threading.Event()
        self._reported_failure = False

    def poll_once(self) -> str | None:
        """One poll; returns the interruption notice to act on, if any. Never raises."""
        self.polls += 1
        try:
            action = self.client.instance_action()
            rebalance = self.client.rebalance()
        except Exception as exc:  # noqa: BLE001 - a broken reply must never stop the watcher
            if not self._reported_failure:
                log.warning("instance metadata service at %s: %s: %s; still polling (reported once)",
                            self.client.base_url, type(exc).__name__, exc)
                self._reported_failure = True
            return self.notice
        at_start, self._answered = not self._answered, True
        if action is not None and self.notice is None and action != self.stale_notice:
            self._interruption(action, at_start)
        if rebalance is not None and self.rebalance is None:
            self.rebalance = rebalance
            log.warning("metadata service recommends rebalancing (%s): the job checkpoints once and trains on",
                        rebalance)
        return self.notice

    def _interruption(self, body: str, at_start: bool) -> None:
        when = notice_time(body)
        if at_start and (when is None or when <= self.clock()):
            self.stale_notice = body
            log.warning("metadata service shows a spot interruption notice from before this job started (%s), "
                        "dated in the past: not acting on it; a new notice or one for a time to come stops "
                        "the job", body)
            return
        self.notice = body
        log.warning("metadata service announces spot interruption: %s", body)

    def run(self) -> None:
        while not self._stop_event.is_set() and self.notice is None:
            self.poll_once()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
