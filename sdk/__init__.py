"""The Fabric Python SDK.

    from sdk import Producer, Consumer, Admin

    with Admin("zk://127.0.0.1:2181") as admin:
        admin.create_topic("events", partitions=6)
    with Producer("zk://127.0.0.1:2181", acks=1) as producer:
        producer.send("events", b"hello", key=b"user-1").result(timeout=10)

One entry point over both planes, asyncio first (``sdk.aio``, ``sdk.direct``)::

    client = await sdk.connect("zk://127.0.0.1:2181")
    await client.serve("echo", lambda request: request.payload)
    reply = await client.request("echo", b"hi", timeout_ms=500)

and the same with blocking calls: ``sdk.Client("zk://127.0.0.1:2181")``.

The address may be left out (``Producer()``, ``Admin()``, ``sdk.connect()``; ``None`` before
a queue or topic: ``QueueConsumer(None, "jobs")``): then it is ``$FABRIC_BOOTSTRAP``, else
the cluster ``fabric up`` recorded (fabric/bootstrap.py), as for the ``fabric`` commands.
"""

from fabric.auth.curve import ClientSecurity

# Re-exported from fabric.errors, one name per class (tests/unit/test_sdk_error_exports.py
# checks none is missing): the docs name them bare, and users import them from sdk.
from fabric.errors import (
    AlreadySettledError,
    AuthenticationFailedError,
    AuthorizationFailedError,
    BufferFullError,
    ClientClosedError,
    ConfigError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    CorruptMessageError,
    DecompressionLimitError,
    DeliveryTimeoutError,
    FabricError,
    FencedInstanceIdError,
    FencedLeaderEpochError,
    FencedMemberEpochError,
    GlobalIdRegressionError,
    GroupIdNotFoundError,
    GroupMaxSizeReachedError,
    GroupNotEmptyError,
    InvalidConfigError,
    InvalidDelayError,
    InvalidGlobalIdError,
    InvalidGroupIdError,
    InvalidIdCountError,
    InvalidMagicError,
    InvalidPartitionsError,
    InvalidPriorityError,
    InvalidProducerEpochError,
    InvalidQueueConfigError,
    InvalidReceiveWaitError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidVisibilityTimeoutError,
    LeaderNotAvailableError,
    LeaseNotHeldError,
    MalformedRequestError,
    MessageTooLargeError,
    NoBrokersAvailableError,
    NodeNotReadyError,
    NoServiceAvailable,
    NotActiveSequencerError,
    NotControllerError,
    NotCoordinatorError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProtocolError,
    QueueFullError,
    ReassignmentInProgressError,
    RemoteError,
    RequestTimedOutError,
    RequestTimeout,
    RetriableError,
    SequencerNotAvailableError,
    ServiceOverloaded,
    ServiceStopping,
    StaleSequencerEpochError,
    StorageError,
    ThrottledError,
    TopicAlreadyExistsError,
    UnknownApiError,
    UnknownLeaderEpochError,
    UnknownMemberIdError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    UnreleasedInstanceIdError,
    UnsupportedCompressionError,
    UnsupportedVersionError,
)
from sdk._client import TopicPartition
from sdk._group import ConsumerRebalanceListener, OffsetAndMetadata
from sdk.accumulator import RecordFuture, RecordMetadata
from sdk.admin import Admin, TopicDescription
from sdk.aio import AsyncClient, AsyncConsumer, AsyncProducer, connect
from sdk.client import Client
from sdk.consumer import Consumer, RawBatch, Record, RecordBatch
from sdk.direct import GatherResult, Message, Reply, Request
from sdk.ordered import OrderedConsumer
from sdk.producer import Producer
from sdk.queue import QueueConsumer, QueueMessage

__all__ = [
    # The clients and what they hand out.
    "Admin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "Client",
    "ClientSecurity",
    "Consumer",
    "ConsumerRebalanceListener",
    "GatherResult",
    "Message",
    "OffsetAndMetadata",
    "OrderedConsumer",
    "Producer",
    "QueueConsumer",
    "QueueMessage",
    "RawBatch",
    "Record",
    "RecordBatch",
    "RecordFuture",
    "RecordMetadata",
    "Reply",
    "Request",
    "TopicDescription",
    "TopicPartition",
    "connect",
    # The exceptions (fabric.errors).
    "AlreadySettledError",
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "BufferFullError",
    "ClientClosedError",
    "ConfigError",
    "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError",
    "CorruptMessageError",
    "DecompressionLimitError",
    "DeliveryTimeoutError",
    "FabricError",
    "FencedInstanceIdError",
    "FencedLeaderEpochError",
    "FencedMemberEpochError",
    "GlobalIdRegressionError",
    "GroupIdNotFoundError",
    "GroupMaxSizeReachedError",
    "GroupNotEmptyError",
    "InvalidConfigError",
    "InvalidDelayError",
    "InvalidGlobalIdError",
    "InvalidGroupIdError",
    "InvalidIdCountError",
    "InvalidMagicError",
    "InvalidPartitionsError",
    "InvalidPriorityError",
    "InvalidProducerEpochError",
    "InvalidQueueConfigError",
    "InvalidReceiveWaitError",
    "InvalidReplicationFactorError",
    "InvalidRequestError",
    "InvalidTopicError",
    "InvalidVisibilityTimeoutError",
    "LeaderNotAvailableError",
    "LeaseNotHeldError",
    "MalformedRequestError",
    "MessageTooLargeError",
    "NoBrokersAvailableError",
    "NoServiceAvailable",
    "NodeNotReadyError",
    "NotActiveSequencerError",
    "NotControllerError",
    "NotCoordinatorError",
    "NotEnoughReplicasAfterAppendError",
    "NotEnoughReplicasError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "ProtocolError",
    "QueueFullError",
    "ReassignmentInProgressError",
    "RemoteError",
    "RequestTimedOutError",
    "RequestTimeout",
    "RetriableError",
    "SequencerNotAvailableError",
    "ServiceOverloaded",
    "ServiceStopping",
    "StaleSequencerEpochError",
    "StorageError",
    "ThrottledError",
    "TopicAlreadyExistsError",
    "UnknownApiError",
    "UnknownLeaderEpochError",
    "UnknownMemberIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnreleasedInstanceIdError",
    "UnsupportedCompressionError",
    "UnsupportedVersionError",
]
