"""Send callbacks run on the sender thread with no producer lock held: a callback may call
the producer (as Kafka's may), and a slow one does not hold up send() in other threads.
Before, callbacks ran under the producer's lock, and any of these calls froze the
producer for good (close(timeout) included)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fabric import errors
from fabric.local import LocalCluster
from sdk import Admin, Producer
from tests.integration.helpers import read_all

WAIT_S = 20.0  # bounds every wait here; a frozen producer fails the test instead of hanging it


def test_a_callback_may_call_the_producer(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    producer = Producer(cluster.bootstrap, linger_ms=0, max_block_ms=5_000)
    outcomes: dict[str, Any] = {}
    done = threading.Event()

    def callback(_metadata: Any, exc: BaseException | None) -> None:
        assert exc is None
        outcomes["partitions"] = producer.partitions_for(topic_name)
        outcomes["forwarded"] = producer.send(topic_name, b"from-callback", partition=1)
        try:
            producer.flush(1)
        except RuntimeError as flush_error:
            outcomes["flush"] = flush_error
        try:
            producer.send(topic_name + "-never-seen", b"x")
        except errors.FabricError as new_topic_error:
            outcomes["new_topic"] = new_topic_error
        done.set()

    try:
        producer.send(topic_name, b"first", partition=0, callback=callback).result(WAIT_S)
        assert done.wait(WAIT_S)
        assert outcomes["partitions"] == 2
        assert outcomes["forwarded"].result(WAIT_S).partition == 1  # the callback's own send goes out
        assert "wait for itself" in str(outcomes["flush"])
        assert isinstance(outcomes["new_topic"], errors.InvalidRequestError)  # at once, not after max_block_ms
        assert producer.send(topic_name, b"after", partition=0).result(WAIT_S).offset == 1  # still working
    finally:
        producer.close(WAIT_S)
    values = sorted(r.value or b"" for r in read_all(cluster.bootstrap, topic_name, 2, expected=3))
    assert values == [b"after", b"first", b"from-callback"]


def test_close_from_a_callback_and_a_slow_callback(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    producer = Producer(cluster.bootstrap, linger_ms=0)
    other_sent = threading.Event()
    waited: list[bool] = []

    def slow(_metadata: Any, _exc: BaseException | None) -> None:
        waited.append(other_sent.wait(WAIT_S))  # set only once send() returned in another thread

    first = producer.send(topic_name, b"slow", callback=slow)
    threading.Thread(target=lambda: (first.result(WAIT_S), producer.send(topic_name, b"meanwhile"),
                                     other_sent.set())).start()
    assert other_sent.wait(WAIT_S)  # send() did not wait for the callback still running
    producer.flush(WAIT_S)
    assert waited == [True]

    closed = threading.Event()
    producer.send(topic_name, b"last", callback=lambda _m, _e: (producer.close(5), closed.set()))
    assert closed.wait(WAIT_S)
    producer.close(WAIT_S)  # the close the callback started, or nothing left to do
    with pytest.raises(errors.ClientClosedError):
        producer.send(topic_name, b"after close")
    values = [r.value for r in read_all(cluster.bootstrap, topic_name, 1, expected=3)]
    assert values == [b"slow", b"meanwhile", b"last"]


def test_partitions_added_while_producing_and_offsets_of_unknown_ones(cluster: LocalCluster, topic_name: str) -> None:
    """A producer asks again before it refuses a partition past its cached count (it may
    have been added since, as Kafka's producer does); offset lookups of a partition or
    topic that does not exist say so at once instead of waiting request_timeout_ms."""
    from sdk import Consumer, TopicPartition

    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
        with Producer(cluster.bootstrap, linger_ms=0) as producer:
            producer.send(topic_name, b"before", partition=1).result(WAIT_S)
            admin.create_partitions(topic_name, 4)
            assert producer.send(topic_name, b"new", partition=3).result(WAIT_S).partition == 3
            with pytest.raises(errors.UnknownTopicOrPartitionError):
                producer.send(topic_name, b"none", partition=4)
    with Consumer(cluster.bootstrap, request_timeout_ms=60_000) as consumer:
        assert consumer.end_offsets([TopicPartition(topic_name, 3)]) == {TopicPartition(topic_name, 3): 1}
        # A partition past the count is called unknown after PARTITION_LEARN_WAIT_MS (3 s)
        # of asking again; one lookup shows it (the three share _list_offsets).
        with pytest.raises(errors.UnknownTopicOrPartitionError):  # not LeaderNotAvailable after 60 s
            consumer.end_offsets([TopicPartition(topic_name, 9)])
        nosuch = TopicPartition(topic_name + "-nosuch", 0)
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            consumer.end_offsets([nosuch])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            consumer.beginning_offsets([nosuch])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            consumer.offsets_for_times({nosuch: 0})
