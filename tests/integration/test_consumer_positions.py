"""A consumer's starting positions and offset lookups ask each leader once, for all its
partitions (real nodes and ZooKeeper). One LIST_OFFSETS per partition, each waiting for the
last, took a consumer's first poll of 1,940 partitions 1.2-1.9 s (docs/BENCHMARKS.md,
"Many partitions")."""

from __future__ import annotations

from typing import Any

from fabric.local import LocalCluster
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, Producer, TopicPartition

PARTITIONS = 12


def count_list_offsets(consumer: Consumer) -> list[int]:
    """Count the LIST_OFFSETS the consumer sends (each entry: how many partitions it asked)."""
    sent: list[int] = []
    conns = consumer._conns
    request = conns.request

    def counted(address: str, api_key: int, body: dict[str, Any], **kwargs: Any) -> Any:
        if api_key == ApiKey.LIST_OFFSETS:
            sent.append(len(body["partitions"]))
        return request(address, api_key, body, **kwargs)

    conns.request = counted  # type: ignore[method-assign]
    return sent


def test_positions_and_end_offsets_take_one_request_per_leader(cluster: LocalCluster, topic_name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    with Producer(cluster.bootstrap) as producer:
        for p in range(PARTITIONS):
            producer.send(topic_name, b"x" * (p + 1), partition=p)
        producer.flush(30)
    tps = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        sent = count_list_offsets(consumer)
        assert consumer.end_offsets(tps) == {tp: 1 for tp in tps}
        assert len(sent) <= 3 and sum(sent) == PARTITIONS  # three nodes lead them all
        sent.clear()
        consumer.assign(tps)
        records = []
        for _ in range(50):
            records += consumer.poll(timeout_ms=200)
            if len(records) == PARTITIONS:
                break
        assert sorted(len(r.value) for r in records) == list(range(1, PARTITIONS + 1))
        assert len(sent) <= 3 and sum(sent) == PARTITIONS
        assert all(consumer.position(tp) == 1 for tp in tps)
