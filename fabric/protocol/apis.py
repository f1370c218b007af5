"""API keys, their body schemas (declared as data, one entry per version) and framing.

A message is a ZeroMQ multipart message: ``[header, body, *batches]``.

* ``header`` is the 16-byte frame of :mod:`fabric.protocol.header`.
* ``body`` is exactly one frame laid out by the API's schema.
* PRODUCE requests carry one record batch frame per entry after the body; FETCH
  responses carry the batches of each partition after the body, ``batch_count`` of them
  per partition, in the order of the partitions array.
* A response whose header ``error_code`` is not 0 has a single body frame holding one
  ``str``: the error message. Such an error applies to the whole request.

Version rule: a node answers a request whose ``api_version`` it does not support with
UNSUPPORTED_VERSION and a message naming its supported range; API_VERSIONS (key 0,
version 0) is always answered, so a client can ask first.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, Final, NamedTuple

from fabric.errors import MalformedRequestError, UnknownApiError, UnsupportedVersionError
from fabric.protocol import groups as _groups
from fabric.protocol import queues as _queues
from fabric.protocol import schema as s
from fabric.protocol.header import (
    Header,
    decode_header,
    encode_request_header,
    encode_response_header,
)
from fabric.protocol.schema import Array, Schema, Struct
from fabric.protocol.sequencer import ALLOCATE_IDS_REQUEST_V0, ALLOCATE_IDS_RESPONSE_V0


class ApiKey(IntEnum):
    API_VERSIONS = 0
    METADATA = 1
    PRODUCE = 2
    FETCH = 3
    LIST_OFFSETS = 4
    CREATE_TOPIC = 5
    DELETE_TOPIC = 6
    DESCRIBE_TOPICS = 7
    INIT_PRODUCER_ID = 8
    REPLICA_ACK = 9
    OFFSETS_FOR_LEADER_EPOCH = 10
    ELECT_LEADERS = 11
    CREATE_PARTITIONS = 12
    ALTER_TOPIC_CONFIGS = 13
    # 20-29: the sequencer (fabric/protocol/sequencer.py)
    ALLOCATE_IDS = 20
    # Consumer groups (30-39), schemas in fabric/protocol/groups.py.
    FIND_COORDINATOR = 30
    CONSUMER_GROUP_HEARTBEAT = 31
    OFFSET_COMMIT = 32
    OFFSET_FETCH = 33
    LIST_GROUPS = 34
    DESCRIBE_GROUPS = 35
    DELETE_GROUPS = 36
    # Queue mode (40-49), schemas in fabric/protocol/queues.py.
    QUEUE_RECEIVE = 40
    QUEUE_SETTLE = 41
    QUEUE_DESCRIBE = 42
    QUEUE_DELETE_GROUP = 43
    QUEUE_PURGE = 44
    # Operations (55-59).
    DRAIN_NODE = 55
    REASSIGN_PARTITION = 56
    DESCRIBE_REPLICAS = 57


# Special timestamps for LIST_OFFSETS and offsets in FETCH.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
CONSUMER_REPLICA_ID = -1
NO_LEADER = -1
ANY_LEADER_EPOCH = -1

PARTITION_STATE: Schema = (
    ("partition", "i32"),
    ("error", "i16"),
    ("leader", "i32"),
    ("leader_epoch", "i32"),
    ("replicas", Array("i32")),
    ("isr", Array("i32")),
)
CONFIG_ENTRY: Schema = (("key", "str"), ("value", "str"))
ERROR_BODY: Schema = (("message", "text"),)

API_VERSIONS_REQUEST_V0: Schema = ()
API_VERSIONS_RESPONSE_V0: Schema = (
    ("apis", Array(Struct((("api_key", "u16"), ("min_version", "u16"), ("max_version", "u16"))))),
)

METADATA_REQUEST_V0: Schema = (("topics", Array("str")),)
METADATA_RESPONSE_V0: Schema = (
    ("controller_id", "i32"),
    ("nodes", Array(Struct((("node_id", "i32"), ("address", "str"))))),
    (
        "topics",
        Array(
            Struct(
                (
                    ("error", "i16"),
                    ("name", "str"),
                    ("strict_order", "u8"),
                    ("message_bytes_max", "i32"),
                    ("partitions", Array(Struct(PARTITION_STATE))),
                )
            )
        ),
    ),
)

PRODUCE_REQUEST_V0: Schema = (
    ("acks", "i8"),
    ("timeout_ms", "i32"),
    ("entries", Array(Struct((("topic", "str"), ("partition", "i32"))))),
)
PRODUCE_RESPONSE_V0: Schema = (
    (
        "results",
        Array(
            Struct(
                (
                    ("topic", "str"),
                    ("partition", "i32"),
                    ("error", "i16"),
                    ("base_offset", "i64"),
                    ("log_start_offset", "i64"),
                    ("message", "text"),
                )
            )
        ),
    ),
)

FETCH_REQUEST_V0: Schema = (
    ("replica_id", "i32"),
    ("max_wait_ms", "i32"),
    ("min_bytes", "i32"),
    ("max_bytes", "i32"),
    (
        "partitions",
        Array(
            Struct(
                (
                    ("topic", "str"),
                    ("partition", "i32"),
                    ("fetch_offset", "i64"),
                    ("partition_bytes_max", "i32"),
                    ("current_leader_epoch", "i32"),
                )
            )
        ),
    ),
)
FETCH_RESPONSE_V0: Schema = (
    (
        "partitions",
        Array(
            Struct(
                (
                    ("topic", "str"),
                    ("partition", "i32"),
                    ("error", "i16"),
                    ("high_watermark", "i64"),
                    ("log_start_offset", "i64"),
                    ("log_end_offset", "i64"),
                    ("batch_count", "u32"),
                )
            )
        ),
    ),
)

# Version 1 adds a tag filter (fabric/protocol/tags.py): the node leaves out whole batches
# whose tag bloom proves no record can match, and says where the client should continue
# (``next_fetch_offset``, past skipped batches) and how many bytes it left out.
FETCH_REQUEST_V1: Schema = (*FETCH_REQUEST_V0, ("tag_filter", "str"))
FETCH_RESPONSE_V1: Schema = (
    (
        "partitions",
        Array(
            Struct(
                (
                    *FETCH_RESPONSE_V0[0][1].item.fields,  # type: ignore[union-attr]
                    ("next_fetch_offset", "i64"),  # -1: continue after the last batch returned
                    ("filtered_bytes", "i64"),
                )
            )
        ),
    ),
)

LIST_OFFSETS_REQUEST_V0: Schema = (
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("timestamp", "i64"))))),
)
LIST_OFFSETS_RESPONSE_V0: Schema = (
    (
        "partitions",
        Array(
            Struct(
                (
                    ("topic", "str"),
                    ("partition", "i32"),
                    ("error", "i16"),
                    ("timestamp", "i64"),
                    ("offset", "i64"),
                )
            )
        ),
    ),
)

CREATE_TOPIC_REQUEST_V0: Schema = (
    ("name", "str"),
    ("partitions", "i32"),
    ("replication_factor", "i16"),
    ("configs", Array(Struct(CONFIG_ENTRY))),
)
RESULT_RESPONSE_V0: Schema = (("error", "i16"), ("message", "text"))
DELETE_TOPIC_REQUEST_V0: Schema = (("name", "str"),)
DESCRIBE_TOPICS_REQUEST_V0: Schema = (("names", Array("str")),)
DESCRIBE_TOPICS_RESPONSE_V0: Schema = (
    (
        "topics",
        Array(
            Struct(
                (
                    ("error", "i16"),
                    ("name", "str"),
                    ("configs", Array(Struct(CONFIG_ENTRY))),
                    ("partitions", Array(Struct(PARTITION_STATE))),
                )
            )
        ),
    ),
)

INIT_PRODUCER_ID_REQUEST_V0: Schema = (("client_id", "str"),)
INIT_PRODUCER_ID_RESPONSE_V0: Schema = (("error", "i16"), ("producer_id", "i64"), ("producer_epoch", "i16"))

# Follower -> leader: "I have everything below log_end_offset" (stream mode heartbeat/ack).
REPLICA_ACK_REQUEST_V0: Schema = (
    ("replica_id", "i32"),
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("leader_epoch", "i32"),
                                 ("log_end_offset", "i64"))))),
)
REPLICA_ACK_RESPONSE_V0: Schema = (
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("error", "i16"),
                                 ("high_watermark", "i64"), ("log_end_offset", "i64"))))),
)
# Version 2 adds the leader's log start: a follower deletes what retention deleted on the
# leader, so a later leader change never brings deleted records back (docs/PROTOCOL.md 5.9).
REPLICA_ACK_RESPONSE_V2: Schema = (
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("error", "i16"),
                                 ("high_watermark", "i64"), ("log_end_offset", "i64"),
                                 ("log_start_offset", "i64"))))),
)
# Follower -> new leader: "where does epoch N end in your log?" (KIP-101/279 truncation).
OFFSETS_FOR_LEADER_EPOCH_REQUEST_V0: Schema = (
    ("replica_id", "i32"),
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("current_leader_epoch", "i32"),
                                 ("leader_epoch", "i32"))))),
)
OFFSETS_FOR_LEADER_EPOCH_RESPONSE_V0: Schema = (
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("error", "i16"),
                                 ("leader_epoch", "i32"), ("end_offset", "i64"), ("log_start_offset", "i64"))))),
)
# Admin -> controller: move leadership back to each partition's preferred (first) replica.
ELECT_LEADERS_REQUEST_V0: Schema = (("topics", Array("str")),)
ELECT_LEADERS_RESPONSE_V0: Schema = (("error", "i16"), ("message", "text"), ("moved", "i32"))

# Admin -> controller: move a partition to a new replica list (docs/OPERATIONS.md,
# "Moving partitions"); the follower fetches of the new replicas are held to the throttle.
REASSIGN_PARTITION_REQUEST_V0: Schema = (
    ("topic", "str"), ("partition", "i32"), ("replicas", Array("i32")), ("throttle_bytes_per_s", "i64"),
)
# Admin -> each node: its copy of each hosted partition (log range, size on disk) and, from
# the partition state it acts on, the replicas being added and removed.
DESCRIBE_REPLICAS_REQUEST_V0: Schema = (("topics", Array("str")),)
DESCRIBE_REPLICAS_RESPONSE_V0: Schema = (
    ("node_id", "i32"),
    ("partitions", Array(Struct((("topic", "str"), ("partition", "i32"), ("role", "str"), ("leader_epoch", "i32"),
                                 ("log_start_offset", "i64"), ("log_end_offset", "i64"), ("high_watermark", "i64"),
                                 ("size_bytes", "i64"), ("adding", Array("i32")), ("removing", Array("i32")),
                                 ("throttle_bytes_per_s", "i64"))))),
)

# Topics whose names start with INTERNAL_TOPIC_PREFIX are Fabric's own (``__consumer_offsets``,
# ``__queue_state``): their records are the coordinators' state, replayed on every leader
# change. Clients may read them; only nodes write them or create them, with version
# INTERNAL_VERSION of PRODUCE and CREATE_TOPIC; nobody deletes them or adds partitions.
# Kafka refuses client appends to its internal topics the same way.
INTERNAL_TOPIC_PREFIX: Final[str] = "__"
# Copies of each internal topic partition (__consumer_offsets, __queue_state): fewer when
# fewer nodes are up at its creation, grown by the controller as nodes join.
INTERNAL_REPLICATION_FACTOR: Final[int] = 3
INTERNAL_VERSION: Final[int] = 1


def is_internal_topic(name: str) -> bool:
    return name.startswith(INTERNAL_TOPIC_PREFIX)


# (api_key, api_version) -> (request schema, response schema)
SCHEMAS: dict[tuple[int, int], tuple[Schema, Schema]] = {
    (ApiKey.API_VERSIONS, 0): (API_VERSIONS_REQUEST_V0, API_VERSIONS_RESPONSE_V0),
    (ApiKey.METADATA, 0): (METADATA_REQUEST_V0, METADATA_RESPONSE_V0),
    (ApiKey.PRODUCE, 0): (PRODUCE_REQUEST_V0, PRODUCE_RESPONSE_V0),
    # Version 1 of PRODUCE and CREATE_TOPIC: the same bodies, sent by nodes writing or
    # creating Fabric's internal topics, which version 0 may not touch (PROTOCOL.md 5.2).
    (ApiKey.PRODUCE, INTERNAL_VERSION): (PRODUCE_REQUEST_V0, PRODUCE_RESPONSE_V0),
    (ApiKey.FETCH, 0): (FETCH_REQUEST_V0, FETCH_RESPONSE_V0),
    (ApiKey.FETCH, 1): (FETCH_REQUEST_V1, FETCH_RESPONSE_V1),
    (ApiKey.LIST_OFFSETS, 0): (LIST_OFFSETS_REQUEST_V0, LIST_OFFSETS_RESPONSE_V0),
    (ApiKey.CREATE_TOPIC, 0): (CREATE_TOPIC_REQUEST_V0, RESULT_RESPONSE_V0),
    (ApiKey.CREATE_TOPIC, INTERNAL_VERSION): (CREATE_TOPIC_REQUEST_V0, RESULT_RESPONSE_V0),
    (ApiKey.DELETE_TOPIC, 0): (DELETE_TOPIC_REQUEST_V0, RESULT_RESPONSE_V0),
    (ApiKey.DESCRIBE_TOPICS, 0): (DESCRIBE_TOPICS_REQUEST_V0, DESCRIBE_TOPICS_RESPONSE_V0),
    (ApiKey.INIT_PRODUCER_ID, 0): (INIT_PRODUCER_ID_REQUEST_V0, INIT_PRODUCER_ID_RESPONSE_V0),
    (ApiKey.REPLICA_ACK, 0): (REPLICA_ACK_REQUEST_V0, REPLICA_ACK_RESPONSE_V0),
    # Version 1: the same request, and the leader sends no response (docs/PROTOCOL.md 5.9).
    (ApiKey.REPLICA_ACK, 1): (REPLICA_ACK_REQUEST_V0, REPLICA_ACK_RESPONSE_V0),
    (ApiKey.REPLICA_ACK, 2): (REPLICA_ACK_REQUEST_V0, REPLICA_ACK_RESPONSE_V2),
    (ApiKey.OFFSETS_FOR_LEADER_EPOCH, 0): (OFFSETS_FOR_LEADER_EPOCH_REQUEST_V0, OFFSETS_FOR_LEADER_EPOCH_RESPONSE_V0),
    (ApiKey.ELECT_LEADERS, 0): (ELECT_LEADERS_REQUEST_V0, ELECT_LEADERS_RESPONSE_V0),
    (ApiKey.CREATE_PARTITIONS, 0): ((("name", "str"), ("partitions", "i32")), RESULT_RESPONSE_V0),
    (ApiKey.ALTER_TOPIC_CONFIGS, 0): ((("name", "str"), ("configs", Array(Struct(CONFIG_ENTRY)))), RESULT_RESPONSE_V0),
    (ApiKey.ALLOCATE_IDS, 0): (ALLOCATE_IDS_REQUEST_V0, ALLOCATE_IDS_RESPONSE_V0),
    (ApiKey.DRAIN_NODE, 0): ((("node_id", "i32"),), (("error", "i16"), ("message", "text"), ("leaderships", "i32"))),
    (ApiKey.REASSIGN_PARTITION, 0): (REASSIGN_PARTITION_REQUEST_V0, RESULT_RESPONSE_V0),
    (ApiKey.DESCRIBE_REPLICAS, 0): (DESCRIBE_REPLICAS_REQUEST_V0, DESCRIBE_REPLICAS_RESPONSE_V0),
}
SCHEMAS.update(_groups.SCHEMAS)
SCHEMAS.update(_queues.SCHEMAS)


def supported_versions() -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for key, version in SCHEMAS:
        low, high = out.get(key, (version, version))
        out[key] = (min(low, version), max(high, version))
    return out


class Message(NamedTuple):
    header: Header
    body: dict[str, Any]
    batches: list[Any]  # bytes, or zmq frames/memoryviews: whatever carried them


def _schemas_for(header: Header) -> tuple[Schema, Schema]:
    try:
        return SCHEMAS[(header.api_key, header.api_version)]
    except KeyError:
        versions = supported_versions()
        if header.api_key not in versions:
            raise UnknownApiError(f"unknown api_key {header.api_key}", correlation_id=header.correlation_id) from None
        low, high = versions[header.api_key]
        raise UnsupportedVersionError(
            f"api {ApiKey(header.api_key).name} version {header.api_version} not supported (supported {low}..{high})",
            correlation_id=header.correlation_id,
        ) from None


def encode_request(
    api_key: int, body: dict[str, Any], correlation_id: int, *, api_version: int = 0, batches: list[bytes] | None = None
) -> list[bytes]:
    request_schema, _ = SCHEMAS[(api_key, api_version)]
    frames = [encode_request_header(api_key, api_version, correlation_id), s.encode(request_schema, body)]
    if batches:
        frames.extend(batches)
    return frames


def expected_batch_frames(api_key: int, body: dict[str, Any], *, response: bool) -> int:
    """How many batch frames must follow the body frame; used to refuse extra frames."""
    if not response and api_key == ApiKey.PRODUCE:
        return len(body["entries"])
    if response and api_key == ApiKey.FETCH:
        return sum(p["batch_count"] for p in body["partitions"])
    return 0


def decode_request(frames: list[Any]) -> Message:
    """Decode ``[header, body, *batches]``. Raises a ProtocolError for anything malformed.

    When the header itself decoded, the exception carries ``header`` so the node can answer
    with the client's correlation id.
    """
    if not frames:
        raise MalformedRequestError("empty message")
    header = decode_header(frames[0])
    try:
        if header.flags or header.error_code:  # reserved on requests (PROTOCOL.md 2): room to give them meaning
            raise MalformedRequestError(f"request header has flags {header.flags:#04x} and error_code "
                                        f"{header.error_code}; both are 0 on a request")
        request_schema, _ = _schemas_for(header)
        if len(frames) < 2:
            raise MalformedRequestError(f"{ApiKey(header.api_key).name} request has no body frame")
        body = s.decode(request_schema, frames[1])
        want = expected_batch_frames(header.api_key, body, response=False)
        if len(frames) - 2 != want:
            raise MalformedRequestError(
                f"{ApiKey(header.api_key).name} request has {len(frames) - 2} batch frames, body announces {want}"
            )
    except Exception as exc:
        exc.header = header  # type: ignore[attr-defined]
        raise
    return Message(header, body, list(frames[2:]))


def encode_response(request: Header, body: dict[str, Any], batches: list[Any] | None = None) -> list[Any]:
    _, response_schema = _schemas_for(request)
    frames: list[Any] = [encode_response_header(request), s.encode(response_schema, body)]
    if batches:
        frames.extend(batches)
    return frames


def encode_error_response(request: Header, error_code: int, message: str) -> list[bytes]:
    return [encode_response_header(request, error_code), s.encode(ERROR_BODY, {"message": message})]


def decode_response(frames: list[Any]) -> Message:
    """Decode a response. A request-level error comes back as ``body={"message": ...}``
    with ``header.error_code`` set; the caller decides whether to raise."""
    if not frames:
        raise MalformedRequestError("empty response")
    header = decode_header(frames[0])
    if not header.is_response:
        # A request, or a peer's answer sent without the flag: taken as an answer, its body
        # was read as one (section 2: every response sets flags bit 0).
        raise MalformedRequestError(f"message of api {header.api_key} with correlation id {header.correlation_id} "
                                    "has no response flag: not an answer")
    if len(frames) < 2:
        raise MalformedRequestError("response has no body frame")
    if header.error_code != 0:
        return Message(header, s.decode(ERROR_BODY, frames[1]), [])
    _, response_schema = _schemas_for(header)
    body = s.decode(response_schema, frames[1])
    want = expected_batch_frames(header.api_key, body, response=True)
    if len(frames) - 2 != want:
        raise MalformedRequestError(f"response has {len(frames) - 2} batch frames, body announces {want}")
    return Message(header, body, list(frames[2:]))
