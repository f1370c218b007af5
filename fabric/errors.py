"""The Fabric error tree. The wire error code and the Python exception are one table.

Hierarchy::

    FabricError                      base of everything Fabric raises on purpose
    ├── ProtocolError                a peer sent bytes that do not parse (codes 2-6)
    │   ├── MalformedRequestError    truncated/extra frames, bad lengths, bad strings
    │   ├── InvalidMagicError        header magic is not FBR1
    │   ├── UnsupportedVersionError  protocol or API version the peer does not speak
    │   ├── UnknownApiError          API key the peer does not know
    │   └── CorruptMessageError      record-batch CRC mismatch or inconsistent batch
    ├── MessageTooLargeError         a batch above the topic's limit
    ├── DecompressionLimitError      a compressed frame that claims too much
    ├── UnsupportedCompressionError
    ├── UnknownTopicOrPartitionError
    ├── OffsetOutOfRangeError        fetch offset below log start or above log end
    ├── TopicAlreadyExistsError, InvalidTopicError, InvalidPartitionsError,
    │   InvalidReplicationFactorError, InvalidConfigError, InvalidRequestError
    ├── RetriableError               the same request may succeed later (retriable=True)
    │   ├── NotLeaderError           the node does not lead that partition (refresh routing)
    │   ├── LeaderNotAvailableError  no leader elected yet
    │   ├── RequestTimedOutError
    │   ├── NotEnoughReplicasError
    │   ├── NotEnoughReplicasAfterAppendError
    │   ├── FencedLeaderEpochError   the request carried an older leader epoch
    │   ├── UnknownLeaderEpochError  the request carried a newer leader epoch
    │   ├── NodeNotReadyError        the node is starting or stopping
    │   ├── StorageError             the storage engine failed a read or write
    │   └── NotControllerError
    ├── OutOfOrderSequenceError      idempotent producer saw a sequence gap
    ├── InvalidProducerEpochError    a newer producer with the same id fenced this one
    ├── consumer groups (60-69, then 91): UnknownMemberIdError, FencedMemberEpochError,
    │   GroupNotEmptyError, InvalidGroupIdError, GroupIdNotFoundError,
    │   UnreleasedInstanceIdError, GroupMaxSizeReachedError, FencedInstanceIdError
    │   (fatal: another consumer took this one's instance id); retriable:
    │   NotCoordinatorError, CoordinatorNotAvailableError, CoordinatorLoadInProgressError
    ├── UnknownServerError           anything else the node could not classify
    ├── sequencer (40-49): NotActiveSequencerError, SequencerNotAvailableError,
    │   StaleSequencerEpochError, GlobalIdRegressionError (retriable);
    │   InvalidGlobalIdError, InvalidIdCountError
    ├── queues (70-79, docs/QUEUES.md): InvalidVisibilityTimeoutError, LeaseNotHeldError,
    │   InvalidQueueConfigError, InvalidDelayError, InvalidPriorityError,
    │   InvalidReceiveWaitError, AlreadySettledError (a LeaseNotHeldError: a settle's
    │   per-message result);
    │   retriable: QueueFullError (backpressure)
    ├── direct plane (codes 50-59, sdk.direct)
    │   ├── NoServiceAvailable       no live instance of the service is known
    │   ├── RequestTimeout           no reply within timeout_ms (outcome unknown)
    │   ├── RemoteError              the handler raised; carries remote_type and remote_message
    │   ├── ServiceOverloaded        the instance's queue is full; it did not run the handler
    │   └── ServiceStopping          the instance is draining; it did not run the handler
    ├── AuthorizationFailedError     an ACL does not allow the operation (security, 80-89)
    ├── AuthenticationFailedError    CURVE handshake refused: unknown or wrong key
    ├── ThrottledError (82, retriable) over a produce quota or a request's lz4 budget
    ├── ReassignmentInProgressError  the partition is already moving (90)
    └── client-side only (no wire code, code = -1):
        ├── BufferFullError          the producer buffer stayed full for max_block_ms
        ├── DeliveryTimeoutError     a batch was not acknowledged within delivery_timeout_ms
        ├── NoBrokersAvailableError  no bootstrap address answered
        ├── ClientClosedError        the client was used after close()
        └── ConfigError              a process option (flag, environment, TOML file) is invalid

Every class has ``code`` (the wire number), ``retriable`` and ``name`` (the wire name);
``error_for_code`` maps a number back to its class. ``docs/PROTOCOL.md`` prints the same
table, and ``tests/unit/test_errors.py`` checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final, TypeVar


class FabricError(Exception):
    """Base of every error Fabric raises on purpose."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "CLIENT_ERROR"
    retriable: ClassVar[bool] = False
    description: ClassVar[str] = "client-side error"

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message or self.description)
        self.message = message or self.description
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"


