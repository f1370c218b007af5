"""What a group has committed, as the Admin API, `fabric group describe`, `fabric status` and
`Consumer.committed()` show it, on a real cluster: a partition a member holds but has not
committed has no committed offset and no lag (Kafka's kafka-consumer-groups prints "-"),
and the metadata string committed with an offset reads back."""

from __future__ import annotations

import asyncio
import time

import pytest

import sdk
from fabric.cli.status import Status, add_groups
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition

FAST = {"session_timeout_ms": 6_000, "heartbeat_interval_ms": 500}
RECORDS_PER_PARTITION = 4
ASSIGNMENT_WAIT_S = 30.0


def _produce(bootstrap: str, topic: str, partitions: int) -> None:
    with Producer(bootstrap, linger_ms=1) as producer:
        futures = [producer.send(topic, b"v%d" % i, partition=p)
                   for p in range(partitions) for i in range(RECORDS_PER_PARTITION)]
        for future in futures:
            future.result(timeout=30)


def _hold_all(consumer: Consumer, partitions: int) -> None:
    """Poll until the group gave this (only) member every partition."""
    deadline = time.monotonic() + ASSIGNMENT_WAIT_S
    while len(consumer.assignment()) < partitions:
        if time.monotonic() > deadline:
            raise AssertionError(f"assignment {consumer.assignment()} after {ASSIGNMENT_WAIT_S} s")
        consumer.poll(timeout_ms=100)


def test_a_partition_without_a_commit_has_no_committed_offset_and_no_lag(
        cluster: LocalCluster, topic_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fabric.cli import main

    bootstrap, group = cluster.bootstrap, f"g-{topic_name}"
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    _produce(bootstrap, topic_name, 2)
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                  **FAST) as consumer:
        consumer.subscribe([topic_name])
        _hold_all(consumer, 2)
        consumer.commit({TopicPartition(topic_name, 0): 3})  # partition 1: nothing committed
        with Admin(bootstrap) as admin:
            offsets = {p.partition: p for p in admin.describe_group(group).offsets}
        assert (offsets[0].committed, offsets[0].log_end, offsets[0].lag) == (3, RECORDS_PER_PARTITION, 1)
        # It used to say committed -1 and lag 4 (the whole log): a backlog the group may not have.
        assert (offsets[1].committed, offsets[1].log_end, offsets[1].lag) == (None, RECORDS_PER_PARTITION, None)
        assert offsets[1].member_id and offsets[1].member_id == offsets[0].member_id

        capsys.readouterr()
        assert main(["group", "describe", group, "-b", bootstrap]) == 0
        rows = {line.split()[1]: line.split() for line in capsys.readouterr().out.splitlines()
                if line.startswith(topic_name)}
        assert rows["0"][2:5] == ["3", str(RECORDS_PER_PARTITION), "1"]
        assert rows["1"][2:5] == ["-", str(RECORDS_PER_PARTITION), "-"]

        # `fabric status` sums the lags there are, as it did when every partition had a commit.
        status = Status(zookeeper="", nodes=[{"up": True}])
        add_groups(status, bootstrap)
        assert status.groups is not None
        assert [(g["lag"], g["partitions"]) for g in status.groups if g["group_id"] == group] == [(1, 2)]
    with Admin(bootstrap) as admin:  # nobody holds partition 1 now, and nothing was committed for it
        assert [(p.partition, p.committed, p.lag) for p in admin.describe_group(group).offsets] == [(0, 3, 1)]


def test_committed_reads_back_the_metadata_committed_with_the_offset(cluster: LocalCluster, topic_name: str) -> None:
    from sdk.consumer import OffsetAndMetadata

    bootstrap, group = cluster.bootstrap, f"g-{topic_name}"
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2, replication_factor=3)
    _produce(bootstrap, topic_name, 2)
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False, **FAST) as consumer:
        consumer.subscribe([topic_name])
        _hold_all(consumer, 2)
        consumer.commit({tp0: (3, "batch-7"), tp1: 2})
        assert consumer.committed(tp0) == 3  # unchanged for its existing callers
        assert consumer.committed(tp0, metadata=True) == OffsetAndMetadata(3, "batch-7", None)
        assert consumer.committed(tp1, metadata=True) == OffsetAndMetadata(2, "")
        # What it returns can be committed again as it is (kafka-python's round trip).
        consumer.commit({tp1: OffsetAndMetadata(4, "done")})
        assert consumer.committed((topic_name, 1), metadata=True) == OffsetAndMetadata(4, "done")
        with pytest.raises(TypeError):
            consumer.committed(tp0, metadata="yes")  # type: ignore[call-overload]
    with Admin(bootstrap) as admin:  # the Admin API shows the same metadata
        assert [(p.committed, p.metadata) for p in admin.describe_group(group).offsets] == [(3, "batch-7"), (4, "done")]

    async def run() -> tuple[object, object, object]:
        client = await sdk.connect(bootstrap)
        try:
            # Not subscribed: a consumer outside the (now empty) group reads its offsets too.
            consumer = await client.consumer([], group_id=group, enable_auto_commit=False)
            return (await consumer.committed(tp0), await consumer.committed(tp0, metadata=True),
                    await consumer.committed(TopicPartition(topic_name, 5), metadata=True))
        finally:
            await client.close()

    assert asyncio.run(run()) == (3, OffsetAndMetadata(3, "batch-7"), None)


def test_commit_metadata_is_bounded_as_kafka_bounds_it(cluster: LocalCluster, topic_name: str) -> None:
    """Metadata of at most OFFSET_METADATA_BYTES_MAX (4,096 bytes, Kafka's
    offset.metadata.max.bytes) is committed; longer, the SDK raises before sending, and the
    coordinator refuses it (INVALID_REQUEST for that partition) from a client that does not
    check, keeping what was committed: it holds every group's offsets in memory."""
    from fabric import errors
    from fabric.protocol import groups as gp
    from fabric.protocol.apis import ApiKey
    from fabric.transport import Connections

    bootstrap, group = cluster.bootstrap, f"meta-{topic_name}"
    tp = TopicPartition(topic_name, 0)
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
    largest = "é" * (gp.OFFSET_METADATA_BYTES_MAX // 2)  # two bytes each in UTF-8: exactly the bound
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False) as consumer:
        consumer.commit({tp: (1, largest)})
        with pytest.raises(ValueError, match="4096"):
            consumer.commit({tp: (2, largest + "x")})
        assert consumer.committed(tp, metadata=True) == (1, largest, None)
    with Admin(bootstrap) as admin:
        coordinator = admin._find_coordinator(group)
    conns = Connections()
    try:
        body = {"group_id": group, "member_id": "", "member_epoch": 0,
                "offsets": [{"topic": topic_name, "partition": 0, "offset": 3, "metadata": largest + "x"}]}
        answer = conns.request(coordinator, ApiKey.OFFSET_COMMIT, body, timeout_ms=10_000)
        assert answer.body["error"] == 0
        assert answer.body["results"][0]["error"] == errors.InvalidRequestError.code
    finally:
        conns.close()
    with Consumer(bootstrap, group_id=group, enable_auto_commit=False) as consumer:
        assert consumer.committed(tp) == 1
