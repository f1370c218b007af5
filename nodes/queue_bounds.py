"""The bounds a queue request is checked against, and when a delayed message becomes
visible: pure functions of ``nodes/queue_state.py`` (which re-exports them), kept apart so
that the state machine's module stays within its size."""

from __future__ import annotations

from fabric import errors
from fabric.protocol.queues import (
    DELAY_MS_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RECEIVE_WAIT_MS_MAX,
    VISIBILITY_TIMEOUT_MS_MAX,
)


def check_visibility_ms(ms: int) -> None:
    if not 0 < ms <= VISIBILITY_TIMEOUT_MS_MAX:
        raise errors.InvalidVisibilityTimeoutError(
            f"visibility {ms} ms outside 1..VISIBILITY_TIMEOUT_MS_MAX ({VISIBILITY_TIMEOUT_MS_MAX} ms, 12 h)"
        )


def check_priority(priority: int) -> None:
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise errors.InvalidPriorityError(f"priority {priority} outside {PRIORITY_MIN}..{PRIORITY_MAX}")


def check_receive_wait_ms(wait_ms: int) -> None:
    if not 0 <= wait_ms <= RECEIVE_WAIT_MS_MAX:
        raise errors.InvalidReceiveWaitError(
            f"wait_ms {wait_ms} outside 0..RECEIVE_WAIT_MS_MAX ({RECEIVE_WAIT_MS_MAX} ms)"
        )


def deliver_at(now_ms: int, delay_ms: int = 0, deliver_at_ms: int = 0) -> int:
    """When a message sent at ``now_ms`` becomes visible; refuses delays past DELAY_MS_MAX."""
    if delay_ms < 0 or deliver_at_ms < 0:
        raise errors.InvalidDelayError("delay_ms and deliver_at_ms must be >= 0")
    at = max(now_ms + delay_ms, deliver_at_ms)
    if at - now_ms > DELAY_MS_MAX:
        raise errors.InvalidDelayError(
            f"delivery {at - now_ms} ms ahead exceeds DELAY_MS_MAX ({DELAY_MS_MAX} ms, 7 days)"
        )
    return at