class RetriableError(FabricError):
    retriable = True


class ProtocolError(FabricError):
    pass


_REGISTRY: dict[int, type[FabricError]] = {}


_E = TypeVar("_E", bound=type[FabricError])


def _wire(code: int, name: str, description: str) -> Callable[[_E], _E]:
    """Class decorator: give a class its wire code and register it in the table."""

    def register(cls: _E) -> _E:
        if code in _REGISTRY:
            raise RuntimeError(f"wire error code {code} registered twice")
        cls.code = code
        cls.name = name
        cls.description = description
        _REGISTRY[code] = cls
        return cls

    return register


@_wire(1, "UNKNOWN_SERVER_ERROR", "the node failed in a way it could not classify")
class UnknownServerError(FabricError):
    pass


@_wire(2, "CORRUPT_MESSAGE", "record-batch CRC mismatch or inconsistent batch header")
class CorruptMessageError(ProtocolError):
    pass


@_wire(3, "MALFORMED_REQUEST", "truncated or extra frames, bad lengths or bad strings")
class MalformedRequestError(ProtocolError):
    pass


@_wire(4, "UNSUPPORTED_VERSION", "protocol or API version not supported by the receiver")
class UnsupportedVersionError(ProtocolError):
    pass


@_wire(5, "UNKNOWN_API", "API key not known to the receiver")
class UnknownApiError(ProtocolError):
    pass


@_wire(6, "INVALID_MAGIC", "the header frame does not start with the magic FBR1")
class InvalidMagicError(ProtocolError):
    pass


@_wire(7, "UNKNOWN_TOPIC_OR_PARTITION", "no such topic or partition")
class UnknownTopicOrPartitionError(FabricError):
    pass


@_wire(8, "NOT_LEADER", "this node does not lead the partition; refresh the routing map")
class NotLeaderError(RetriableError):
    pass


@_wire(9, "LEADER_NOT_AVAILABLE", "the partition has no leader right now")
class LeaderNotAvailableError(RetriableError):
    pass


@_wire(10, "OFFSET_OUT_OF_RANGE", "offset below the log start or above the log end")
class OffsetOutOfRangeError(FabricError):
    pass


@_wire(11, "MESSAGE_TOO_LARGE", "batch larger than the topic's message_bytes_max")
class MessageTooLargeError(FabricError):
    pass


@_wire(12, "DECOMPRESSION_LIMIT", "compressed frame claims a size above the limit or header")
class DecompressionLimitError(FabricError):
    pass


@_wire(13, "REQUEST_TIMED_OUT", "the request did not complete within its timeout (a PRODUCE batch answered so was written and may yet be committed: section 5.2)")
class RequestTimedOutError(RetriableError):
    pass


@_wire(14, "NOT_ENOUGH_REPLICAS", "fewer in-sync replicas than min_insync; nothing written")
class NotEnoughReplicasError(RetriableError):
    pass


@_wire(15, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "written by the leader but ISR shrank below min_insync")
class NotEnoughReplicasAfterAppendError(RetriableError):
    pass


@_wire(16, "FENCED_LEADER_EPOCH", "the request's leader epoch is older than the node's")
class FencedLeaderEpochError(RetriableError):
    pass


@_wire(17, "UNKNOWN_LEADER_EPOCH", "the request's leader epoch is newer than the node's")
class UnknownLeaderEpochError(RetriableError):
    pass


@_wire(18, "TOPIC_ALREADY_EXISTS", "a topic with that name exists")
class TopicAlreadyExistsError(FabricError):
    pass


@_wire(19, "INVALID_TOPIC", "topic name empty, too long, . or .., or with characters outside [A-Za-z0-9._-]; or an internal topic a client may not write (section 5.2)")
class InvalidTopicError(FabricError):
    pass


@_wire(20, "INVALID_PARTITIONS", "partition count out of range")
class InvalidPartitionsError(FabricError):
    pass


@_wire(21, "INVALID_REPLICATION_FACTOR", "replication factor above the live node count or out of range")
class InvalidReplicationFactorError(FabricError):
    pass


@_wire(22, "INVALID_CONFIG", "unknown topic config key or bad value")
class InvalidConfigError(FabricError):
    pass


@_wire(23, "INVALID_REQUEST", "well-formed request with values that make no sense (acks=7)")
class InvalidRequestError(FabricError):
    pass


@_wire(24, "UNSUPPORTED_COMPRESSION", "compression codec not supported")
class UnsupportedCompressionError(FabricError):
    pass


@_wire(25, "NODE_NOT_READY", "the node is starting or stopping")
class NodeNotReadyError(RetriableError):
    pass


@_wire(26, "STORAGE_ERROR", "the storage engine failed a read or write")
class StorageError(RetriableError):
    pass


