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
from fabric.errors import FabricError
from sdk._client import TopicPartition
from sdk._group import ConsumerRebalanceListener, OffsetAndMetadata
from sdk.accumulator import RecordFuture, RecordMetadata
from sdk.admin import Admin, TopicDescription
from sdk.aio import AsyncClient, AsyncConsumer, AsyncProducer, connect
from sdk.client import Client
from sdk.consumer import Consumer, RawBatch, Record, RecordBatch
from sdk.direct import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    ClientClosedError,
    GatherResult,
    InvalidRequestError,
    MalformedRequestError,
    Message,
    NoServiceAvailable,
    RemoteError,
    Reply,
    Request,
    RequestTimeout,
    ServiceOverloaded,
    ServiceStopping,
    UnknownServerError,
)
from sdk.ordered import OrderedConsumer
from sdk.producer import Producer
from sdk.queue import QueueConsumer, QueueMessage

__all__ = [
    "Admin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "Client",
    "GatherResult",
    "Message",
    "NoServiceAvailable",
    "RemoteError",
    "Reply",
    "Request",
    "RequestTimeout",
    "ServiceOverloaded",
    "ServiceStopping",
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "ClientClosedError",
    "InvalidRequestError",
    "MalformedRequestError",
    "UnknownServerError",
    "connect",
    "ClientSecurity",
    "Consumer",
    "ConsumerRebalanceListener",
    "FabricError",
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
    "TopicDescription",
    "TopicPartition",
]
