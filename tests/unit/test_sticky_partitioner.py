"""Keyless records and the sticky partitioner (KIP-794's rule): the next partition once
one has taken ``batch_bytes_max`` bytes, however the batches were cut.

A producer with no reachable node and linger and timeouts far beyond the test: batches
stay in the accumulator until the test takes them as the sender would (``ready``). Runs
on whichever ``send`` the producer has (compiled or, with FABRIC_PURE_PYTHON=1, Python).
Each test has its own topic on one shared producer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fabric import errors
from fabric.local import free_port
from sdk.accumulator import RecordFuture
from sdk.producer import _ProducerCore

PARTITIONS = 3


@pytest.fixture(scope="module")
def core() -> Iterator[_ProducerCore]:
    made = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks=1, linger_ms=600_000, batch_bytes_max=4096,
                         delivery_timeout_ms=600_000, request_timeout_ms=600_000, max_block_ms=100)
    made._sticky_start = 0  # random per producer; fixed here so the expected partitions read plainly
    try:
        yield made
    finally:
        made.close(0)


@pytest.fixture
def topic(core: _ProducerCore, request: pytest.FixtureRequest) -> str:
    with core._lock:
        core._partition_counts[request.node.name] = PARTITIONS
    return str(request.node.name)


def partition_of(future: RecordFuture) -> int:
    return int(future._batch.partition)


def sent(core: _ProducerCore, topic: str) -> list[int]:
    """Take the open batches as the sender does once linger ends; this topic's partitions."""
    with core._lock:
        return [b.partition for b in core._acc.ready(time.monotonic() + 3600, {}, max_in_flight=5) if b.topic == topic]


def test_batches_sent_at_linger_move_on_after_batch_bytes_max(core: _ProducerCore, topic: str) -> None:
    # 1,000-byte values: 4 fill a 4,096-byte batch. Each batch here leaves at its linger
    # with 2 records; the partition moves on once 4 records' bytes went to it.
    partitions = []
    for _ in range(6):
        partitions += [partition_of(core.send(topic, b"v" * 1000)) for _ in range(2)]
        assert len(set(sent(core, topic))) == 1
    # Before, records stayed on partition 0 until a batch *filled*: at modest rates, forever.
    assert partitions == [0] * 4 + [1] * 4 + [2] * 4


def test_a_full_batch_moves_keyless_records_on(core: _ProducerCore, topic: str) -> None:
    partitions = [partition_of(core.send(topic, b"v" * 1000)) for _ in range(13)]
    assert partitions == [0] * 4 + [1] * 4 + [2] * 4 + [0]  # round robin


def test_each_producer_starts_on_its_own_random_partition(core: _ProducerCore, topic: str) -> None:
    with core._lock:
        core._sticky_start = 3 * 1000 + 2  # as a producer drew it
    try:
        assert partition_of(core.send(topic, b"x")) == 2
        sent(core, topic)
        with core._lock:
            del core._sticky[topic]  # the topic seen for the first time again: send_batch this time
        parts = core.send_batch(topic, [b"x"])._parts
        assert [result.partition for result, _count in parts] == [2]
        sent(core, topic)
    finally:
        with core._lock:
            core._sticky_start = 0
            core._sticky.pop(topic, None)


def test_small_batches_stay_on_one_partition(core: _ProducerCore, topic: str) -> None:
    for _ in range(5):  # one-record batches, each sent at its linger: far below batch_bytes_max
        assert partition_of(core.send(topic, b"x")) == 0
        assert sent(core, topic) == [0]


def test_keyed_and_explicit_records_do_not_move_it(core: _ProducerCore, topic: str) -> None:
    assert partition_of(core.send(topic, b"v" * 1000)) == 0
    assert partition_of(core.send(topic, b"v" * 3000, partition=2)) == 2
    assert partition_of(core.send(topic, b"x", key=b"k")) in range(PARTITIONS)
    sent(core, topic)
    with core._lock:
        assert core._sticky[topic] == 0
    assert partition_of(core.send(topic, b"v" * 1000)) == 0
    assert partition_of(core.send(topic, b"v" * 1000)) == 0
    sent(core, topic)
    assert partition_of(core.send(topic, b"v" * 2500)) == 1  # 3,000 bytes taken + 2,500 > 4,096


def test_a_refused_record_changes_nothing(core: _ProducerCore, topic: str) -> None:
    core.send(topic, b"v" * 1000)
    sent(core, topic)
    with core._lock:
        before = (core._sticky[topic], dict(core._sticky_closed_bytes), dict(core._sticky_batch))
    with pytest.raises(errors.MessageTooLargeError):
        core.send(topic, b"v" * (64 * 1024 * 1024))
    with core._lock:
        assert (core._sticky[topic], dict(core._sticky_closed_bytes), dict(core._sticky_batch)) == before