# The exit status of a node stopped by a StorageError: sysexits.h EX_IOERR, so a supervisor
# (systemd's RestartPreventExitStatus=74, `fabric up`) tells it from a crash, since a restart
# on a full disk fails the same way (nodes/storage_failure.py).
EXIT_STORAGE_FAILED: Final[int] = 74


@_wire(27, "NOT_CONTROLLER", "this node is not the controller")
class NotControllerError(RetriableError):
    pass


@_wire(28, "OUT_OF_ORDER_SEQUENCE", "idempotent producer sequence gap")
class OutOfOrderSequenceError(FabricError):
    pass


@_wire(29, "INVALID_PRODUCER_EPOCH", "a newer producer with the same id fenced this one")
class InvalidProducerEpochError(FabricError):
    pass


# Sequencer and strict-order topics: codes 40-49 (docs/DESIGN.md, "Strict-order topics").
@_wire(40, "NOT_ACTIVE_SEQUENCER", "this sequencer is standing by or was deposed; find the active one in ZooKeeper")
class NotActiveSequencerError(RetriableError):
    pass


@_wire(41, "SEQUENCER_NOT_AVAILABLE", "no active sequencer granted global IDs in time; nothing written")
class SequencerNotAvailableError(RetriableError):
    pass


@_wire(42, "INVALID_GLOBAL_ID", "a producer set global_id_base (on any topic); only a strict-order topic's leader stamps it")
class InvalidGlobalIdError(FabricError):
    pass


@_wire(43, "STALE_SEQUENCER_EPOCH", "a grant from a sequencer epoch older than one already seen; refused")
class StaleSequencerEpochError(RetriableError):
    pass


@_wire(44, "GLOBAL_ID_REGRESSION", "a grant at or below the last global ID of the partition; refused")
class GlobalIdRegressionError(RetriableError):
    pass


@_wire(45, "INVALID_ID_COUNT", "an ID request for a count outside 0..SEQUENCER_GRANT_IDS_MAX or an unknown kind")
class InvalidIdCountError(FabricError):
    pass


# The direct plane (sdk.direct, docs/DIRECT.md): codes 50-59.
@_wire(50, "NO_SERVICE_AVAILABLE", "no live instance of the service is registered or reachable")
class NoServiceAvailable(FabricError):
    pass


@_wire(51, "REQUEST_TIMEOUT", "no reply within timeout_ms; the handler may or may not have run")
class RequestTimeout(FabricError):
    pass


@_wire(52, "REMOTE_ERROR", "the service's handler raised; remote_type and remote_message say what")
class RemoteError(FabricError):
    remote_type: str = ""
    remote_message: str = ""


@_wire(53, "SERVICE_OVERLOADED", "the instance's request queue is full; the handler did not run")
class ServiceOverloaded(RetriableError):
    pass


@_wire(54, "SERVICE_STOPPING", "the instance is draining before it stops; the handler did not run")
class ServiceStopping(RetriableError):
    pass


# Consumer groups (60-69): see docs/GROUPS.md.
@_wire(60, "UNKNOWN_MEMBER_ID", "the group coordinator does not know this member; rejoin")
class UnknownMemberIdError(FabricError):
    pass


@_wire(61, "FENCED_MEMBER_EPOCH", "the member epoch is not the current one; the member must treat its partitions as lost and rejoin")
class FencedMemberEpochError(FabricError):
    pass


@_wire(62, "GROUP_NOT_EMPTY", "the group has live members; stop them first")
class GroupNotEmptyError(FabricError):
    pass


@_wire(63, "NOT_COORDINATOR", "this node does not coordinate that group; find the coordinator again")
class NotCoordinatorError(RetriableError):
    pass


@_wire(64, "COORDINATOR_NOT_AVAILABLE", "the group's coordinator partition has no leader right now")
class CoordinatorNotAvailableError(RetriableError):
    pass


@_wire(65, "COORDINATOR_LOAD_IN_PROGRESS", "the coordinator is still reading the group's state")
class CoordinatorLoadInProgressError(RetriableError):
    pass


@_wire(66, "INVALID_GROUP_ID", "group id empty, too long or with characters outside [A-Za-z0-9._-]")
class InvalidGroupIdError(FabricError):
    pass


@_wire(67, "GROUP_ID_NOT_FOUND", "no such group")
class GroupIdNotFoundError(FabricError):
    pass


@_wire(68, "UNRELEASED_INSTANCE_ID", "reserved: not sent by this version's nodes (a join with an instance id in use takes it over; the older member gets FENCED_INSTANCE_ID)")
class UnreleasedInstanceIdError(FabricError):
    pass


@_wire(69, "GROUP_MAX_SIZE_REACHED", "the group already has GROUP_MEMBERS_MAX members (a queue partition: QUEUE_GROUPS_MAX groups)")
class GroupMaxSizeReachedError(FabricError):
    pass


