"""Produce and consume through real nodes and a real ZooKeeper."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from fabric import errors
from fabric.local import LocalCluster
from fabric.protocol.keyhash import partition_for_key
from sdk import Admin, Consumer, Producer, RecordFuture, TopicPartition
from tests.integration.helpers import read_all


@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_keyed_round_trip_with_headers(cluster: LocalCluster, topic_name: str, compression: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4)
    n = 5_000
    with Producer(cluster.bootstrap, compression=compression, linger_ms=2) as producer:
        futures = [
            producer.send(topic_name, b"v%d" % i, key=b"key-%d" % (i % 50), headers=[("i", b"%d" % i), ("n", None)])
            for i in range(n)
        ]
        producer.flush(30)
        metas = [f.result(0) for f in futures]
    for i, meta in enumerate(metas):
        assert meta.partition == partition_for_key(b"key-%d" % (i % 50), 4)
    records = read_all(cluster.bootstrap, topic_name, 4, expected=n)
    assert len(records) == n
    by_value = {r.value: r for r in records}
    for i, meta in enumerate(metas):
        r = by_value[b"v%d" % i]
        assert (r.partition, r.offset, r.key) == (meta.partition, meta.offset, b"key-%d" % (i % 50))
        assert r.headers == [("i", b"%d" % i), ("n", None)]
    for p in range(4):
        offsets = [r.offset for r in records if r.partition == p]
        assert offsets == list(range(len(offsets)))  # dense, in order


def test_unkeyed_records_fill_partitions_stickily(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    with Producer(cluster.bootstrap, linger_ms=1_000, batch_bytes_max=4_096) as producer:
        futures = [producer.send(topic_name, b"x" * 100) for _ in range(300)]
        producer.flush(30)
        partitions = [f.result(0).partition for f in futures]
    # Sticky: runs of one partition the size of a full batch, not round robin per record.
    changes = sum(1 for a, b in itertools.pairwise(partitions) if a != b)
    assert changes < 15
    assert set(partitions) == {0, 1, 2}


def test_long_poll_wakes_on_new_data(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    # The node holds the fetch for up to 30 s and the poll gives up after 20 s, so the
    # record can only arrive in this poll if the node answered the parked fetch when the
    # data came in.
    with Consumer(cluster.bootstrap, fetch_max_wait_ms=30_000) as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        consumer.seek_to_end()

        def produce_later() -> None:
            time.sleep(0.5)
            with Producer(cluster.bootstrap) as producer:
                producer.send(topic_name, b"wake up").result(10)

        thread = threading.Thread(target=produce_later)
        thread.start()
        consumer.poll_batches(timeout_ms=0)  # sends the long-poll fetch
        records = consumer.poll(timeout_ms=20_000)
        thread.join()
    assert [r.value for r in records] == [b"wake up"]


def test_list_offsets_by_timestamp(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for i in range(10):
            producer.send(topic_name, b"%d" % i, timestamp_ms=1_000_000 + i * 100).result(10)
    tp = TopicPartition(topic_name, 0)
    with Consumer(cluster.bootstrap) as consumer:
        assert consumer.offsets_for_times({tp: 1_000_350}) == {tp: 4}
        assert consumer.offsets_for_times({tp: 0}) == {tp: 0}
        assert consumer.offsets_for_times({tp: 9_999_999}) == {tp: -1}
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}


def test_seek_mid_batch_skips_earlier_records(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(cluster.bootstrap, linger_ms=50) as producer:
        for i in range(100):
            producer.send(topic_name, b"%d" % i)
        producer.flush(10)
    with Consumer(cluster.bootstrap) as consumer:
        tp = TopicPartition(topic_name, 0)
        consumer.assign([tp])
        consumer.seek(tp, 42)
        records = consumer.poll(timeout_ms=5_000, max_records=5)
    assert [r.offset for r in records] == [42, 43, 44, 45, 46]
    assert records[0].value == b"42"


def test_unknown_topic_is_a_clear_error(cluster: LocalCluster) -> None:
    with Producer(cluster.bootstrap, max_block_ms=5_000) as producer, pytest.raises(
        errors.UnknownTopicOrPartitionError, match="no-such-topic"
    ):
        producer.send("no-such-topic", b"x")
    with Consumer(cluster.bootstrap) as consumer, pytest.raises(errors.UnknownTopicOrPartitionError):
        consumer.assign([TopicPartition("no-such-topic", 0)])


def test_admin_errors_and_delete(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, config={"retention_ms": 60_000})
        assert topic_name in admin.list_topics()
        assert admin.describe_topic(topic_name).configs["retention_ms"] == "60000"
        with pytest.raises(errors.TopicAlreadyExistsError):
            admin.create_topic(topic_name, partitions=2)
        with pytest.raises(errors.InvalidTopicError):
            admin.create_topic("bad/name", partitions=1)
        with pytest.raises(errors.InvalidReplicationFactorError):
            admin.create_topic(topic_name + "-rf", partitions=1, replication_factor=5)
        with pytest.raises(errors.InvalidConfigError, match="unknown topic config"):
            admin.create_topic(topic_name + "-cfg", partitions=1, config={"colour": "blue"})
        with Producer(cluster.bootstrap) as producer:
            producer.send(topic_name, b"gone soon", partition=0).result(10)
        admin.delete_topic(topic_name)
        assert topic_name not in admin.list_topics()
        with pytest.raises(errors.UnknownTopicOrPartitionError):
            admin.delete_topic(topic_name)
        # Re-created with the same name: none of the old data comes back.
        admin.create_topic(topic_name, partitions=2)
    assert read_all(cluster.bootstrap, topic_name, 2) == []


def test_buffer_full_blocks_then_raises(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    # A producer whose sender cannot reach the leader (we pause every node), so the
    # buffer cannot drain: send() must give up after max_block_ms, not hang.
    producer = Producer(cluster.bootstrap, linger_ms=0, batch_bytes_max=1_000, buffer_bytes_max=2_000, max_block_ms=500)
    try:
        producer.send(topic_name, b"warm").result(10)
        for node in cluster.nodes.values():
            node.pause()
        with pytest.raises(errors.BufferFullError, match="buffer_bytes_max"):
            for _ in range(100):
                producer.send(topic_name, b"x" * 500)
    finally:
        for node in cluster.nodes.values():
            node.resume()
        producer.close(timeout=10)


def test_preferred_leader_election_moves_leadership_back(fresh_cluster: LocalCluster, topic_name: str) -> None:
    with Admin(fresh_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3, replication_factor=3)
        preferred = {p.partition: p.replicas[0] for p in admin.describe_topic(topic_name).partitions}
        victim = preferred[0]
        fresh_cluster.nodes[victim].stop()
        deadline = time.monotonic() + 30
        while admin.describe_topic(topic_name).partitions[0].leader in (victim, -1):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        fresh_cluster.nodes[victim].start()
        fresh_cluster.wait_for_nodes([victim])
        while set(admin.describe_topic(topic_name).partitions[0].isr) != {1, 2, 3}:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert admin.describe_topic(topic_name).partitions[0].leader != victim
        assert admin.elect_preferred_leaders([topic_name]) >= 1
        while {p.partition: p.leader for p in admin.describe_topic(topic_name).partitions} != preferred:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with Producer(fresh_cluster.bootstrap) as producer:
        assert producer.send(topic_name, b"after", partition=0).result(30).offset == 0


def test_add_partitions(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
        with pytest.raises(errors.InvalidPartitionsError):
            admin.create_partitions(topic_name, 2)
        admin.create_partitions(topic_name, 5)
        assert len(admin.describe_topic(topic_name).partitions) == 5
    with Producer(cluster.bootstrap) as producer:
        assert producer.send(topic_name, b"new", partition=4).result(30).offset == 0
    assert [r.value for r in read_all(cluster.bootstrap, topic_name, 5)] == [b"new"]


def test_assign_right_after_partitions_are_added_waits_for_them(cluster: LocalCluster, topic_name: str) -> None:
    """A partition just added reaches each node by its own ZooKeeper watch; a consumer whose
    metadata node has not heard yet asks again rather than call the partition unknown (a
    Spark stream that saw the new partitions through describe_topic died of this in CI);
    end_offsets() likewise. A partition the topic never gets is still refused."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
        consumers = [Consumer(address) for address in admin.nodes().values()]  # each bootstraps from one node
        try:
            for consumer in consumers:
                consumer.assign([TopicPartition(topic_name, 0)])  # the 1-partition map is cached
            admin.create_partitions(topic_name, 4, wait=False)
            wanted = [TopicPartition(topic_name, p) for p in range(4)]
            for consumer in consumers:
                consumer.assign(wanted)
                assert consumer.assignment() == wanted
            admin.create_partitions(topic_name, 6, wait=False)
            grown = [TopicPartition(topic_name, p) for p in range(4, 6)]
            assert consumers[0].end_offsets(grown) == dict.fromkeys(grown, 0)  # LIST_OFFSETS waits the same way
            with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition 6"):
                consumers[0].assign([TopicPartition(topic_name, 6)])
        finally:
            for consumer in consumers:
                consumer.close()


