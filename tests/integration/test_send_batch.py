"""Producer.send_batch on real nodes: lists and Arrow arrays, RF 3, acks=all, idempotent."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol.keyhash import partition_for_key
from sdk import Admin, Producer
from tests.integration.helpers import read_all


def test_send_batch_lists_and_arrow_keep_order_with_send(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3, replication_factor=3)
    with Producer(cluster.bootstrap, batch_bytes_max=8_192) as producer:
        assert producer.idempotent and producer.max_in_flight == 5
        first = producer.send(topic_name, b"before", partition=1)
        listed = producer.send_batch(topic_name, [b"L%05d" % i for i in range(20_000)], partition=1)
        arrow = producer.send_batch(topic_name, pa.array([f"A{i:05d}" for i in range(20_000)]), partition=1,
                                    headers=[[("i", b"%d" % i)] if i % 1000 == 0 else None for i in range(20_000)])
        last = producer.send(topic_name, b"after", partition=1)
        spread = producer.send_batch(topic_name, [b"S%05d" % i for i in range(30_000)])  # sticky, whole batches
        producer.flush(60)
        batches = listed.result(0) + arrow.result(0)
        assert sum(b.record_count for b in batches) == 40_000
        assert {b.partition for b in spread.result(0)} == {0, 1, 2}
        assert first.result(0).offset == 0 and last.result(0).offset == 40_001
    records = read_all(cluster.bootstrap, topic_name, 3, expected=70_002)
    in_one = [r for r in records if r.partition == 1]
    in_one.sort(key=lambda r: r.offset)
    expected = [b"before", *(b"L%05d" % i for i in range(20_000)), *(b"A%05d" % i for i in range(20_000)), b"after"]
    assert [r.value for r in in_one if not r.value.startswith(b"S")] == expected
    assert [r.offset for r in in_one] == list(range(len(in_one)))
    tagged = {r.value: r.headers for r in in_one if r.headers}
    assert tagged[b"A01000"] == [("i", b"1000")] and len(tagged) == 20
    assert sorted(r.value for r in records if r.value.startswith(b"S")) == [b"S%05d" % i for i in range(30_000)]


def test_send_batch_with_keys_goes_where_send_would(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4, replication_factor=3)
    keys = [b"user-%d" % (i % 37) for i in range(5_000)]
    with Producer(cluster.bootstrap) as producer:
        producer.send_batch(topic_name, [b"v%d" % i for i in range(5_000)], keys=keys).result(60)
    records = read_all(cluster.bootstrap, topic_name, 4, expected=5_000)
    for r in records:
        assert r.partition == partition_for_key(r.key, 4)
    for p in range(4):
        mine = sorted((r for r in records if r.partition == p), key=lambda r: r.offset)
        assert [int(r.value[1:]) for r in mine] == sorted(int(r.value[1:]) for r in mine)  # send order kept


def test_send_batch_refuses_bad_input_and_queues_nothing(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, config={"message_bytes_max": 65_536})
    with Producer(cluster.bootstrap) as producer:
        with pytest.raises(errors.MessageTooLargeError):
            producer.send_batch(topic_name, [b"ok", b"x" * 100_000])
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            producer.send_batch(topic_name, [b"ok"], partition=5)
        with pytest.raises(TypeError):
            producer.send_batch(topic_name, [b"ok", 5])
        assert producer._acc.pending_records() == 0
        assert producer.send_batch(topic_name, []).result(0) == []


def test_a_topic_smaller_than_a_batch_gets_smaller_batches(cluster: LocalCluster, topic_name: str) -> None:
    """A topic's message_bytes_max (4096 here) below the producer's batch_bytes_max (256 KiB):
    batches used to fill to batch_bytes_max and every one was refused as MESSAGE_TOO_LARGE,
    taking all its records with it. Now a batch of that topic closes at the topic's limit,
    through send() keyed and keyless and through send_batch, and a record that cannot fit
    even alone is refused by send() itself."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, config={"message_bytes_max": 4096})
    with Producer(cluster.bootstrap, linger_ms=50) as producer:
        # Random values: lz4 cannot shrink them below the limit, as it would repeated bytes.
        futures = [producer.send(topic_name, os.urandom(100), key=b"k" if i % 3 == 0 else None)
                   for i in range(600)]
        whole = producer.send_batch(topic_name, [os.urandom(100) for _ in range(400)])
        producer.flush(30)
        assert [f.exception(0) for f in futures] == [None] * 600
        assert sum(b.record_count for b in whole.result(0)) == 400
        with pytest.raises(errors.MessageTooLargeError, match="message_bytes_max=4096"):
            producer.send(topic_name, b"z" * 4096)
    assert len(read_all(cluster.bootstrap, topic_name, 2, expected=1000)) == 1000
