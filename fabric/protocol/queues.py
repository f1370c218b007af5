"""Queue-mode wire schemas (API keys 40-44) and the bounds every layer quotes.

Pure: schemas declared as data, encoded and decoded by :mod:`fabric.protocol.schema`.
The lease/delivery rules are in ``nodes/queue_state.py``, the node side in
``nodes/queue_coordinator.py``; the walk-through is ``docs/QUEUES.md``.

ACK, NACK and EXTEND are one batched API (``QUEUE_SETTLE``): each entry names the offset
and what to do with it, so a worker settles a whole receive in one round trip. Creating,
listing and deleting queues are topic operations (a queue is a topic whose config says
``queue=true``); redrive is a client-side move (receive from the dead-letter queue, send
to the origin, ack), so they need no API of their own. Deleting a queue's group is an
API (``QUEUE_DELETE_GROUP``): a group's state lives on each partition's leader and in
``__queue_state``, where the deletion is a record (state ``deleted``) a new leader replays.
Purging (``QUEUE_PURGE``, as SQS's PurgeQueue) settles every message below the log's end
for one group or all, one record (state ``purged``) per group a new leader replays.
"""

from __future__ import annotations

import re
import struct
from typing import Any, Final

from fabric.errors import (
    CorruptMessageError,
    InvalidDelayError,
    InvalidPriorityError,
    InvalidRequestError,
)
from fabric.protocol import schema as s
from fabric.protocol.schema import Array, Schema, Struct

API_QUEUE_RECEIVE: Final[int] = 40
API_QUEUE_SETTLE: Final[int] = 41
API_QUEUE_DESCRIBE: Final[int] = 42
API_QUEUE_DELETE_GROUP: Final[int] = 43
API_QUEUE_PURGE: Final[int] = 44

# Defaults and bounds, SQS's numbers where SQS has one; named so errors can quote them.
VISIBILITY_TIMEOUT_MS_DEFAULT: Final[int] = 30_000
VISIBILITY_TIMEOUT_MS_MAX: Final[int] = 12 * 3_600_000
RECEIVE_WAIT_MS_MAX: Final[int] = 20_000
RECEIVE_MESSAGES_MAX: Final[int] = 1_000  # SQS: 10; a batch worker wants more
RECEIVE_BYTES_MAX: Final[int] = 16 * 1024 * 1024  # value bytes per receive answer (at least one message)
SETTLE_ENTRIES_MAX: Final[int] = 10_000
MAX_DELIVERIES_DEFAULT: Final[int] = 5  # Kafka share groups' group.share.delivery.count.limit
MAX_DELIVERIES_MAX: Final[int] = 1_000
DELAY_MS_MAX: Final[int] = 7 * 24 * 3_600_000  # SQS stops at 15 minutes; the issue asks 7 days
PRIORITY_MIN: Final[int] = 0
PRIORITY_MAX: Final[int] = 9
PRIORITY_DEFAULT: Final[int] = 4  # the middle, as RabbitMQ's clients tend to use
DEDUP_WINDOW_MS_DEFAULT: Final[int] = 300_000  # SQS FIFO's 5 minutes
DEDUP_WINDOW_MS_MAX: Final[int] = DELAY_MS_MAX
DEDUP_IDS_MAX: Final[int] = 1_000_000  # bound on remembered ids per partition; oldest forgotten first
DEDUP_ID_BYTES_MAX: Final[int] = 128  # as SQS's MessageDeduplicationId
QUEUE_MESSAGE_BYTES_DEFAULT: Final[int] = 1024 * 1024  # a queue's message_bytes_max (SQS: 256 KiB)
# A dead letter's fabric.dlq.reason is cut to this (at a character boundary): the SDK sends
# at most 1,000 characters (4,000 bytes), a hand-written client up to 65,535 bytes.
DEAD_LETTER_REASON_BYTES_MAX: Final[int] = 4096
# What a dead letter adds to its message: the fabric.dlq.* headers, at most 4,455 bytes (five
# names and their framing, the queue's name up to 200 bytes, three decimals, the reason up to
# DEAD_LETTER_REASON_BYTES_MAX); usually ~120. A dead-letter topic Admin.create_queue makes
# takes the queue's message_bytes_max plus this (64 MiB at most), so a message the queue
# took fits it as a dead letter.
DEAD_LETTER_ROOM_BYTES: Final[int] = 8192
DEFAULT_GROUP: Final[str] = "default"  # the group a QueueConsumer joins unless told otherwise
# Groups per queue partition: each holds a share state of every unfinished message of the
# partition (~300 bytes each), so groups made by name without limit took the node's memory
# (200 one-message consumers of a 20,000-message queue, each its own group: 1.2 GB).
QUEUE_GROUPS_MAX: Final[int] = 32  # Kafka: group.share.max.groups, 10
# A group with no receive, no settle and no live lease for this long is deleted by the
# partition's leader (topic config ``queue_group_retention_ms``), as Kafka expires a
# group's offsets after offsets.retention.minutes (7 days): an abandoned group otherwise
# kept its room among QUEUE_GROUPS_MAX and held back the queue's deletion for ever.
QUEUE_GROUP_RETENTION_MS_DEFAULT: Final[int] = 7 * 24 * 3_600_000
QUEUE_GROUP_RETENTION_MS_MIN: Final[int] = 1_000  # less would expire groups between two receives
QUEUE_GROUP_RETENTION_MS_MAX: Final[int] = 365 * 24 * 3_600_000

