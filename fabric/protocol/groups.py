"""Consumer-group wire schemas and the records the coordinator keeps in ``__consumer_offsets``.

Pure: schemas declared as data, codecs bytes in and values out. The API keys (30-36) are in
:class:`fabric.protocol.apis.ApiKey`; this module is imported by ``apis`` to register them.
See docs/GROUPS.md for the protocol walk-through and docs/PROTOCOL.md section 5.14.

Records in ``__consumer_offsets`` (one topic, ``OFFSETS_TOPIC_PARTITIONS`` partitions; the
group id hashes to one partition, whose leader is the group's coordinator):

* an offset commit: key ``OFFSET_KEY_PREFIX + group + NUL + topic + NUL + partition``
  (partition in decimal), value ``OFFSET_VALUE_V0``; a null value deletes it.
* a group's membership: key ``GROUP_KEY_PREFIX + group``, value ``GROUP_VALUE_V0``
  (members, their epochs and assignments); a null value deletes the group.

The newest record of a key wins, so the coordinator rebuilds state by reading the
partition once and keeping the last value per key.
"""

from __future__ import annotations

import functools
import re
import zlib
from typing import Any, Final

import re2

from fabric.errors import CorruptMessageError, InvalidGroupIdError, InvalidRequestError
from fabric.protocol import schema as s
from fabric.protocol.schema import Array, Schema, Struct

OFFSETS_TOPIC: Final[str] = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS: Final[int] = 8
GROUP_ID_BYTES_MAX: Final[int] = 200
# A commit's metadata string, as Kafka's offset.metadata.max.bytes: the coordinator keeps
# every group's offsets in memory, so a client must not make each one arbitrarily large.
OFFSET_METADATA_BYTES_MAX: Final[int] = 4096
_GROUP_ID = re.compile(r"^[A-Za-z0-9._-]+$")

# member_epoch values with a meaning of their own in a heartbeat request (as in KIP-848).
JOIN_EPOCH: Final[int] = 0  # "I am new": the coordinator gives a member id and epoch
LEAVE_EPOCH: Final[int] = -1  # "I am leaving": partitions are freed at once
STATIC_LEAVE_EPOCH: Final[int] = -2  # static member restarting: keep its partitions until the session ends

OFFSET_KEY_PREFIX: Final[bytes] = b"o"
GROUP_KEY_PREFIX: Final[bytes] = b"g"

API_FIND_COORDINATOR: Final[int] = 30
API_CONSUMER_GROUP_HEARTBEAT: Final[int] = 31
API_OFFSET_COMMIT: Final[int] = 32
API_OFFSET_FETCH: Final[int] = 33
API_LIST_GROUPS: Final[int] = 34
API_DESCRIBE_GROUPS: Final[int] = 35
API_DELETE_GROUPS: Final[int] = 36

TOPIC_PARTITIONS: Schema = (("topic", "str"), ("partitions", Array("i32")))

FIND_COORDINATOR_REQUEST_V0: Schema = (("group_id", "str"),)
FIND_COORDINATOR_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("node_id", "i32"),
    ("address", "str"),
    ("partition", "i32"),  # the partition of __consumer_offsets that holds the group
)

CONSUMER_GROUP_HEARTBEAT_REQUEST_V0: Schema = (
    ("group_id", "str"),
    ("member_id", "str"),  # "" when joining
    ("member_epoch", "i32"),  # 0 join, -1 leave, -2 static leave, else the epoch last received
    ("instance_id", "str"),  # "" = dynamic member
    ("session_timeout_ms", "i32"),
    ("subscribed_topics", Array("str")),
    ("subscribed_topic_regex", "str"),  # "" = none; an RE2 full match over topic names
    ("owned", Array(Struct(TOPIC_PARTITIONS))),  # partitions the member still holds
)
CONSUMER_GROUP_HEARTBEAT_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("member_id", "str"),
    ("member_epoch", "i32"),
    ("heartbeat_interval_ms", "i32"),
    ("assignment", Array(Struct(TOPIC_PARTITIONS))),  # what the member may hold now
)

OFFSET_COMMIT_REQUEST_V0: Schema = (
    ("group_id", "str"),
    ("member_id", "str"),  # "" for a consumer outside the group protocol (assign() + commit)
    ("member_epoch", "i32"),  # -1 with an empty member id
    ("offsets", Array(Struct((("topic", "str"), ("partition", "i32"), ("offset", "i64"), ("metadata", "str"))))),
)
OFFSET_COMMIT_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("results", Array(Struct((("topic", "str"), ("partition", "i32"), ("error", "i16"))))),
)

