"""The produce quota's throttle arithmetic, with the clock passed in."""

from __future__ import annotations

import pytest

from fabric.auth.quota import THROTTLE_MS_MAX, Quota, Throttle, decode_quotas, encode_quotas
from fabric.errors import InvalidRequestError


def test_no_quota_no_delay() -> None:
    assert Throttle().record("alice", 10**9, 0.0) == 0


def test_within_rate_and_burst_no_delay() -> None:
    t = Throttle({"alice": Quota(1_000_000)}, burst_s=1.0)
    now = 100.0
    for _ in range(100):  # 100 KB every 0.1 s = exactly 1 MB/s
        assert t.record("alice", 100_000, now) == 0
        now += 0.1


def test_greedy_producer_is_held_to_its_rate() -> None:
    rate = 1_000_000
    t = Throttle({"alice": Quota(rate)}, burst_s=1.0)
    now, sent = 0.0, 0
    # A producer that sends 1 MB, waits for the response (the delay), sends again.
    for _ in range(50):
        delay_ms = t.record("alice", 1_000_000, now)
        sent += 1_000_000
        now += delay_ms / 1000
    # 50 MB acknowledged over `now` seconds: no more than rate*(now + burst).
    assert sent <= rate * (now + 1.0) + 1_000_000
    assert now >= 48.0


def test_default_quota_and_own_quota() -> None:
    t = Throttle({"*": Quota(1_000), "ops": Quota(10**9)}, burst_s=0.5)
    assert t.record("bob", 10_000, 0.0) > 0
    assert t.record("ops", 10_000, 0.0) == 0


def test_delay_is_capped() -> None:
    t = Throttle({"alice": Quota(1)}, burst_s=0.0)
    assert t.record("alice", 10**9, 0.0) == THROTTLE_MS_MAX


def test_quota_json_and_validation() -> None:
    quotas = {"alice": Quota(5), "*": Quota(7)}
    assert decode_quotas(encode_quotas(quotas)) == quotas
    with pytest.raises(InvalidRequestError):
        Quota(0)