# QUEUE_SETTLE actions.
NAME_BYTES_MAX: Final[int] = 255  # group and consumer ids (UTF-8), as the node checks them
ACTION_ACK: Final[int] = 0
ACTION_NACK: Final[int] = 1
ACTION_EXTEND: Final[int] = 2  # arg_ms: the new visibility from now
# Give back a message the consumer received but never handed to its application (what
# QueueConsumer.close() does with its buffer): visible again at once, the delivery not
# counted. A nack would count it, and dead-letter at max_deliveries a message nobody handled.
ACTION_RELEASE: Final[int] = 3
ACTIONS: Final[frozenset[int]] = frozenset({ACTION_ACK, ACTION_NACK, ACTION_EXTEND, ACTION_RELEASE})

# Record headers a producer sets (docs/QUEUES.md); values are UTF-8 decimal or text.
HEADER_DELAY_MS: Final[str] = "fabric.delay_ms"
HEADER_DELIVER_AT_MS: Final[str] = "fabric.deliver_at_ms"
HEADER_PRIORITY: Final[str] = "fabric.priority"
HEADER_TTL_MS: Final[str] = "fabric.ttl_ms"
HEADER_DEDUP_ID: Final[str] = "fabric.dedup_id"
SEND_DELAY_MS_MAX: Final[int] = DELAY_MS_MAX

# Headers on a dead letter, naming its origin.
HEADER_DLQ_QUEUE: Final[str] = "fabric.dlq.queue"
HEADER_DLQ_PARTITION: Final[str] = "fabric.dlq.partition"
HEADER_DLQ_OFFSET: Final[str] = "fabric.dlq.offset"
HEADER_DLQ_COUNT: Final[str] = "fabric.dlq.delivery_count"
HEADER_DLQ_REASON: Final[str] = "fabric.dlq.reason"
DLQ_HEADERS: Final[frozenset[str]] = frozenset(
    {HEADER_DLQ_QUEUE, HEADER_DLQ_PARTITION, HEADER_DLQ_OFFSET, HEADER_DLQ_COUNT, HEADER_DLQ_REASON})
# On each ``__queue_state`` record: the queue's incarnation (its topic's ``created_ms``,
# decimal). A queue deleted and created again under the same name must not inherit the
# old one's acks and leases (its new messages were taken as already acknowledged).
HEADER_STATE_INCARNATION: Final[str] = "fabric.incarnation"
# On each ``__queue_state`` record: the leader epoch of the queue partition at which its
# leader wrote it (decimal). A loader skips a record of an epoch below one it has already
# read: a deposed leader's write that landed after its successor's (a leader paused past its
# ZooKeeper session, a write of its retried after the failover) restated decisions the
# successor had overtaken, and an acknowledged message came back as leased.
HEADER_STATE_EPOCH: Final[str] = "fabric.epoch"

RECEIVE_REQUEST_V0: Schema = (
    ("queue", "str"),
    ("group", "str"),
    ("consumer_id", "str"),
    ("partition", "i32"),  # -1: every partition of the queue this node leads
    ("max_messages", "i32"),  # 1..RECEIVE_MESSAGES_MAX
    ("wait_ms", "i32"),  # 0..RECEIVE_WAIT_MS_MAX: long poll
    ("visibility_timeout_ms", "i32"),  # 0: the queue's
)
RECEIVED_MESSAGE: Schema = (
    ("partition", "i32"),
    ("offset", "i64"),
    ("delivery_count", "i32"),
    ("deadline_ms", "i64"),  # wall clock: the lease ends here unless extended
    ("timestamp_ms", "i64"),
    ("priority", "i8"),
    ("key", "bytes"),
    ("value", "bytes"),
    ("headers", Array(Struct((("key", "str"), ("value", "bytes"))))),
)
RECEIVE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("messages", Array(Struct(RECEIVED_MESSAGE))),
)
# Version 1 (same request): also the leader's wall clock when the answer left, which each
# lease's clock starts from, so a worker reads ``deadline_ms`` against the leader's own
# clock, not its own (a worker a minute ahead took every 30 s lease as over on arrival).
RECEIVE_RESPONSE_V1: Schema = (*RECEIVE_RESPONSE_V0, ("now_ms", "i64"))