OFFSET_FETCH_REQUEST_V0: Schema = (
    ("group_id", "str"),
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"))))),  # empty = every committed one
)
OFFSET_FETCH_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("message", "text"),
    ("offsets", Array(Struct((("topic", "str"), ("partition", "i32"), ("offset", "i64"),  # -1 = none
                              ("metadata", "str"), ("commit_ms", "i64"))))),
)

LIST_GROUPS_REQUEST_V0: Schema = ()
LIST_GROUPS_RESPONSE_V0: Schema = (
    ("error", "i16"),
    ("groups", Array(Struct((("group_id", "str"), ("state", "str"), ("members", "i32"))))),
)

MEMBER_DESCRIPTION: Schema = (
    ("member_id", "str"),
    ("instance_id", "str"),
    ("member_epoch", "i32"),
    ("subscribed_topics", Array("str")),
    ("subscribed_topic_regex", "str"),
    ("assignment", Array(Struct(TOPIC_PARTITIONS))),
    ("revoking", Array(Struct(TOPIC_PARTITIONS))),  # told to give up, not confirmed yet
)
DESCRIBE_GROUPS_REQUEST_V0: Schema = (("group_ids", Array("str")),)
DESCRIBE_GROUPS_RESPONSE_V0: Schema = (
    ("groups", Array(Struct((("error", "i16"), ("group_id", "str"), ("state", "str"), ("group_epoch", "i32"),
                             ("members", Array(Struct(MEMBER_DESCRIPTION))))))),
)

DELETE_GROUPS_REQUEST_V0: Schema = (("group_ids", Array("str")),)
DELETE_GROUPS_RESPONSE_V0: Schema = (
    ("results", Array(Struct((("group_id", "str"), ("error", "i16"), ("message", "text"))))),
)

# (api_key, api_version) -> (request schema, response schema); merged into apis.SCHEMAS.
SCHEMAS: dict[tuple[int, int], tuple[Schema, Schema]] = {
    (API_FIND_COORDINATOR, 0): (FIND_COORDINATOR_REQUEST_V0, FIND_COORDINATOR_RESPONSE_V0),
    (API_CONSUMER_GROUP_HEARTBEAT, 0): (CONSUMER_GROUP_HEARTBEAT_REQUEST_V0, CONSUMER_GROUP_HEARTBEAT_RESPONSE_V0),
    (API_OFFSET_COMMIT, 0): (OFFSET_COMMIT_REQUEST_V0, OFFSET_COMMIT_RESPONSE_V0),
    (API_OFFSET_FETCH, 0): (OFFSET_FETCH_REQUEST_V0, OFFSET_FETCH_RESPONSE_V0),
    (API_LIST_GROUPS, 0): (LIST_GROUPS_REQUEST_V0, LIST_GROUPS_RESPONSE_V0),
    (API_DESCRIBE_GROUPS, 0): (DESCRIBE_GROUPS_REQUEST_V0, DESCRIBE_GROUPS_RESPONSE_V0),
    (API_DELETE_GROUPS, 0): (DELETE_GROUPS_REQUEST_V0, DELETE_GROUPS_RESPONSE_V0),
}

# -- records in __consumer_offsets ----------------------------------------------------------
OFFSET_VALUE_V0: Schema = (("version", "u8"), ("offset", "i64"), ("metadata", "str"), ("commit_ms", "i64"))
GROUP_MEMBER_V0: Schema = (
    ("member_id", "str"),
    ("instance_id", "str"),
    ("member_epoch", "i32"),
    ("previous_epoch", "i32"),  # still accepted while the member holds nothing new (a lost answer)
    ("session_timeout_ms", "i32"),
    ("subscribed_topics", Array("str")),
    ("subscribed_topic_regex", "str"),
    ("assignment", Array(Struct(TOPIC_PARTITIONS))),
    ("revoking", Array(Struct(TOPIC_PARTITIONS))),
)
GROUP_VALUE_V0: Schema = (("version", "u8"), ("group_epoch", "i32"), ("members", Array(Struct(GROUP_MEMBER_V0))))
# V1 adds who each member authenticated as on a secure cluster ("" otherwise), so a new
# coordinator filters a pattern subscription by that principal's describe rights from its
# first heartbeat on. Written from V1 on; V0 records still load (principal "").
GROUP_MEMBER_V1: Schema = (*GROUP_MEMBER_V0, ("principal", "str"))
GROUP_VALUE_V1: Schema = (("version", "u8"), ("group_epoch", "i32"), ("members", Array(Struct(GROUP_MEMBER_V1))))
_GROUP_VALUES: Final[dict[int, Schema]] = {0: GROUP_VALUE_V0, 1: GROUP_VALUE_V1}


