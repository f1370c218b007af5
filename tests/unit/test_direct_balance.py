"""Instance selection, the retry budget and heartbeat liveness, with an injected clock."""

from __future__ import annotations

import collections
import random

import pytest

from fabric import errors
from sdk.direct import _balance as balance


def test_least_outstanding_wins() -> None:
    assert balance.pick_instance({"a": 3, "b": 0, "c": 1}) == "b"


def test_ties_are_shared_not_round_robin_order() -> None:
    rng = random.Random(7)
    counts = collections.Counter(balance.pick_instance({"a": 1, "b": 1, "c": 1}, rng=rng) for _ in range(3000))
    assert set(counts) == {"a", "b", "c"} and min(counts.values()) > 800


def test_excluded_instances_are_a_last_resort() -> None:
    assert balance.pick_instance({"a": 0, "b": 5}, exclude=["a"]) == "b"
    assert balance.pick_instance({"a": 0}, exclude=["a"]) == "a"
    assert balance.pick_instance({}) is None


def test_suspects_take_requests_only_when_every_untried_instance_is_one() -> None:
    assert balance.pick_instance({"a": 0, "b": 5}, avoid=["a"]) == "b"  # fewer outstanding, but late
    assert balance.pick_instance({"a": 0, "b": 5}, exclude=["b"], avoid=["a"]) == "a"  # untried beats tried
    assert balance.pick_instance({"a": 0, "b": 5}, exclude=["a", "b"], avoid=["a"]) == "a"  # all tried: least outstanding


def test_a_late_pong_makes_a_suspect_before_a_dead_peer() -> None:
    health = balance.PeerHealth(0.0, interval_ms=200, liveness=4)
    health.heard(0.0)
    assert health.ping_due(0.0) and not health.suspect(0.1)
    health.heard(0.1)  # answered: not suspect however long ago the ping was
    assert health.ping_due(0.2) and not health.suspect(0.4)
    assert health.suspect(0.41) and health.alive  # a PONG late by more than an interval
    assert not health.check(0.9) and health.check(1.01)  # dead only past liveness intervals
    health.heard(1.2)
    assert not health.suspect(1.2) and health.alive


def test_retry_budget_is_a_share_of_requests() -> None:
    budget = balance.RetryBudget(ratio=0.25, min_retries_per_s=0.0, tokens_max=10, now=0.0)
    budget.tokens = 0.0
    for _ in range(60):
        budget.on_request(0.0)
    granted = sum(budget.try_retry(0.0) for _ in range(50))
    assert granted == 10  # 60 requests x 0.25 = 15, capped at tokens_max
    assert budget.retries_refused == 40


def test_retry_budget_refills_with_time_and_is_capped() -> None:
    budget = balance.RetryBudget(ratio=0.0, min_retries_per_s=2.0, tokens_max=3, now=0.0)
    while budget.try_retry(0.0):
        pass
    assert not budget.try_retry(0.2)  # 0.4 tokens: not yet
    assert budget.try_retry(0.5)  # 1.0 token after half a second
    assert sum(budget.try_retry(1000.0) for _ in range(10)) == 3  # a long calm banks at most tokens_max


def test_retry_budget_counts_requests_lazily_with_the_same_outcome() -> None:
    """Deposits are folded in when a retry asks; the grants match adding each as it came."""
    rng = random.Random(11)
    budget = balance.RetryBudget(ratio=0.3, min_retries_per_s=0.5, tokens_max=4, now=0.0)
    tokens, refilled_s = budget.tokens, 0.0  # the eager reference
    now = 0.0
    for _ in range(2000):
        now += rng.random() * 0.05
        if rng.random() < 0.8:
            budget.on_request(now)
            tokens = min(4.0, tokens + (now - refilled_s) * 0.5 + 0.3)
        else:
            tokens = min(4.0, tokens + (now - refilled_s) * 0.5)
            expected = tokens >= 1.0
            tokens -= 1.0 if expected else 0.0
            assert budget.try_retry(now) == expected
        refilled_s = now


def test_retry_budget_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        balance.RetryBudget(ratio=2.0)