SETTLE_ENTRY: Schema = (
    ("partition", "i32"),
    ("offset", "i64"),
    ("action", "i8"),  # ACTION_ACK / ACTION_NACK / ACTION_EXTEND / ACTION_RELEASE
    ("arg_ms", "i32"),  # nack: delay; extend: new visibility; ack: 0
    ("reason", "str"),  # nack: why (kept as the dead letter's last reason)
)
SETTLE_REQUEST_V0: Schema = (
    ("queue", "str"),
    ("group", "str"),
    ("consumer_id", "str"),
    ("entries", Array(Struct(SETTLE_ENTRY))),
)
SETTLE_RESULT: Schema = (("partition", "i32"), ("offset", "i64"), ("error", "i16"), ("deadline_ms", "i64"))
SETTLE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("results", Array(Struct(SETTLE_RESULT))),
)

DESCRIBE_REQUEST_V0: Schema = (("queue", "str"), ("group", "str"))  # group "": every group
QUEUE_COUNTS: Schema = (
    ("partition", "i32"),
    ("group", "str"),
    ("visible", "i64"),
    ("in_flight", "i64"),
    ("delayed", "i64"),
    ("dead_lettered", "i64"),
    ("dropped", "i64"),  # expired (TTL) or poison with no dead-letter queue
    ("deduplicated", "i64"),
    ("oldest_age_ms", "i64"),  # -1: nothing waiting
)
DESCRIBE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("partitions", Array(Struct(QUEUE_COUNTS))),  # the partitions this node leads
)

DELETE_GROUP_REQUEST_V0: Schema = (("queue", "str"), ("group", "str"))
DELETE_GROUP_RESULT: Schema = (("partition", "i32"), ("error", "i16"))
DELETE_GROUP_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    # The partitions this node leads: 0 deleted, GROUP_ID_NOT_FOUND (67) the group has no
    # state there, GROUP_NOT_EMPTY (62) it holds live leases or a waiting receive there.
    ("partitions", Array(Struct(DELETE_GROUP_RESULT))),
)

PURGE_REQUEST_V0: Schema = (("queue", "str"), ("group", "str"))  # group "": every group, and those to come
PURGE_RESULT: Schema = (
    ("partition", "i32"),
    ("group", "str"),  # "": the partition's floor for groups that start later (purged: 0)
    ("end_offset", "i64"),  # everything below it is settled for the group
    ("purged", "i64"),  # messages it settled that were queued (visible, in flight, delayed)
)
PURGE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("partitions", Array(Struct(PURGE_RESULT))),  # the partitions this node leads
)

SCHEMAS: dict[tuple[int, int], tuple[Schema, Schema]] = {
    (API_QUEUE_RECEIVE, 0): (RECEIVE_REQUEST_V0, RECEIVE_RESPONSE_V0),
    (API_QUEUE_RECEIVE, 1): (RECEIVE_REQUEST_V0, RECEIVE_RESPONSE_V1),
    (API_QUEUE_SETTLE, 0): (SETTLE_REQUEST_V0, SETTLE_RESPONSE_V0),
    (API_QUEUE_DESCRIBE, 0): (DESCRIBE_REQUEST_V0, DESCRIBE_RESPONSE_V0),
    (API_QUEUE_DELETE_GROUP, 0): (DELETE_GROUP_REQUEST_V0, DELETE_GROUP_RESPONSE_V0),
    (API_QUEUE_PURGE, 0): (PURGE_REQUEST_V0, PURGE_RESPONSE_V0),
}


# ----- record headers -----
_DECIMAL_HEADER = re.compile(rb"-?[0-9]{1,19}")


def _int_header(name: str, raw: bytes | None) -> int:
    # Plain ASCII decimal only (int() would also take " 5", "1_0" and other scripts' digits).
    if raw is None or _DECIMAL_HEADER.fullmatch(raw) is None:
        raise InvalidRequestError(f"header {name} must be a decimal integer, got {raw!r:.60}")
    return int(raw)


