"""The SDK's argument checks against real nodes: the bounds the Consumer accepts are the
ones the node serves (nothing the SDK lets through is refused on every fetch), and a
refused call leaves the cluster unchanged. The refusals themselves are unit-tested in
tests/unit/test_sdk_arguments.py."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.limits import FETCH_WAIT_MS_MAX
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition


def test_consumer_at_the_edges_of_its_fetch_bounds_reads(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap) as producer:
        for i in range(5):
            producer.send(topic_name, b"v%d" % i, partition=0).result(30)
    tp = TopicPartition(topic_name, 0)
    # min_bytes=1 answers as soon as data is there, so the longest wait costs nothing here.
    for options in ({"fetch_max_wait_ms": FETCH_WAIT_MS_MAX, "fetch_min_bytes": 1, "fetch_max_bytes": 2**31 - 1},
                    {"fetch_max_wait_ms": 0, "fetch_min_bytes": 0, "partition_fetch_bytes_max": 1}):
        with Consumer(cluster.bootstrap, **options) as consumer:  # type: ignore[arg-type]
            consumer.assign([tp])
            got: list[bytes | None] = []
            for _ in range(50):
                got.extend(r.value for r in consumer.poll(timeout_ms=200))
                if len(got) >= 5:
                    break
            assert got == [b"v%d" % i for i in range(5)], options
            assert consumer.position(tp) == 5
            with pytest.raises(ValueError, match="offset=-5"):
                consumer.seek(tp, -5)
            assert consumer.position(tp) == 5
            with pytest.raises(errors.InvalidRequestError, match="not assigned"):
                consumer.position(TopicPartition(topic_name, 1))


def test_refused_create_calls_create_nothing(cluster: LocalCluster, topic_name: str) -> None:
    dead_letter = f"{topic_name}-dlq"
    with Admin(cluster.bootstrap) as admin:
        with pytest.raises(errors.InvalidQueueConfigError):
            admin.create_queue(topic_name, dead_letter=dead_letter, visibility_timeout_ms=-1)
        with pytest.raises(errors.InvalidPartitionsError):
            admin.create_topic(topic_name, partitions=2**31)
        with pytest.raises(TypeError):
            admin.describe_topics(topic_name)  # type: ignore[arg-type]
        assert not {topic_name, dead_letter} & set(admin.list_topics())


def test_a_zookeeper_address_without_zk_scheme_is_named_as_such(zk_server: object) -> None:
    # A bare HOST:PORT is a node address; given ZooKeeper's, the handshake fails. The error
    # once said only "the node requires CURVE", which sent users to the security docs.
    address = zk_server.address.split("/")[0]  # type: ignore[attr-defined]
    with pytest.raises(errors.AuthenticationFailedError, match=r"not a Fabric node.*needs zk://"), \
            Admin(address, request_timeout_ms=5_000) as admin:
        admin.list_topics()