# Queues (70-79): see docs/QUEUES.md.
@_wire(70, "INVALID_VISIBILITY_TIMEOUT", "visibility/extend out of range: 0 < ms <= VISIBILITY_TIMEOUT_MS_MAX (12 h)")
class InvalidVisibilityTimeoutError(FabricError):
    pass


@_wire(71, "LEASE_NOT_HELD", "the message is not leased to this consumer (lease expired, acked or redelivered)")
class LeaseNotHeldError(FabricError):
    pass


@_wire(77, "ALREADY_SETTLED", "the message is already finished in this group (acknowledged, purged, dead-lettered or "
       "dropped): it is not delivered to the group again (an ack of an acknowledged or purged one is not refused)")
class AlreadySettledError(LeaseNotHeldError):
    # A lease not held, as LEASE_NOT_HELD, but the one case where the message is not
    # delivered again: an ``except LeaseNotHeldError`` keeps catching it.
    pass


@_wire(72, "QUEUE_FULL", "the queue is at max_messages or max_bytes; retry once workers catch up")
class QueueFullError(RetriableError):
    pass


@_wire(73, "INVALID_QUEUE_CONFIG", "a queue setting is out of its documented bounds")
class InvalidQueueConfigError(FabricError):
    pass


@_wire(74, "INVALID_DELAY", "delay_ms or a nack's delay outside 0..DELAY_MS_MAX (7 days), deliver_at_ms negative or more than 7 days ahead, or both set")
class InvalidDelayError(FabricError):
    pass


@_wire(75, "INVALID_PRIORITY", "priority outside PRIORITY_MIN..PRIORITY_MAX (0..9)")
class InvalidPriorityError(FabricError):
    pass


@_wire(76, "INVALID_RECEIVE_WAIT", "receive wait_ms outside 0..RECEIVE_WAIT_MS_MAX (20 s)")
class InvalidReceiveWaitError(FabricError):
    pass


@_wire(80, "AUTHORIZATION_FAILED", "the principal may not perform that operation on that resource")
class AuthorizationFailedError(FabricError):
    """Carries ``principal``, ``operation`` and ``resource`` (strings) when the node sent them."""


@_wire(81, "AUTHENTICATION_FAILED", "the peer's CURVE key is not registered, or the server key is wrong")
class AuthenticationFailedError(FabricError):
    pass


@_wire(82, "THROTTLED", "nothing was written, retry later: over its produce quota with the node's throttle queue full, "
                        "or a PRODUCE batch past the request's lz4 budget (section 4.5, step 7)")
class ThrottledError(RetriableError):
    pass


@_wire(90, "REASSIGNMENT_IN_PROGRESS", "the partition is already moving to other replicas; wait for it to finish")
class ReassignmentInProgressError(FabricError):
    pass


# Consumer groups again: their block (60-69) is full, so their next codes follow the last
# code assigned (90), not a gap in another feature's block.
@_wire(91, "FENCED_INSTANCE_ID", "another consumer joined the group with this member's instance id; this one is "
                                 "fenced for good: it must stop, not rejoin")
class FencedInstanceIdError(FabricError):
    """Raised by the consumer's poll() and commit() from then on; ``group_id`` and
    ``instance_id`` say which. Only ``close()`` (or ``unsubscribe()``) is left to do."""

    group_id: str = ""
    instance_id: str = ""


# Client-side only: these never cross the wire, so they keep code -1.
class BufferFullError(FabricError):
    name = "BUFFER_FULL"
    description = "the producer buffer stayed full for max_block_ms"


class DeliveryTimeoutError(FabricError):
    name = "DELIVERY_TIMEOUT"
    description = "a batch was not acknowledged within delivery_timeout_ms"


class NoBrokersAvailableError(FabricError):
    name = "NO_NODES_AVAILABLE"
    description = "no bootstrap address answered"


class ClientClosedError(FabricError):
    name = "CLIENT_CLOSED"
    description = "the client was used after close()"


class ConfigError(FabricError):
    name = "CONFIG_ERROR"
    description = "a process option (flag, environment variable or TOML file) is invalid"


def error_for_code(code: int) -> type[FabricError]:
    """The exception class for a wire error code; unknown codes map to UnknownServerError."""
    return _REGISTRY.get(code, UnknownServerError)


def raise_for_code(code: int, message: str = "", **fields: object) -> None:
    """Raise the exception for ``code`` unless it is 0 (no error)."""
    if code != 0:
        raise error_for_code(code)(message, **fields)


def error_table() -> list[tuple[int, str, bool, str, str]]:
    """(code, name, retriable, python class, description) for every wire error, by code."""
    rows = [(0, "NONE", False, "-", "no error")]
    for code in sorted(_REGISTRY):
        cls = _REGISTRY[code]
        rows.append((code, cls.name, cls.retriable, cls.__name__, cls.description))
    return rows
