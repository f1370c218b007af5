"""The Fabric Python SDK.

    from sdk import Producer, Consumer, Admin

    with Admin("zk://127.0.0.1:2181") as admin:
        admin.create_topic("events", partitions=6)
    with Producer("zk://127.0.0.1:2181", acks=1) as producer:
        producer.send("events", b"hello", key=b"user-1").result(timeout=10)
"""

from fabric.auth.curve import ClientSecurity
from fabric.errors import FabricError
from sdk._client import TopicPartition
from sdk.accumulator import RecordFuture, RecordMetadata
from sdk.admin import Admin, TopicDescription
from sdk.consumer import Consumer, RawBatch, Record, RecordBatch
from sdk.producer import Producer

__all__ = [
    "Admin",
    "ClientSecurity",
    "Consumer",
    "FabricError",
    "Producer",
    "RawBatch",
    "Record",
    "RecordBatch",
    "RecordFuture",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
]