def test_peer_is_admitted_on_first_traffic_and_dies_on_silence() -> None:
    health = balance.PeerHealth(now=0.0, interval_ms=125, liveness=3)  # dead 375 ms after an unanswered PING
    assert health.state == balance.CONNECTING and not health.alive
    assert not health.check(10.0)  # never heard: stays connecting, never "dies"
    assert health.heard(10.0) and health.alive
    assert not health.heard(10.0625)  # already alive
    for now in (10.125, 10.25, 10.375):  # PINGs every 125 ms, none answered
        assert health.ping_due(now)
        assert not health.check(now + 0.0625)
    assert not health.check(10.5)  # exactly 375 ms since the first unanswered PING
    assert health.check(10.5625) and health.state == balance.DEAD
    assert not health.check(10.625)  # reported once
    assert health.heard(11.0) and health.alive  # a paused peer that resumes is used again


def test_a_peer_that_never_answers_its_first_pings_dies_too() -> None:
    """Found writing a direct-plane service from PROTOCOL.md 10.3 alone: one that never
    answered a PING stayed "connecting" for ever, so every gather kept asking it."""
    health = balance.PeerHealth(now=0.0, interval_ms=250, liveness=4)  # dead 1 s after an unanswered PING
    assert health.ping_due(0.0)  # the first PING, sent at admission
    for now in (0.25, 0.5, 0.75):
        assert health.ping_due(now)
        assert not health.check(now + 0.125) and health.state == balance.CONNECTING
    assert not health.check(1.0)
    assert health.check(1.0625) and health.state == balance.DEAD
    assert not health.check(1.125)  # reported once
    assert health.heard(1.5) and health.alive  # one that answers late is used after all


def test_our_own_stall_is_not_the_peers_silence() -> None:
    health = balance.PeerHealth(now=0.0, interval_ms=100, liveness=3)
    health.heard(0.0)
    assert health.ping_due(0.1)
    health.heard(0.101)  # answered
    # This process stops for 2 s: no PINGs went out, so nothing was left unanswered.
    assert not health.check(2.1) and health.alive
    assert health.ping_due(2.1)
    assert not health.check(2.35)  # 250 ms since that PING
    health.heard(2.36)
    assert health.alive


def test_pings_follow_the_interval() -> None:
    health = balance.PeerHealth(now=0.0, interval_ms=200)
    assert health.ping_due(0.0)
    assert not health.ping_due(0.1)
    assert health.ping_due(0.2)
    with pytest.raises(ValueError):
        balance.PeerHealth(now=0.0, interval_ms=0)


def test_an_instance_forgets_a_caller_that_stops_heartbeating() -> None:
    callers = balance.CallerLiveness(liveness=4)
    callers.heard(b"a", 0.0, interval_ms=200)  # must be heard again within 800 ms
    callers.heard(b"b", 0.0, interval_ms=1000)  # a slower caller: 4 s
    callers.heard(b"a", 0.7)  # 0: the default interval, 200 ms
    assert callers.expired(1.4) == []
    assert callers.expired(1.6) == [b"a"]  # 900 ms after its last PING
    assert b"a" not in callers and b"b" in callers
    assert callers.expired(1.7) == []  # reported once
    assert callers.expired(4.1) == [b"b"]
    callers.heard(b"a", 5.0)  # a resumed caller is followed again from its next PING
    assert len(callers) == 1


def test_caller_table_is_bounded_and_forgets_the_most_silent_first() -> None:
    callers = balance.CallerLiveness(callers_max=2)
    callers.heard(b"a", 0.0)
    callers.heard(b"b", 0.1)
    callers.heard(b"a", 0.2)  # a is the most recent now
    callers.heard(b"c", 0.3)
    assert b"b" not in callers and b"a" in callers and b"c" in callers
    with pytest.raises(ValueError):
        balance.CallerLiveness(callers_max=0)