def check_group_id(group_id: str) -> None:
    """Refuse a group id that could not be a key or a CLI argument."""
    if not group_id or len(group_id.encode("utf-8")) > GROUP_ID_BYTES_MAX or not _GROUP_ID.match(group_id):
        raise InvalidGroupIdError(
            f"group id {group_id!r} must be 1 to {GROUP_ID_BYTES_MAX} characters of [A-Za-z0-9._-]")


TOPIC_PATTERN_BYTES_MAX: Final[int] = 1_000
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the client's error, reported to it, not logged


@functools.lru_cache(maxsize=256)
def compile_topic_pattern(pattern: str) -> Any:
    """A subscription pattern, compiled with RE2: linear time in the topic name, so a
    hostile pattern cannot stall the coordinator's loop (Python's ``re`` backtracks;
    Kafka's coordinator uses RE2J for the same reason). Backreferences and lookaround
    are refused. Matching is ``fullmatch`` against the whole topic name."""
    if len(pattern.encode("utf-8")) > TOPIC_PATTERN_BYTES_MAX:
        raise InvalidRequestError(f"topic pattern longer than TOPIC_PATTERN_BYTES_MAX={TOPIC_PATTERN_BYTES_MAX} bytes")
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        raise InvalidRequestError(f"topic pattern {pattern!r} is not a valid RE2 expression: {exc}") from None


def coordinator_partition(group_id: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """The partition of ``__consumer_offsets`` that holds the group (same CRC-32 as keys)."""
    return (zlib.crc32(group_id.encode("utf-8")) & 0xFFFFFFFF) % partitions


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return OFFSET_KEY_PREFIX + f"{group_id}\0{topic}\0{partition}".encode()


def group_key(group_id: str) -> bytes:
    return GROUP_KEY_PREFIX + group_id.encode("utf-8")


def encode_offset_value(offset: int, metadata: str, commit_ms: int) -> bytes:
    return s.encode(OFFSET_VALUE_V0, {"version": 0, "offset": offset, "metadata": metadata, "commit_ms": commit_ms})


def encode_group_value(group_epoch: int, members: list[dict[str, Any]]) -> bytes:
    return s.encode(GROUP_VALUE_V1, {"version": 1, "group_epoch": group_epoch, "members": members})


def decode_record(key: bytes, value: bytes | None) -> tuple[str, Any] | None:
    """One record of ``__consumer_offsets`` as ``("offset", (group, topic, partition, value|None))``
    or ``("group", (group, value|None))``; None for a key this version does not know (skipped,
    so a newer writer's record types do not break an older reader). Any other bytes raise
    CorruptMessageError: the coordinator replays this log on every leader change, so one
    unreadable record must cost that record, never the load."""
    if key.startswith(OFFSET_KEY_PREFIX):
        parts = _key_text(key).split("\0")
        if len(parts) != 3:
            return None
        group, topic, partition = parts
        if not (partition.isascii() and partition.isdigit()):
            raise CorruptMessageError(f"group offset record key {key[:80]!r}: partition {partition[:20]!r} is not decimal")
        value_fields = None if value is None else s.decode(OFFSET_VALUE_V0, value)
        _check_version(value_fields, key)
        return "offset", (group, topic, int(partition), value_fields)
    if key.startswith(GROUP_KEY_PREFIX):
        schema = _GROUP_VALUES.get(value[0] if value else 0)
        if value is not None and schema is None:
            raise CorruptMessageError(f"group record {key[:80]!r}: value version {value[0]} is not 0 or 1")
        value_fields = None if value is None or schema is None else s.decode(schema, value)
        return "group", (_key_text(key), value_fields)
    return None


def _key_text(key: bytes) -> str:
    try:
        return key[1:].decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptMessageError(f"group record key {key[:80]!r} is not UTF-8") from None


def _check_version(value_fields: dict[str, Any] | None, key: bytes) -> None:
    if value_fields is not None and value_fields["version"] != 0:
        raise CorruptMessageError(f"group record {key[:80]!r}: value version {value_fields['version']} is not 0")


def tp_list(pairs: Any) -> list[dict[str, Any]]:
    """``{(topic, partition), ...}`` -> the wire's ``[{topic, partitions: [..]}]``, sorted."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in pairs:
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(by_topic.items())]


def tp_set(entries: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """The wire's ``[{topic, partitions}]`` -> ``{(topic, partition)}``."""
    return {(e["topic"], p) for e in entries for p in e["partitions"]}
