"""Queue-mode wire schemas (API keys 40-46): receive, ack/nack/extend, queue admin.

Pure: schemas declared as data, encoded and decoded by :mod:`fabric.protocol.schema`.
The node does not serve these keys yet, so they are not registered in
:class:`fabric.protocol.apis.ApiKey` (a registered key must have a handler; see
``tests/unit/test_node_shape.py``). The lease/delivery rules are in ``nodes/queue_state.py``;
the walk-through is ``docs/QUEUES.md``.

ACK, NACK and EXTEND are one batched API (``QUEUE_SETTLE``): each entry names the offset
and what to do with it, so a worker settles a whole receive in one round trip.
"""

from __future__ import annotations

from typing import Any, Final

from fabric.errors import CorruptMessageError, InvalidRequestError
from fabric.protocol import schema as s
from fabric.protocol.schema import Array, Schema, Struct

API_QUEUE_RECEIVE: Final[int] = 40
API_QUEUE_SETTLE: Final[int] = 41
API_QUEUE_CREATE: Final[int] = 42
API_QUEUE_DELETE: Final[int] = 43
API_QUEUE_DESCRIBE: Final[int] = 44
API_QUEUE_LIST: Final[int] = 45
API_QUEUE_REDRIVE: Final[int] = 46

# QUEUE_SETTLE actions.
ACTION_ACK: Final[int] = 0
ACTION_NACK: Final[int] = 1
ACTION_EXTEND: Final[int] = 2  # arg_ms: the new visibility from now
ACTIONS: Final[frozenset[int]] = frozenset({ACTION_ACK, ACTION_NACK, ACTION_EXTEND})

# Record headers a producer sets (docs/QUEUES.md); values are UTF-8 decimal or text.
HEADER_DELAY_MS: Final[str] = "fabric.delay_ms"
HEADER_DELIVER_AT_MS: Final[str] = "fabric.deliver_at_ms"
HEADER_PRIORITY: Final[str] = "fabric.priority"
HEADER_TTL_MS: Final[str] = "fabric.ttl_ms"
HEADER_DEDUP_ID: Final[str] = "fabric.dedup_id"
SEND_DELAY_MS_MAX: Final[int] = 7 * 24 * 3_600_000  # the node's DELAY_MS_MAX (nodes/queue_state.py)
DEDUP_ID_BYTES_MAX: Final[int] = 128  # as SQS's MessageDeduplicationId

# Headers on a dead letter, naming its origin.
HEADER_DLQ_QUEUE: Final[str] = "fabric.dlq.queue"
HEADER_DLQ_PARTITION: Final[str] = "fabric.dlq.partition"
HEADER_DLQ_OFFSET: Final[str] = "fabric.dlq.offset"
HEADER_DLQ_COUNT: Final[str] = "fabric.dlq.delivery_count"
HEADER_DLQ_REASON: Final[str] = "fabric.dlq.reason"

RECEIVE_REQUEST_V0: Schema = (
    ("queue", "str"),
    ("group", "str"),
    ("consumer_id", "str"),
    ("partition", "i32"),  # -1: any partition this node leads
    ("max_messages", "i32"),
    ("wait_ms", "i32"),  # 0..RECEIVE_WAIT_MS_MAX
    ("visibility_timeout_ms", "i32"),  # 0: the queue's
)
RECEIVED_MESSAGE: Schema = (
    ("partition", "i32"),
    ("offset", "i64"),
    ("delivery_count", "i32"),
    ("deadline_ms", "i64"),
    ("timestamp_ms", "i64"),
    ("priority", "i8"),
    ("key", "bytes"),
    ("value", "bytes"),
    ("headers", Array(Struct((("key", "str"), ("value", "bytes"))))),
)
RECEIVE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "str"),
    ("messages", Array(Struct(RECEIVED_MESSAGE))),
)

SETTLE_ENTRY: Schema = (
    ("partition", "i32"),
    ("offset", "i64"),
    ("action", "i8"),  # ACTION_ACK / ACTION_NACK / ACTION_EXTEND
    ("arg_ms", "i32"),  # nack: delay; extend: new visibility; ack: 0
    ("reason", "str"),  # nack: why (kept as the dead letter's last reason)
)
SETTLE_REQUEST_V0: Schema = (
    ("queue", "str"),
    ("group", "str"),
    ("consumer_id", "str"),
    ("entries", Array(Struct(SETTLE_ENTRY))),
)
SETTLE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "str"),
    ("results", Array(Struct((("partition", "i32"), ("offset", "i64"), ("error", "i16"), ("deadline_ms", "i64"))))),
)