def check_sent_headers(headers: list[tuple[str, bytes | None]], now_ms: int) -> None:
    """A queue record's headers as its partition leader receives them (PRODUCE to a queue):
    the rules ``send_headers`` applies before an SDK sends, so a client that skipped them
    is refused (INVALID_DELAY, INVALID_PRIORITY, INVALID_REQUEST) rather than having its
    priority turned into 4 or its options, dedup id included, dropped at delivery."""
    for name, raw in headers:
        # The bytes as sent, and UTF-8 as documented: read_headers replaces bytes that are
        # not UTF-8 (by U+FFFD, three bytes each), so an id of 10 such bytes was taken (two
        # different ones could then read as the same id) and one of 43 was refused as
        # over 128 bytes. The SDK sends a str's UTF-8, which this never refuses.
        if name == HEADER_DEDUP_ID and raw is not None:
            if len(raw) > DEDUP_ID_BYTES_MAX:
                raise InvalidRequestError(f"dedup_id is longer than DEDUP_ID_BYTES_MAX ({DEDUP_ID_BYTES_MAX} bytes)")
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequestError(f"header {name} must be UTF-8, got {raw!r:.60}") from None
    fields = read_headers(headers)
    send_headers(delay_ms=fields["delay_ms"], deliver_at_ms=fields["deliver_at_ms"], priority=fields["priority"],
                 ttl_ms=fields["ttl_ms"], dedup_id=fields["dedup_id"], now_ms=now_ms)


def send_headers(
    *, delay_ms: int = 0, deliver_at_ms: int = 0, priority: int | None = None, ttl_ms: int = 0, dedup_id: str = "",
    now_ms: int,
) -> list[tuple[str, bytes | None]]:
    """The record headers a producer writes for a queue message (only those set); bad values
    raise before anything is sent (bounds as docs/QUEUES.md states them). ``now_ms``: the
    wall clock of whoever checks (the SDK before sending, the leader on receipt), which
    ``deliver_at_ms`` may be at most ``SEND_DELAY_MS_MAX`` ahead of: a time given in the
    wrong unit (microseconds) would otherwise hold its message, and every batch after it
    from deletion, for ever."""
    for name, value in (("delay_ms", delay_ms), ("deliver_at_ms", deliver_at_ms), ("ttl_ms", ttl_ms),
                        ("priority", 0 if priority is None else priority)):
        if value.__class__ is not int:  # bool, float, str: refused by name, not by a comparison
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not isinstance(dedup_id, str):
        raise TypeError(f"dedup_id must be a str, not {type(dedup_id).__name__}")
    if not 0 <= delay_ms <= SEND_DELAY_MS_MAX or not 0 <= deliver_at_ms <= now_ms + SEND_DELAY_MS_MAX \
            or (delay_ms and deliver_at_ms):
        raise InvalidDelayError(
            f"delay_ms must be 0..{SEND_DELAY_MS_MAX} (7 days) and deliver_at_ms 0..now + 7 days ({now_ms} + "
            f"{SEND_DELAY_MS_MAX} here), not both set; got delay_ms={delay_ms} deliver_at_ms={deliver_at_ms}")
    if priority is not None and not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise InvalidPriorityError(f"priority {priority} outside 0..9")
    if ttl_ms < 0:
        raise InvalidRequestError(f"ttl_ms must be >= 0 (0: none), got {ttl_ms}")
    if len(dedup_id.encode()) > DEDUP_ID_BYTES_MAX:
        raise InvalidRequestError(f"dedup_id is longer than DEDUP_ID_BYTES_MAX ({DEDUP_ID_BYTES_MAX} bytes)")
    out: list[tuple[str, bytes | None]] = []
    for name, value in ((HEADER_DELAY_MS, delay_ms), (HEADER_DELIVER_AT_MS, deliver_at_ms), (HEADER_TTL_MS, ttl_ms)):
        if value:
            out.append((name, str(value).encode()))
    if priority is not None:
        out.append((HEADER_PRIORITY, str(priority).encode()))
    if dedup_id:
        out.append((HEADER_DEDUP_ID, dedup_id.encode()))
    return out


def read_headers(headers: list[tuple[str, bytes | None]]) -> dict[str, Any]:
    """The queue fields of one record's headers: delay_ms, deliver_at_ms, priority (None when
    absent), ttl_ms, dedup_id. Range checks are the state machine's (it names the bounds)."""
    out: dict[str, Any] = {"delay_ms": 0, "deliver_at_ms": 0, "priority": None, "ttl_ms": 0, "dedup_id": ""}
    fields = {HEADER_DELAY_MS: "delay_ms", HEADER_DELIVER_AT_MS: "deliver_at_ms",
              HEADER_PRIORITY: "priority", HEADER_TTL_MS: "ttl_ms"}
    for name, raw in headers:
        if name in fields:
            out[fields[name]] = _int_header(name, raw)
        elif name == HEADER_DEDUP_ID:
            out["dedup_id"] = (raw or b"").decode("utf-8", "replace")
    return out


