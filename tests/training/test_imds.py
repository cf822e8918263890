"""The spot watcher against a fake metadata service on 127.0.0.1 (never the real address)."""

import time

from tests.training.conftest import FakeImds, free_port
from training import imds


def test_token_first_then_notices():
    with FakeImds(announce_after=0.0) as fake:
        client = imds.ImdsClient(fake.url)
        notice = client.notice()
    assert notice.startswith("spot interruption: ") and '"terminate"' in notice
    assert fake.requests[0] == ("PUT", "/latest/api/token", True)
    assert all(has_token for method, _, has_token in fake.requests[1:])


def test_rebalance_recommendation_counts_and_quiet_means_none():
    with FakeImds(rebalance=True) as fake:
        assert imds.ImdsClient(fake.url).notice().startswith("rebalance recommendation: ")
    with FakeImds() as fake:
        assert imds.ImdsClient(fake.url).notice() is None


def test_watcher_sees_a_notice_that_appears_later():
    with FakeImds(announce_after=0.3) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url), interval_seconds=0.05)
        watcher.start()
        deadline = time.monotonic() + 5
        while watcher.notice is None and time.monotonic() < deadline:
            time.sleep(0.05)
        watcher.stop()
    assert watcher.notice and watcher.polls >= 2


def test_unreachable_service_is_not_an_error():
    watcher = imds.InterruptionWatcher(imds.ImdsClient(f"http://127.0.0.1:{free_port()}", timeout=0.5))
    assert watcher.poll_once() is None and watcher.notice is None


def test_auto_watch_only_on_ec2_or_with_an_endpoint():
    assert not imds.watch_enabled("auto", env={}, on_ec2=False)
    assert imds.watch_enabled("auto", env={}, on_ec2=True)
    assert imds.watch_enabled("auto", env={"XEON_IMDS_ENDPOINT": "http://127.0.0.1:1"}, on_ec2=False)
    assert not imds.watch_enabled("off", env={"XEON_IMDS_ENDPOINT": "x"}, on_ec2=True)
    assert imds.endpoint({}) == "http://169.254.169.254"
    assert imds.endpoint({"XEON_IMDS_ENDPOINT": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9"