def test_send_right_after_partitions_are_added_waits_for_them(cluster: LocalCluster, topic_name: str) -> None:
    """The producer's side of the test above, for send() and send_batch()."""
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap) as producer:
        admin.create_topic(topic_name, partitions=1)
        assert producer.send(topic_name, b"p0", partition=0).result(30).offset == 0  # the count is cached
        admin.create_partitions(topic_name, 3, wait=False)
        assert producer.send(topic_name, b"p1", partition=1).result(30).partition == 1
        admin.create_partitions(topic_name, 5, wait=False)
        assert producer.send_batch(topic_name, [b"p4"], partition=4).result(30)[0].partition == 4
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition 5"):
            producer.send(topic_name, b"p5", partition=5)
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition 5"):
            producer.send_batch(topic_name, [b"p5"], partition=5)


def test_threads_sharing_a_producer_lose_and_reorder_nothing(cluster: LocalCluster, topic_name: str) -> None:
    """Four threads send through one producer at once, keyed and keyless, with a small
    batch size so batches fill and the sender thread takes the producer's lock all the
    while: the compiled send only tries that lock and hands the call to the Python path
    when it is held. Every record is stored once, and each thread's keyed records keep
    their order."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    threads_n, per_thread = 4, 5_000
    futures: list[list[RecordFuture]] = [[] for _ in range(threads_n)]

    def send_all(t: int) -> None:
        for i in range(per_thread):
            key = b"thread-%d" % t if i % 2 == 0 else None
            futures[t].append(producer.send(topic_name, b"%d:%d" % (t, i), key=key))

    with Producer(cluster.bootstrap, batch_bytes_max=4096, linger_ms=1) as producer:
        threads = [threading.Thread(target=send_all, args=(t,)) for t in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        producer.flush(60)
        assert all(f.exception(0) is None for fs in futures for f in fs)
    records = read_all(cluster.bootstrap, topic_name, 3, expected=threads_n * per_thread)
    values = [r.value for r in records]
    assert len(values) == len(set(values)) == threads_n * per_thread
    for t in range(threads_n):
        keyed = [r for r in records if r.key == b"thread-%d" % t]
        assert len(keyed) == per_thread // 2
        assert [int(r.value.split(b":")[1]) for r in sorted(keyed, key=lambda r: r.offset)] == \
            list(range(0, per_thread, 2))


def test_clients_without_an_address_round_trip_a_record(cluster: LocalCluster, topic_name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # Made without an address, they reach the cluster $FABRIC_BOOTSTRAP names, as the `fabric`
    # commands do (fabric/bootstrap.py; the order itself: tests/unit/test_bootstrap_resolution.py).
    monkeypatch.setenv("FABRIC_BOOTSTRAP", cluster.bootstrap)
    monkeypatch.setenv("FABRIC_HOME", str(tmp_path))  # no `fabric up` record of the developer's own is read
    with Admin() as admin:
        admin.create_topic(topic_name, partitions=1)
    with Producer(linger_ms=0) as producer:
        sent = producer.send(topic_name, b"found by itself", key=b"k").result(timeout=10)
    with Consumer() as consumer:
        consumer.assign([TopicPartition(topic_name, 0)])
        records = consumer.poll(timeout_ms=5_000)
    assert [(r.offset, r.key, r.value) for r in records] == [(sent.offset, b"k", b"found by itself")]