def dead_letter_headers(queue: str, partition: int, offset: int, delivery_count: int, reason: str) -> list[tuple[str, bytes | None]]:
    """Headers added to a message moved to the dead-letter topic, naming its origin."""
    return [
        (HEADER_DLQ_QUEUE, queue.encode()),
        (HEADER_DLQ_PARTITION, str(partition).encode()),
        (HEADER_DLQ_OFFSET, str(offset).encode()),
        (HEADER_DLQ_COUNT, str(delivery_count).encode()),
        (HEADER_DLQ_REASON, reason.encode()),
    ]


# ----- the replicated share-state log -----
# Records in ``STATE_TOPIC``: key ``state_key(queue, partition, group)``, value
# ``STATE_RECORD_V0``: one decision for the run of offsets ``offset..last_offset`` (a receive
# or an ack of consecutive messages is one record, as KIP-932's state batches). A new
# leader replays the queue partition, then these records in order; the newest record per
# offset wins.
STATE_TOPIC: Final[str] = "__queue_state"
STATE_RECORD_VERSION: Final[int] = 0
STATE_RANGE_MAX: Final[int] = 100_000  # offsets one record may cover; more is a corrupt record
# Two codes name the whole group, not a message (their offsets say nothing): ``deleted``
# (a tombstone: the group's earlier records no longer count) and ``used`` (the group was
# used then, by the record's timestamp: the idle clock of queue_group_retention_ms).
STATE_DELETED: Final[str] = "deleted"
STATE_USED: Final[str] = "used"
# A third, ``purged``: every message of the group below ``offset`` is settled (QUEUE_PURGE);
# of the group-less name "", the floor a group starting later begins at.
STATE_PURGED: Final[str] = "purged"
GROUP_MARKERS: Final[frozenset[str]] = frozenset({STATE_DELETED, STATE_USED, STATE_PURGED})
STATE_CODES: Final[dict[str, int]] = {"available": 0, "delayed": 1, "leased": 2, "acked": 3, "dead": 4, "dropped": 5,
                                      STATE_DELETED: 6, STATE_USED: 7, STATE_PURGED: 8}
_STATE_NAMES: Final[dict[int, str]] = {v: k for k, v in STATE_CODES.items()}
STATE_RECORD_V0: Schema = (
    ("version", "u8"),
    ("offset", "i64"),
    ("last_offset", "i64"),
    ("state", "i8"),
    ("delivery_count", "i32"),
    ("visible_at_ms", "i64"),
    ("reason", "str"),
)
_STATE_FIXED = struct.Struct("<BqqbiqH")


def state_key(queue: str, partition: int, group: str) -> bytes:
    return f"{queue}\0{partition}\0{group}".encode()


def encode_state_record(offset: int, state: str, delivery_count: int, visible_at_ms: int, reason: str,
                        last_offset: int = -1) -> bytes:
    """Byte for byte ``schema.encode(STATE_RECORD_V0, ...)``, packed in one call: the node
    writes one per decision."""
    raw = reason.encode()
    if len(raw) > 0xFFFF:  # a str field's bound; cut at a character boundary
        raw = raw[:0xFFFF].decode("utf-8", "ignore").encode()
    return _STATE_FIXED.pack(STATE_RECORD_VERSION, offset, offset if last_offset < 0 else last_offset,
                             STATE_CODES[state], delivery_count, visible_at_ms, len(raw)) + raw


def decode_state_record(raw: bytes) -> dict[str, Any]:
    """The record's fields with ``state`` as its name; refuses unknown versions and states
    and runs that are empty or longer than STATE_RANGE_MAX."""
    values = s.decode(STATE_RECORD_V0, raw)
    if values["version"] != STATE_RECORD_VERSION or values["state"] not in _STATE_NAMES:
        raise CorruptMessageError(f"queue state record version {values['version']} state {values['state']}")
    if not 0 <= values["last_offset"] - values["offset"] < STATE_RANGE_MAX:
        raise CorruptMessageError(f"queue state record covers offsets {values['offset']}..{values['last_offset']}")
    values["state"] = _STATE_NAMES[values.pop("state")]
    del values["version"]
    return values
