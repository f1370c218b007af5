"""Two live consumers with one ``group_instance_id`` (static membership) on a real cluster.

The later one's join takes the instance over and fences the earlier one (Kafka's KIP-345):
the earlier one's poll() raises FencedInstanceIdError and it never rejoins. Before, the
earlier one's next heartbeat got UNKNOWN_MEMBER_ID, its SDK rejoined with the same
instance id and took the partitions back, the other did the same, and the two read the
partitions in turns for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from fabric import errors
from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer, TopicPartition
from sdk._group import ConsumerRebalanceListener
from sdk.aio import AsyncConsumer

PARTITIONS = 4
HEARTBEAT_INTERVAL_MS = 300
# A session long enough that nobody expires on a loaded machine: the fencing, not a
# timeout, must be what moves the instance.
STATIC: dict[str, Any] = {"session_timeout_ms": 15_000, "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
          "auto_offset_reset": "earliest"}
# How many heartbeats the new owner must have had answered, with the fenced consumer polled
# between them, for "no ping-pong" to be shown: the old SDK rejoined at its first.
STABLE_HEARTBEATS = 5
WAIT_S = 30.0


def _group_on_new_topic(bootstrap: str, topic: str, partitions: int) -> str:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=3)
    return f"g-{topic}"


def _wait(what: str, done: Callable[[], bool], *consumers: Consumer) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"{what}: not reached in {WAIT_S} s"
        for consumer in consumers:
            consumer.poll(timeout_ms=50)


def _first_is_fenced(first: Consumer) -> errors.FencedInstanceIdError:
    """Poll until FENCED_INSTANCE_ID is raised (its next heartbeat, a few hundred ms)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            first.poll(timeout_ms=50)
        except errors.FencedInstanceIdError as exc:
            return exc
    raise AssertionError(f"the replaced consumer was never fenced in {WAIT_S} s (it still owns {first.assignment()})")


def test_a_second_consumer_with_the_same_instance_id_fences_the_first(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = _group_on_new_topic(bootstrap, topic_name, PARTITIONS)
    everything = {TopicPartition(topic_name, p) for p in range(PARTITIONS)}
    lost: list[TopicPartition] = []

    class Recorder(ConsumerRebalanceListener):
        def on_partitions_lost(self, gone: list[TopicPartition]) -> None:
            lost.extend(gone)

    first = Consumer(bootstrap, group_id=group, group_instance_id="host-a", **STATIC)
    second = Consumer(bootstrap, group_id=group, group_instance_id="host-a", **STATIC)
    try:
        first.subscribe([topic_name], listener=Recorder())
        _wait("the first owns every partition", lambda: set(first.assignment()) == everything, first)
        second.subscribe([topic_name])  # joins at once, with the same instance id: takes it over

        fenced = _first_is_fenced(first)
        assert "another consumer joined group" in str(fenced), str(fenced)
        assert repr(group) in str(fenced) and "'host-a'" in str(fenced)
        assert fenced.group_id == group and fenced.instance_id == "host-a"
        assert first.assignment() == [] and set(lost) == everything  # lost, not revoked: no commit
        _wait("the second owns every partition", lambda: set(second.assignment()) == everything, second)

        # No ping-pong: while the second's heartbeats are answered, the fenced one is polled
        # between them, raises every time and never rejoins; the second keeps every
        # partition under one member id, and reads what is produced meanwhile.
        with Producer(bootstrap, linger_ms=1) as producer:
            for f in [producer.send(topic_name, f"after-{i}".encode(), partition=i % PARTITIONS) for i in range(40)]:
                f.result(timeout=30)
        member = second._group
        assert member is not None
        member_id, member_epoch = member.member_id, member.member_epoch
        answered: set[float] = set()
        read: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while len(answered) < STABLE_HEARTBEATS or len(read) < 40:
            assert time.monotonic() < deadline, (len(answered), len(read))
            with pytest.raises(errors.FencedInstanceIdError):
                first.poll(timeout_ms=10)
            read += [r.value for r in second.poll(timeout_ms=50) if r.value and r.value.startswith(b"after-")]
            answered.add(member._last_ok_s)  # the time of its last answered heartbeat
            assert set(second.assignment()) == everything and first.assignment() == []
            assert (member.member_id, member.member_epoch) == (member_id, member_epoch)
        assert sorted(read) == sorted(f"after-{i}".encode() for i in range(40))
        with Admin(bootstrap) as admin:
            described = admin.describe_group(group)
        assert [(m.member_id, m.instance_id) for m in described.members] == [(member_id, "host-a")]

        # Fatal for the first consumer: every read, commit and subscribe says why; closing
        # raises nothing, sends no leave and leaves the second undisturbed.
        with pytest.raises(errors.FencedInstanceIdError):
            first.poll_batches(timeout_ms=10)
        with pytest.raises(errors.FencedInstanceIdError):
            first.commit()
        with pytest.raises(errors.FencedInstanceIdError):
            first.subscribe([topic_name])
        first.close()
        second.commit()
        closed_at = member._last_ok_s
        _wait("a heartbeat of the second answered after the first closed", lambda: member._last_ok_s > closed_at, second)
        assert set(second.assignment()) == everything and member.member_id == member_id
    finally:
        first.close()
        second.close()


def test_the_asyncio_consumer_is_fenced_and_closes_cleanly(cluster: LocalCluster, topic_name: str) -> None:
    bootstrap = cluster.bootstrap
    group = _group_on_new_topic(bootstrap, topic_name, 2)

    async def run() -> None:
        first = await AsyncConsumer.create(bootstrap, group_id=group, group_instance_id="host-a", **STATIC)
        second: Consumer | None = None
        try:
            await first.subscribe([topic_name])
            deadline = time.monotonic() + WAIT_S
            while len(await first.assignment()) < 2:
                assert time.monotonic() < deadline
                await first.poll(timeout_ms=50)
            second = Consumer(bootstrap, group_id=group, group_instance_id="host-a", **STATIC)
            second.subscribe([topic_name])
            with pytest.raises(errors.FencedInstanceIdError, match="another consumer joined group"):
                while time.monotonic() < deadline + WAIT_S:
                    await first.poll(timeout_ms=50)
            with pytest.raises(errors.FencedInstanceIdError):
                await first.commit()
            assert await first.assignment() == []
        finally:
            await first.close()
            if second is not None:
                second.close()

    asyncio.run(run())