def test_idempotent_attempts_share_the_time_and_retry_within_the_budget() -> None:
    budget = balance.RetryBudget(ratio=0.0, min_retries_per_s=0.0, now=0.0)  # exactly 1 token
    attempts = balance.Attempts(timeout_ms=900, idempotent=True, attempts_max=3, budget=budget, now=0.0)
    assert attempts.begin(0.0) == pytest.approx(0.3)  # a third of 900 ms
    assert attempts.may_repeat(0.3, retry_safe=False)  # idempotent: a timeout may go elsewhere
    assert attempts.begin(0.3) == pytest.approx(0.3)  # 600 ms left over 2 attempts
    assert not attempts.may_repeat(0.6, retry_safe=False)  # the budget's one token is spent
    error = attempts.failure("svc", "no reply", 0.6, retry_safe=False)
    assert isinstance(error, errors.RequestTimeout) and "2 attempt(s)" in error.message


def test_a_plain_request_is_sent_once_unless_it_was_refused_unrun() -> None:
    budget = balance.RetryBudget(now=0.0)
    attempts = balance.Attempts(timeout_ms=1_000, idempotent=False, attempts_max=3, budget=budget, now=0.0)
    assert attempts.begin(0.0) == pytest.approx(1.0)  # all the time: there is no second try
    assert not attempts.may_repeat(0.5, retry_safe=False)  # timed out or its instance died: never twice
    timeout = attempts.failure("svc", "instance died", 0.5, retry_safe=False)
    assert isinstance(timeout, errors.RequestTimeout) and "may or may not have run" in timeout.message
    assert attempts.may_repeat(0.5, retry_safe=True)  # refused (overloaded, stopping): nothing ran
    assert attempts.begin(0.5) == pytest.approx(0.5)
    assert attempts.may_repeat(0.6, retry_safe=True) and attempts.begin(0.6) > 0
    assert not attempts.may_repeat(0.7, retry_safe=True)  # attempts_max reached
    assert isinstance(attempts.failure("svc", "overloaded", 0.7, retry_safe=True), errors.NoServiceAvailable)


def test_no_attempt_after_the_deadline() -> None:
    attempts = balance.Attempts(timeout_ms=100, idempotent=True, attempts_max=5,
                                budget=balance.RetryBudget(now=0.0), now=0.0)
    attempts.begin(0.0)
    assert not attempts.may_repeat(0.1, retry_safe=True)



def test_any_frame_from_a_followed_caller_keeps_it_alive() -> None:
    """DIRECT.md: a caller is gone after 800 ms "without any frame from it". One that PINGed
    once and then sent only REQUESTs was declared gone (its queued requests dropped)."""
    callers = balance.CallerLiveness(liveness=4)
    callers.heard(b"a", 0.0, interval_ms=200)  # followed: 800 ms of silence allowed
    for now in (0.3, 0.6, 0.9, 1.2, 1.5):  # a REQUEST every 300 ms, no PING
        callers.touch(b"a")
        assert callers.expired(now) == []
    assert callers.expired(2.2) == []  # heard as of the last sweep (1.5 s) + 800 ms
    assert callers.expired(2.4) == [b"a"]  # silent since: gone
    callers.touch(b"a")  # no longer followed: a frame does not follow it again (a PING does)
    callers.touch(b"never-pinged")  # never followed: untracked, as before
    assert callers.expired(9.0) == [] and len(callers) == 0


def test_a_stall_of_this_process_is_not_the_peers_silence() -> None:
    """A PING sent just before this process stopped running goes unanswered through the
    stall; when the peer stalled too (the same process, or a VM whose time was stolen) its
    PONG is not there when this process runs again, and the first check declared a healthy
    peer dead. The heartbeat loop excuses the time it did not run."""
    health = balance.PeerHealth(0.0)
    health.heard(0.0)
    assert health.ping_due(1.0)  # sent, and then the process stalls for 1.5 s
    health.excuse(1.5)
    assert not health.check(2.5)  # as if 0 s had passed since the PING
    assert health.alive
    assert health.check(1.0 + 1.5 + health.silence_limit_s + 0.01)  # still silent after that: dead
    fresh = balance.PeerHealth(0.0)
    fresh.excuse(5.0)  # no PING out: nothing to excuse
    assert fresh.unanswered_since_s is None
