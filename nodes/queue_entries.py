"""What one (queue partition, group) share state is made of: the message states, the queue's
settings, and the values ``nodes/queue_state.py`` hands out (leases, changes to persist,
messages that left the queue). Data only; the decisions are the state machine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from fabric import errors
from fabric.protocol.queues import (
    MAX_DELIVERIES_DEFAULT,
    MAX_DELIVERIES_MAX,
    VISIBILITY_TIMEOUT_MS_DEFAULT,
)
from nodes.queue_bounds import check_visibility_ms

AVAILABLE: Final[str] = "available"
DELAYED: Final[str] = "delayed"
LEASED: Final[str] = "leased"
ACKED: Final[str] = "acked"
DEAD: Final[str] = "dead"
DROPPED: Final[str] = "dropped"
_DONE = frozenset({ACKED, DEAD, DROPPED})

REASON_EXPIRED: Final[str] = "visibility timeout"
REASON_TTL: Final[str] = "ttl expired"
REASON_NACK: Final[str] = "nack"


@dataclass(frozen=True)
class QueueConfig:
    visibility_timeout_ms: int = VISIBILITY_TIMEOUT_MS_DEFAULT
    max_deliveries: int = MAX_DELIVERIES_DEFAULT
    dead_letter: str = ""  # topic name; "" drops expired/poison messages (counted)
    message_ttl_ms: int = 0  # 0: no queue-wide TTL
    max_messages: int = 0  # 0: unbounded
    max_bytes: int = 0  # 0: unbounded

    def __post_init__(self) -> None:
        check_visibility_ms(self.visibility_timeout_ms)
        if not 1 <= self.max_deliveries <= MAX_DELIVERIES_MAX:
            raise errors.InvalidQueueConfigError(
                f"max_deliveries {self.max_deliveries} outside 1..MAX_DELIVERIES_MAX ({MAX_DELIVERIES_MAX})"
            )
        for name in ("message_ttl_ms", "max_messages", "max_bytes"):
            if getattr(self, name) < 0:
                raise errors.InvalidQueueConfigError(f"{name} must be >= 0 (0: no limit)")


@dataclass
class Entry:
    offset: int
    size_bytes: int
    priority: int
    visible_at_ms: int
    expires_at_ms: int  # 0: never
    state: str = AVAILABLE
    delivery_count: int = 0
    consumer: str = ""
    deadline_ms: int = 0
    last_reason: str = ""
    # Leased, but the answer carrying it has not left yet (it waits until its lease is
    # durable): its lease clock starts when it does (``answered``), and a lease that ends
    # before is undone, not counted as a delivery.
    unanswered: bool = False


@dataclass(frozen=True)
class Lease:
    offset: int
    delivery_count: int
    deadline_ms: int


@dataclass(frozen=True)
class Change:
    """A state change to persist (replicated, acks=all) before the reply that depends on it.

    The newest change per offset wins on rebuild. Appends are not changes: they are the
    data log itself, which a new leader replays first.
    """

    offset: int
    state: str
    delivery_count: int
    visible_at_ms: int
    reason: str
    # False for a snapshot's restatement (nodes/queue_compaction.py): its dead letters and
    # drops are in the snapshot's counts already, so restoring it must not count them again.
    counted: bool = True
    # Read back from __queue_state: when its record was written, as ``visible_at_ms`` is, on
    # this node's clock as far as known (0 otherwise). ``restore`` bounds the delay by it.
    written_ms: int = 0


@dataclass(frozen=True)
class Finished:
    """A message that left the queue without an ack: dead-lettered or dropped."""

    offset: int
    state: str  # DEAD or DROPPED
    delivery_count: int
    reason: str
