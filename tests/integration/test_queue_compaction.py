"""``__queue_state`` is compacted (nodes/queue_compaction.py): under sustained receive and ack
its log start moves forward on every replica and what it holds stays bounded, and the
queue's state read back from what is left is the same (docs/QUEUES.md, "Delivery
guarantee and failures")."""

from __future__ import annotations

import time

import pytest

from fabric.local import LocalCluster
from fabric.protocol import queues as qp
from nodes.queue_durable import STATE_TOPIC_PARTITIONS, state_partition
from nodes.queue_snapshot import SNAPSHOT_AFTER_RECORDS_MIN
from sdk import Admin, Producer, QueueConsumer, QueueMessage

ROUND_MESSAGES = 1_000


def _state_rows(admin: Admin, queue: str) -> list[dict[str, object]]:
    k = state_partition(queue, 0, STATE_TOPIC_PARTITIONS)
    return admin.describe_replicas([qp.STATE_TOPIC]).get((qp.STATE_TOPIC, k), [])


def _take(worker: QueueConsumer, count: int) -> list[QueueMessage]:
    got: list[QueueMessage] = []
    deadline = time.monotonic() + 30
    while len(got) < count:
        assert time.monotonic() < deadline, f"received {len(got)} of {count}"
        got += worker.receive(min(qp.RECEIVE_MESSAGES_MAX, count - len(got)), 1_000)
    return got


@pytest.mark.slow
def test_queue_state_stays_bounded_under_sustained_receive_and_ack(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, replication_factor=3, max_deliveries=2, dead_letter=f"{topic_name}.dlq")
    starts: list[int] = []
    sizes: list[int] = []
    rounds = 0
    with Producer(bootstrap, linger_ms=5) as producer, \
            QueueConsumer(bootstrap, topic_name, group="workers") as worker, Admin(bootstrap) as admin:
        # Every round acks every other message first, then the rest: ~1 record per message, so
        # the snapshot rule (SNAPSHOT_AFTER_RECORDS_MIN records since the last) fires every ~10 rounds.
        while rounds < 4 * SNAPSHOT_AFTER_RECORDS_MIN // ROUND_MESSAGES:
            for f in [producer.send(topic_name, b"r%d-%d" % (rounds, i)) for i in range(ROUND_MESSAGES)]:
                f.result(timeout=30)
            batch = _take(worker, ROUND_MESSAGES)
            worker.ack(batch[0::2])
            worker.ack(batch[1::2])
            rounds += 1
            time.sleep(0.1)  # sustained, not a burst: the trimmer looks once a second
            rows = _state_rows(admin, topic_name)
            leader = next(r for r in rows if r["role"] == "leader")
            starts.append(int(leader["log_start_offset"]))  # type: ignore[call-overload]
            sizes.append(int(leader["log_end_offset"]) - int(leader["log_start_offset"]))  # type: ignore[call-overload]
        # Two poison messages: their dead letters must still be counted once their records are gone.
        producer.send(topic_name, b"poison-1").result(timeout=30)
        producer.send(topic_name, b"poison-2").result(timeout=30)
        for _ in range(2):  # max_deliveries 2: nacked twice, each is dead-lettered
            poison = _take(worker, 2)
            worker.nack(poison)
    written = rounds * ROUND_MESSAGES
    assert len({s for s in starts if s > 0}) >= 2, f"log start never moved twice: {starts}"
    assert max(sizes[len(sizes) // 2:]) < 3 * SNAPSHOT_AFTER_RECORDS_MIN, f"not bounded: {sizes}"
    assert sizes[-1] < written // 2
    # Every replica follows the leader's log start.
    deadline = time.monotonic() + 30
    with Admin(bootstrap) as admin:
        while True:
            rows = _state_rows(admin, topic_name)
            if len(rows) == 3 and len({r["log_start_offset"] for r in rows}) == 1:
                break
            assert time.monotonic() < deadline, f"replicas do not follow the log start: {rows}"
            time.sleep(0.5)
        described = admin.describe_queue(topic_name, "workers")
    assert sum(p.visible + p.in_flight + p.delayed for p in described.partitions) == 0
    assert sum(p.dead_lettered for p in described.partitions) == 2


def test_a_new_leader_loads_its_queue_partitions_unasked(fresh_cluster: LocalCluster, topic_name: str) -> None:
    """A queue partition's new leader loads its state within ADOPT_INTERVAL_S of its
    election, with no receive, settle or describe to start it (as Kafka's coordinator loads
    its groups): until loaded it has no snapshot clock, and its old records held back the
    compaction of its whole __queue_state partition, for as long as nobody used the queue."""
    from nodes.queue_coordinator import ADOPT_INTERVAL_S

    bootstrap = fresh_cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_queue(topic_name, partitions=1, replication_factor=3)
    with Producer(bootstrap) as producer:
        for i in range(10):
            producer.send(topic_name, b"%d" % i)
    with QueueConsumer(bootstrap, topic_name, group="workers") as worker:
        worker.ack(_take(worker, 4))  # records in __queue_state to load
    with Admin(bootstrap) as admin:
        old = admin.describe_topic(topic_name).partitions[0].leader
        fresh_cluster.nodes[old].kill()
        deadline = time.monotonic() + 60
        new = old
        while new in (old, -1, None):
            assert time.monotonic() < deadline, "no new leader"
            time.sleep(0.2)
            new = admin.describe_topic(topic_name).partitions[0].leader
    log_path = fresh_cluster.nodes[new].process.log_path
    serving = f"queue {topic_name}/0: serving 1 groups"
    deadline = time.monotonic() + ADOPT_INTERVAL_S + 30
    while serving not in log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"node {new} did not load {topic_name}/0 unasked"
        time.sleep(0.2)
    with QueueConsumer(bootstrap, topic_name, group="workers") as worker:  # and it serves what is left
        rest = _take(worker, 6)
        worker.ack(rest)
    assert len({m.value for m in rest}) == 6
