"""Dead letters and the dead-letter topic's limits, on real node processes: batches that
fit its message_bytes_max, a dead letter that never can, the room create_queue gives it,
dead-letter topics that are refused, and a dedup id the node measures as sent.

Found by an outside tester against a live cluster: 30 random 100 KB messages expiring
together made one 3 MB dead-letter batch, refused by the 1 MiB dead-letter queue and
retried for ever, so that partition's receives and settles failed from then on."""

from __future__ import annotations

import os
import time

import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol import queues as qp
from sdk import Admin, Producer, QueueConsumer, QueueMessage

RECEIVE_TIMEOUT_S = 10.0  # after the fix each test takes about a second


def _send(bootstrap: str, queue: str, values: list[bytes]) -> None:
    with Producer(bootstrap, linger_ms=1, acks="all") as producer:
        for future in [producer.send(queue, v) for v in values]:
            future.result(timeout=15)


def _drain(worker: QueueConsumer, count: int, *, ack: bool = True) -> list[QueueMessage]:
    got: list[QueueMessage] = []
    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        batch = worker.receive(count - len(got), 500)
        got.extend(batch)
        if ack and batch:
            worker.ack(batch)
    return got


def test_large_dead_letters_expiring_together_are_written_in_batches_the_topic_takes(
        cluster: LocalCluster, topic_name: str) -> None:
    dlq = f"{topic_name}.dlq"
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, message_ttl_ms=300, dead_letter=dlq)
    values = [os.urandom(100_000) for _ in range(30)]  # 3 MB, incompressible
    _send(cluster.bootstrap, topic_name, values)
    time.sleep(0.5)  # all 30 expire together
    with QueueConsumer(cluster.bootstrap, topic_name) as worker, QueueConsumer(cluster.bootstrap, dlq) as dead:
        assert worker.receive(10, 200) == []  # answered once the dead letters are written
        letters = _drain(dead, 30)
        assert sorted(m.value or b"" for m in letters) == sorted(values)
        assert {dict(m.headers)[qp.HEADER_DLQ_REASON] for m in letters} == {b"ttl expired"}
        _send(cluster.bootstrap, topic_name, [b"after"])  # the partition goes on
        assert [m.value for m in _drain(worker, 1)] == [b"after"]
    with Admin(cluster.bootstrap) as admin:
        assert admin.describe_queue(topic_name).total("dead_lettered") == 30


def test_a_message_at_the_queues_limit_is_dead_lettered_whole(cluster: LocalCluster, topic_name: str) -> None:
    """create_queue gives the dead-letter queue it makes room for the fabric.dlq.* headers."""
    dlq = f"{topic_name}.dlq"
    limit_bytes = 64 * 1024
    with Admin(cluster.bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, max_deliveries=1, max_message_bytes=limit_bytes, dead_letter=dlq)
        assert admin.describe_topic(dlq).configs["message_bytes_max"] == str(limit_bytes + qp.DEAD_LETTER_ROOM_BYTES)
    value = os.urandom(limit_bytes - 72 - 14)  # a batch of exactly message_bytes_max (header, one record)
    _send(cluster.bootstrap, topic_name, [value])
    with QueueConsumer(cluster.bootstrap, topic_name) as worker, QueueConsumer(cluster.bootstrap, dlq) as dead:
        got = _drain(worker, 1, ack=False)
        assert [m.value for m in got] == [value]
        worker.nack(got, reason="poison")
        letters = _drain(dead, 1)
        assert [(m.value, dict(m.headers)[qp.HEADER_DLQ_REASON]) for m in letters] == [(value, b"poison")]


def test_a_dead_letter_the_topic_can_never_take_is_dropped_and_the_partition_goes_on(
        cluster: LocalCluster, topic_name: str) -> None:
    dlq = f"{topic_name}.dlq"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(dlq, partitions=1, config={"message_bytes_max": 64 * 1024})  # smaller than the queue's
        admin.create_queue(topic_name, partitions=1, max_deliveries=1, dead_letter=dlq)  # takes it as it is
    big = os.urandom(200_000)
    _send(cluster.bootstrap, topic_name, [b"small-1", big, b"small-2"])
    with QueueConsumer(cluster.bootstrap, topic_name) as worker, QueueConsumer(cluster.bootstrap, dlq) as dead:
        got = _drain(worker, 3, ack=False)
        assert len(got) == 3
        worker.nack(got, reason="poison")
        assert sorted(m.value or b"" for m in _drain(dead, 2)) == [b"small-1", b"small-2"]
        assert dead.receive(10, 300) == []  # the big one is not there
        _send(cluster.bootstrap, topic_name, [b"after"])
        assert [m.value for m in _drain(worker, 1)] == [b"after"]
    with Admin(cluster.bootstrap) as admin:
        description = admin.describe_queue(topic_name)
        assert (description.total("dead_lettered"), description.total("dropped")) == (2, 1)


def test_internal_topics_and_the_topic_itself_are_refused_as_dead_letter(cluster: LocalCluster,
                                                                         topic_name: str) -> None:
    """The node writes dead letters with its own rights: into __queue_state or
    __consumer_offsets a user's key, value and headers would forge queue state or offsets."""
    with Admin(cluster.bootstrap) as admin:
        for internal in (qp.STATE_TOPIC, "__consumer_offsets"):
            with pytest.raises(errors.InvalidQueueConfigError, match="internal"):
                admin.create_topic(topic_name, partitions=1, config={"queue": True, "dead_letter": internal})
            with pytest.raises(errors.InvalidQueueConfigError, match="internal"):
                admin.create_topic(topic_name, partitions=1, config={"dead_letter": internal})
            with pytest.raises(errors.InvalidQueueConfigError, match="internal"):
                admin.create_queue(topic_name, dead_letter=internal)
        with pytest.raises(errors.InvalidQueueConfigError, match="own dead-letter"):  # read as a queue, it would loop
            admin.create_topic(topic_name, partitions=1, config={"dead_letter": topic_name})
        assert topic_name not in admin.list_topics()
        admin.create_queue(topic_name, partitions=1)
        with pytest.raises(errors.InvalidConfigError, match="fixed at creation"):
            admin.alter_topic_config(topic_name, {"dead_letter": qp.STATE_TOPIC})
    with Producer(cluster.bootstrap, acks="all") as producer:
        with pytest.raises(errors.InvalidRequestError, match="UTF-8"):  # the docs' rule, at the node
            producer.send(topic_name, b"x", headers=[(qp.HEADER_DEDUP_ID, b"\xff" * 10)]).result(15)
        assert producer.send(topic_name, b"ok", dedup_id="d-1").result(15).offset == 0


def test_a_plain_topics_dead_letter_topic_cannot_be_deleted_before_it(cluster: LocalCluster, topic_name: str) -> None:
    """Any topic may be read in queue mode with its dead_letter; only queues' were counted,
    so a plain topic's could be deleted, leaving its reads failing for ever (and a topic of
    that name made again could dead-letter back into it: a cycle)."""
    dlq = f"{topic_name}.dlq"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(dlq, partitions=1)
        admin.create_topic(topic_name, partitions=1, config={"dead_letter": dlq})
        with pytest.raises(errors.InvalidQueueConfigError, match="dead-letter queue of"):
            admin.delete_topic(dlq)
        admin.delete_topic(topic_name)
        admin.delete_topic(dlq)
