"""The spot watcher against a fake metadata service on 127.0.0.1 (never the real address)."""

import logging
import time

import pytest

from tests.training.conftest import FakeImds, free_port, iso_in
from training import imds


def wait_until(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_token_first_then_notices():
    with FakeImds(announce_after=0.0) as fake:
        client = imds.ImdsClient(fake.url)
        body = client.instance_action()
        assert client.rebalance() is None
    assert '"terminate"' in body
    assert fake.requests[0] == ("PUT", "/latest/api/token", True)
    assert all(has_token for method, _, has_token in fake.requests[1:])


def test_a_rebalance_recommendation_is_advice_not_an_interruption():
    with FakeImds(rebalance=True) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url))
        watcher.poll_once()
        watcher.poll_once()
    assert watcher.notice is None
    assert watcher.rebalance and "noticeTime" in watcher.rebalance
    with FakeImds() as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url))
        watcher.poll_once()
    assert watcher.notice is None and watcher.rebalance is None


def test_a_notice_left_from_before_the_start_and_dated_in_the_past_is_reported_not_acted_on(caplog):
    caplog.set_level(logging.WARNING, logger="training.imds")
    with FakeImds(announce_after=0.0, notice_time=FakeImds.PAST) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url))
        for _ in range(3):
            watcher.poll_once()
    assert watcher.notice is None
    assert watcher.stale_notice and FakeImds.PAST in watcher.stale_notice
    reports = [r.getMessage() for r in caplog.records if "not acting on it" in r.getMessage()]
    assert len(reports) == 1 and FakeImds.PAST in reports[0], caplog.text


def test_a_notice_there_at_the_start_but_dated_in_the_future_is_acted_on():
    future = iso_in(120)
    with FakeImds(announce_after=0.0, notice_time=future) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url))
        watcher.poll_once()
    assert watcher.notice and future in watcher.notice


def test_a_notice_that_appears_later_is_acted_on_whatever_its_time():
    with FakeImds(announce_after=0.3, notice_time=FakeImds.PAST) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url), interval_seconds=0.05)
        watcher.start()
        wait_until(lambda: watcher.notice is not None)
        watcher.stop()
    assert watcher.notice and watcher.polls >= 2 and watcher.stale_notice is None


@pytest.mark.parametrize("broken", ["bad-status", "cut-short", "closed", "not-json", "server-error"])
def test_malformed_replies_never_stop_the_watcher(broken, caplog):
    caplog.set_level(logging.WARNING, logger="training.imds")
    future = iso_in(120)
    with FakeImds(announce_after=0.0, notice_time=future, broken=broken, broken_replies=4) as fake:
        watcher = imds.InterruptionWatcher(imds.ImdsClient(fake.url, timeout=1.0), interval_seconds=0.05)
        watcher.start()
        seen = wait_until(lambda: watcher.notice is not None)
        alive = watcher.is_alive() or seen
        watcher.stop()
    assert alive and seen, f"watcher stopped polling after a {broken} reply: {caplog.text}"
    assert future in watcher.notice
    if broken != "not-json":  # errors are logged once, not once per poll
        errors = [r for r in caplog.records if "still polling" in r.getMessage()]
        assert len(errors) == 1, caplog.text


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
