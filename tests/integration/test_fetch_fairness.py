"""Fetch fairness: a node fills a FETCH answer in the request's partition order until its
byte budget (docs/PROTOCOL.md 5.3), so a consumer listing its partitions in a fixed order
read one partition's whole backlog before another partition of the same node got a byte.
The consumer now starts each fetch to a node one partition further on (as Kafka's does)."""

from __future__ import annotations

import time
from collections import Counter

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

BATCHES_PER_PARTITION = 12


def test_partitions_of_one_node_share_its_fetches(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=4, replication_factor=1)
        leaders = {p.partition: p.leader for p in admin.describe_topic(topic_name).partitions}
    by_leader: dict[int, list[int]] = {}
    for partition, leader in leaders.items():
        by_leader.setdefault(leader, []).append(partition)
    shared = next(parts for parts in by_leader.values() if len(parts) >= 2)  # 4 partitions, 3 nodes
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for i in range(BATCHES_PER_PARTITION):
            for partition in shared:
                producer.send_batch(topic_name, [b"%d-%d" % (partition, i)] * 10, partition=partition)
            producer.flush(30)
    # A budget of one byte: each answer carries one batch, of the first partition listed
    # that has data.
    with Consumer(cluster.bootstrap, fetch_max_bytes=1, partition_fetch_bytes_max=1) as consumer:
        tps = [TopicPartition(topic_name, p) for p in shared]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        served: list[int] = []
        deadline = time.monotonic() + 30
        while len(served) < BATCHES_PER_PARTITION and time.monotonic() < deadline:
            served.extend(batch.partition for batch in consumer.poll_batches(timeout_ms=500))
    first = Counter(served[:BATCHES_PER_PARTITION])
    # In a fixed order the first dozen batches were all the first partition's.
    assert set(first) == set(shared), f"batches served in order: {served}"
