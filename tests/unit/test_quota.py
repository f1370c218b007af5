"""The produce quota's throttle arithmetic, with the clock passed in."""

from __future__ import annotations

import pytest

from fabric.auth.quota import THROTTLE_MS_MAX, Quota, Throttle, decode_quotas, encode_quotas
from fabric.errors import InvalidRequestError
from fabric.transport import DEFAULT_REQUEST_TIMEOUT_MS


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


def test_a_huge_batch_is_held_well_inside_the_request_timeout_and_its_debt_carries_over() -> None:
    """A 5 MB batch at 100,000 B/s was held 30 s, the very request timeout a client
    following docs/PROTOCOL.md section 8 uses (30,000 ms): it timed out as the answer came
    and resent the batch. The hold is capped well inside that timeout, and what the cap
    does not hold is not forgiven: the principal's next answers wait for it."""
    rate, batch_bytes = 100_000, 5_000_000
    t = Throttle({"alice": Quota(rate)}, burst_s=1.0)
    first_ms = t.record("alice", batch_bytes, 0.0)
    assert 0 < first_ms <= DEFAULT_REQUEST_TIMEOUT_MS // 3
    # A client that waits for each answer, then sends one small batch: held (capped) again
    # and again until the 50 s the big batch is worth at the quota have passed.
    now_s, holds = first_ms / 1000, 0
    while (delay_ms := t.record("alice", 100, now_s)) > 0:
        assert delay_ms <= THROTTLE_MS_MAX
        now_s += delay_ms / 1000
        holds += 1
    assert holds >= 3
    assert now_s >= batch_bytes / rate - 1.0  # the debt was paid at the quota's rate, less the burst
