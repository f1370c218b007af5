"""pause()/resume() on a real cluster (nodes, ZooKeeper, RocksDB): a paused partition is
not fetched and nothing of it is handed out, then everything comes in order on resume;
in a group, a member with everything paused keeps its membership past its session
timeout and its auto commits, and a partition revoked while paused is not paused when it
comes back. The consumer's own state: tests/unit/test_consumer_pause.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fabric.local import LocalCluster
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, TopicPartition
from sdk._group import ConsumerRebalanceListener
from sdk.consumer import Record

SESSION_MS = 6_000  # the coordinator's lowest session timeout
FAST = {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}


def produce(bootstrap: str, topic: str, partition: int, start: int, count: int) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic, b"%d-%d" % (partition, i), partition=partition) for i in range(start, start + count)]
        for future in futures:
            future.result(timeout=30)


def poll_until(consumers: list[Consumer], sinks: list[list[Record]], done: Callable[[], bool],
               timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        for consumer, sink in zip(consumers, sinks, strict=True):
            sink.extend(consumer.poll(timeout_ms=50))


def fetched_partitions(consumer: Consumer) -> list[set[int]]:
    """The partitions of every FETCH the consumer sends from now on (decoded as sent)."""
    asked: list[set[int]] = []
    send = consumer._conns.send

    def spy(address: str, frames: list[Any], **kwargs: Any) -> None:
        message = apis.decode_request(frames)
        if message.header.api_key == ApiKey.FETCH:
            asked.append({p["partition"] for p in message.body["partitions"]})
        send(address, frames, **kwargs)

    consumer._conns.send = spy  # type: ignore[method-assign]
    return asked


def values(records: list[Record], partition: int) -> list[bytes | None]:
    return [r.value for r in records if r.partition == partition]


def test_a_paused_partition_is_not_fetched_and_resumes_in_order(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    for p in (0, 1):
        produce(bootstrap, topic_name, p, 0, 200)
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Consumer(bootstrap, fetch_max_wait_ms=100) as consumer:
        consumer.assign([tp0, tp1])
        got: list[Record] = []
        # One record at a time, until partition 0 has records handed out and more buffered:
        # the pause must hold those (not hand them out, not lose them).
        deadline = time.monotonic() + 30
        while not (values(got, 0) and any(entry.partition == 0 for entry in consumer._buffer)):
            assert time.monotonic() < deadline
            got += consumer.poll(timeout_ms=100, max_records=1)
        consumer.pause(tp0)
        assert consumer._parked[tp0]
        position0 = consumer.position(tp0)
        asked = fetched_partitions(consumer)
        poll_until([consumer], [got], lambda: len(values(got, 1)) == 200)
        produce(bootstrap, topic_name, 0, 200, 100)
        produce(bootstrap, topic_name, 1, 200, 100)
        poll_until([consumer], [got], lambda: len(values(got, 1)) == 300)
        assert len(values(got, 0)) == position0  # nothing of the paused one, buffered or new
        assert consumer.position(tp0) == position0 and consumer.paused() == {tp0}
        assert asked and all(partitions == {1} for partitions in asked)
        resumed_at = len(asked)
        consumer.resume(tp0)
        poll_until([consumer], [got], lambda: len(values(got, 0)) >= 300, timeout_s=15)
        got += consumer.poll(timeout_ms=300)
        for p in (0, 1):  # every record once, in order: no gap, nothing twice
            assert values(got, p) == [b"%d-%d" % (p, i) for i in range(300)]
            assert [r.offset for r in got if r.partition == p] == list(range(300))
        assert consumer.position(tp0) == consumer.position(tp1) == 300
        assert any(0 in partitions for partitions in asked[resumed_at:])


class Heard(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.assigned: list[TopicPartition] = []
        self.revoked: list[TopicPartition] = []
        self.lost: list[TopicPartition] = []

    def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.assigned += assigned

    def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.revoked += revoked

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.lost += lost


def test_a_paused_member_keeps_its_group_and_a_revoked_partition_comes_back_unpaused(
        cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    for p in (0, 1):
        produce(bootstrap, topic_name, p, 0, 20)
    tps = {TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)}
    group = f"g-{topic_name}"
    heard = Heard()
    a = Consumer(bootstrap, group_id=group, auto_commit_interval_ms=500, **FAST)
    b = Consumer(bootstrap, group_id=group, auto_commit_interval_ms=500, **FAST)
    try:
        a.subscribe([topic_name], listener=heard)
        got_a: list[Record] = []
        poll_until([a], [got_a], lambda: len(got_a) == 40)
        a.pause(tps)  # everything: a keeps polling only to stay in the group
        member_id = a._group.member_id if a._group else ""
        paused_at = time.monotonic()
        b.subscribe([topic_name])
        got_b: list[Record] = []
        # b joins meanwhile: one of a's paused partitions goes to b.
        poll_until([a, b], [got_a, got_b], lambda: len(a.assignment()) == 1 and len(b.assignment()) == 1)
        (moved,) = tps - set(a.assignment())
        (kept,) = a.assignment()
        assert a.paused() == {kept}  # the revoked one is no longer paused here
        produce(bootstrap, topic_name, moved.partition, 20, 5)
        produce(bootstrap, topic_name, kept.partition, 20, 5)
        # Paused past a whole session timeout: heartbeats went on, so a is still the same
        # member holding the same partition, and it auto committed what it had read.
        poll_until([a, b], [got_a, got_b], lambda: time.monotonic() - paused_at > SESSION_MS / 1000 + 0.5)
        assert len(got_a) == 40 and values(got_b, moved.partition)[-1:] == [b"%d-24" % moved.partition]
        assert heard.lost == [] and heard.revoked == [moved] and a.assignment() == [kept]
        assert a._group is not None and a._group.member_id == member_id
        assert a.committed(kept) == a.position(kept) == 20
        b.close()  # b commits what it read and leaves: the partition comes back to a, not paused
        poll_until([a], [got_a], lambda: set(a.assignment()) == tps)
        assert heard.assigned[-1] == moved and a.paused() == {kept}
        produce(bootstrap, topic_name, moved.partition, 25, 5)
        poll_until([a], [got_a], lambda: len(values(got_a, moved.partition)) == 25)
        assert values(got_a, moved.partition)[20:] == [b"%d-%d" % (moved.partition, i) for i in range(25, 30)]
        assert len(values(got_a, kept.partition)) == 20  # still paused
        a.resume(kept)
        poll_until([a], [got_a], lambda: len(values(got_a, kept.partition)) == 25)
        assert values(got_a, kept.partition) == [b"%d-%d" % (kept.partition, i) for i in range(25)]
    finally:
        b.close()
        a.close()