QUEUE_CONFIG: Schema = (("key", "str"), ("value", "str"))
CREATE_REQUEST_V0: Schema = (("queue", "str"), ("partitions", "i32"), ("configs", Array(Struct(QUEUE_CONFIG))))
RESULT_RESPONSE_V0: Schema = (("error", "i16"), ("message", "str"))
DELETE_REQUEST_V0: Schema = (("queue", "str"),)
DESCRIBE_REQUEST_V0: Schema = (("queue", "str"), ("group", "str"))
QUEUE_COUNTS: Schema = (
    ("partition", "i32"),
    ("visible", "i64"),
    ("in_flight", "i64"),
    ("delayed", "i64"),
    ("dead_lettered", "i64"),
    ("dropped", "i64"),
    ("oldest_age_ms", "i64"),  # -1: empty
)
DESCRIBE_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "str"),
    ("configs", Array(Struct(QUEUE_CONFIG))),
    ("partitions", Array(Struct(QUEUE_COUNTS))),
)
LIST_REQUEST_V0: Schema = ()
LIST_RESPONSE_V0: Schema = (("error", "i16"), ("message", "str"), ("queues", Array("str")))
REDRIVE_REQUEST_V0: Schema = (("queue", "str"), ("dead_letter", "str"), ("max_messages", "i32"))
REDRIVE_RESPONSE_V0: Schema = (("error", "i16"), ("message", "str"), ("moved", "i64"))

SCHEMAS: dict[tuple[int, int], tuple[Schema, Schema]] = {
    (API_QUEUE_RECEIVE, 0): (RECEIVE_REQUEST_V0, RECEIVE_RESPONSE_V0),
    (API_QUEUE_SETTLE, 0): (SETTLE_REQUEST_V0, SETTLE_RESPONSE_V0),
    (API_QUEUE_CREATE, 0): (CREATE_REQUEST_V0, RESULT_RESPONSE_V0),
    (API_QUEUE_DELETE, 0): (DELETE_REQUEST_V0, RESULT_RESPONSE_V0),
    (API_QUEUE_DESCRIBE, 0): (DESCRIBE_REQUEST_V0, DESCRIBE_RESPONSE_V0),
    (API_QUEUE_LIST, 0): (LIST_REQUEST_V0, LIST_RESPONSE_V0),
    (API_QUEUE_REDRIVE, 0): (REDRIVE_REQUEST_V0, REDRIVE_RESPONSE_V0),
}


# ----- record headers -----
def _int_header(name: str, raw: bytes | None) -> int:
    try:
        return int((raw or b"").decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequestError(f"header {name} must be a decimal integer, got {raw!r}") from None


def send_headers(
    *, delay_ms: int = 0, deliver_at_ms: int = 0, priority: int | None = None, ttl_ms: int = 0, dedup_id: str = ""
) -> list[tuple[str, bytes | None]]:
    """The record headers a producer writes for a queue message (only those set); bad values
    raise before anything is sent (bounds as docs/QUEUES.md states them)."""
    from fabric import errors  # the error classes; kept local so the schema imports stay minimal

    if not 0 <= delay_ms <= SEND_DELAY_MS_MAX or deliver_at_ms < 0 or (delay_ms and deliver_at_ms):
        raise errors.InvalidDelayError(
            f"delay_ms must be 0..{SEND_DELAY_MS_MAX} (7 days) and deliver_at_ms >= 0, not both set;"
            f" got delay_ms={delay_ms} deliver_at_ms={deliver_at_ms}")
    if priority is not None and not 0 <= priority <= 9:
        raise errors.InvalidPriorityError(f"priority {priority} outside 0..9")
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
# ``STATE_RECORD_V0``. A new leader replays the queue partition, then these records in
# order; the newest record per offset wins.
STATE_TOPIC: Final[str] = "__queue_state"
STATE_RECORD_VERSION: Final[int] = 0
STATE_CODES: Final[dict[str, int]] = {"available": 0, "delayed": 1, "leased": 2, "acked": 3, "dead": 4, "dropped": 5}
_STATE_NAMES: Final[dict[int, str]] = {v: k for k, v in STATE_CODES.items()}
STATE_RECORD_V0: Schema = (
    ("version", "u8"),
    ("offset", "i64"),
    ("state", "i8"),
    ("delivery_count", "i32"),
    ("visible_at_ms", "i64"),
    ("reason", "str"),
)


def state_key(queue: str, partition: int, group: str) -> bytes:
    return f"{queue}\0{partition}\0{group}".encode()


def encode_state_record(offset: int, state: str, delivery_count: int, visible_at_ms: int, reason: str) -> bytes:
    return s.encode(STATE_RECORD_V0, {
        "version": STATE_RECORD_VERSION, "offset": offset, "state": STATE_CODES[state],
        "delivery_count": delivery_count, "visible_at_ms": visible_at_ms, "reason": reason})


def decode_state_record(raw: bytes) -> dict[str, Any]:
    """The record's fields with ``state`` as its name; refuses unknown versions and states."""
    values = s.decode(STATE_RECORD_V0, raw)
    if values["version"] != STATE_RECORD_VERSION or values["state"] not in _STATE_NAMES:
        raise CorruptMessageError(f"queue state record version {values['version']} state {values['state']}")
    values["state"] = _STATE_NAMES[values.pop("state")]
    del values["version"]
    return values
