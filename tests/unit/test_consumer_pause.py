"""pause()/resume()/paused() on the consumer's own state, no cluster: a paused partition is
left out of the fetch plan and of FETCH requests, its buffered records wait (not handed
out, not lost) and come back in order on resume, and its position does not move. The
fetches on a real cluster and in a group: tests/integration/test_consumer_pause.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from fabric import errors
from fabric.local import free_port
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol.apis import ApiKey
from fabric.protocol.tags import TAGS_HEADER, encode_tags
from sdk import Consumer, TopicPartition
from sdk.aio import AsyncConsumer
from sdk.consumer import RawBatch, Record, _position_marker

TOPIC = "t"
TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)
NODE = "tcp://10.0.0.9:1"  # never connected: the tests catch what would be sent


class FakeMap:
    """The routing map: both partitions led by NODE (or by nobody)."""

    def __init__(self, led: bool) -> None:
        self.topics = {TOPIC: None}
        self.led = led

    def leader_address(self, topic: str, partition: int) -> str | None:
        return NODE if self.led else None


class FakeMetadata:
    def __init__(self, led: bool) -> None:
        self.metadata = FakeMap(led)

    def refresh(self, topics: list[str] | None = None, *, avoid: Iterable[str] = (), **_: Any) -> FakeMap:
        return self.metadata

    def topic(self, name: str) -> Any:
        return SimpleNamespace(partition_count=2)


def raw(tp: TopicPartition, base_offset: int, count: int, tags: list[str] | None = None) -> RawBatch:
    values = [b"%d-%d" % (tp.partition, base_offset + i) for i in range(count)]
    headers = [[(TAGS_HEADER, encode_tags(tags))] for _ in range(count)] if tags else None
    buf = batch_format.encode_batch([0] * count, [None] * count, values, headers, base_offset=base_offset)
    return RawBatch(tp.topic, tp.partition, buf, 0)


def fill(c: Consumer) -> None:
    """Both partitions assigned at offset 0, six records of each buffered (two batches of
    three, interleaved as fetches leave them), fetched up to offset 6."""
    c._meta = FakeMetadata(led=False)  # type: ignore[assignment]
    c._refresh_needed = False
    c._assign([TP0, TP1], refresh=False)
    for tp in (TP0, TP1):
        c._positions[tp] = 0
        c._fetch_positions[tp] = 6
    c._buffer.extend([raw(TP0, 0, 3), raw(TP1, 0, 3), raw(TP0, 3, 3), raw(TP1, 3, 3)])


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    c = Consumer(f"tcp://127.0.0.1:{free_port()}")
    try:
        fill(c)
        yield c
    finally:
        c.close()


def offsets(records: Iterable[Record]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


def read(consumer: Consumer, how: str, max_records: int = 1_000) -> list[tuple[int, int]]:
    if how == "poll":
        return offsets(consumer.poll(timeout_ms=0, max_records=max_records))
    if how == "poll_batches":
        return [(b.partition, b.base_offset + i) for b in consumer.poll_batches(timeout_ms=0, max_records=max_records)
                for i in range(len(b))]
    header = batch_format.read_header
    return [(b.partition, header(b.buf).base_offset + i) for b in consumer.poll_raw_batches(timeout_ms=0)
            for i in range(b.skip, header(b.buf).record_count)]


@pytest.mark.parametrize("how", ["poll", "poll_batches", "poll_raw_batches"])
def test_buffered_records_of_a_paused_partition_wait_and_come_back_in_order(consumer: Consumer, how: str) -> None:
    consumer.pause(TP0)
    assert consumer.paused() == {TP0}
    assert read(consumer, how) == [(1, i) for i in range(6)]
    assert read(consumer, how) == []  # held, not handed out
    assert consumer.position(TP0) == 0 and consumer._fetch_positions[TP0] == 6  # nothing moved, nothing lost
    consumer.resume([TP0])
    assert consumer.paused() == set()
    assert read(consumer, how) == [(0, i) for i in range(6)]
    assert consumer.position(TP0) == 6


def test_a_partly_taken_batch_waits_whole_and_resumes_where_it_was_cut(consumer: Consumer) -> None:
    assert read(consumer, "poll", max_records=2) == [(0, 0), (0, 1)]
    consumer.pause((TOPIC, 0))
    assert read(consumer, "poll") == [(1, i) for i in range(6)]
    assert consumer.position(TP0) == 2
    consumer.resume((TOPIC, 0))
    assert read(consumer, "poll") == [(0, i) for i in range(2, 6)]


def test_arguments_unassigned_partitions_and_paused_is_a_copy(consumer: Consumer) -> None:
    unassigned = TopicPartition(TOPIC, 5)
    with pytest.raises(errors.InvalidRequestError, match="t/5: it is not assigned"):
        consumer.pause([TP0, unassigned])
    assert consumer.paused() == set()  # checked whole first: nothing paused
    with pytest.raises(errors.InvalidRequestError, match="not assigned"):
        consumer.resume(unassigned)  # Kafka's resume() of an unassigned one throws too
    with pytest.raises(TypeError):
        consumer.pause(TOPIC)  # type: ignore[arg-type]
    consumer.pause((TP0, TP1))  # a tuple of two partitions, not a (topic, partition)
    assert consumer.paused() == {TP0, TP1}
    consumer.resume(tp for tp in [TP0, TP1])
    assert consumer.paused() == set()
    consumer.pause(tp for tp in [TP0, TP1])
    consumer.pause(TP0)  # again: nothing changes
    copy = consumer.paused()
    copy.clear()
    assert consumer.paused() == {TP0, TP1}
    consumer.resume([])
    consumer.resume([(TOPIC, 1)])
    consumer.resume(TP1)  # not paused: nothing happens
    assert consumer.paused() == {TP0}


def test_paused_partitions_are_left_out_of_the_fetch_plan_and_the_fetch_requests(consumer: Consumer) -> None:
    consumer._meta = FakeMetadata(led=True)  # type: ignore[assignment]
    consumer._buffer.clear()
    sent: list[list[tuple[int, int]]] = []

    def send(address: str, frames: list[bytes], **_: Any) -> None:
        message = apis.decode_request(frames)
        assert message.header.api_key == ApiKey.FETCH
        sent.append([(p["partition"], p["fetch_offset"]) for p in message.body["partitions"]])

    consumer._conns.send = send  # type: ignore[method-assign]
    leaders = consumer._fetch_plan()[0]
    assert consumer._fetch_plan()[0] is leaders  # made once: polls at millions of records/s reuse it
    consumer.pause(TP1)
    leaders = consumer._fetch_plan()[0]
    assert leaders == {NODE: [TP0]} and consumer._fetch_plan()[0] is leaders
    consumer._send_fetches()
    assert sent == [[(0, 6)]]
    consumer._in_flight.clear()
    consumer._busy_nodes.clear()
    consumer.pause(TP0)
    assert consumer._fetch_plan()[0] == {}
    consumer._send_fetches()
    assert len(sent) == 1  # everything paused: nothing asked
    consumer.resume([TP0, TP1])
    assert consumer._fetch_plan()[0] == {NODE: [TP0, TP1]}
    consumer._send_fetches()
    assert sorted(sent[1]) == [(0, 6), (1, 6)]
    consumer._in_flight.clear()


def test_an_answer_for_a_partition_paused_while_its_fetch_was_out_is_dropped(consumer: Consumer) -> None:
    consumer.pause(TP0)
    frames = [raw(TP0, 6, 2).buf, raw(TP1, 6, 2).buf]
    results = [{"topic": TOPIC, "partition": p, "batch_count": 1, "error": 0, "high_watermark": 8} for p in (0, 1)]
    message = apis.Message(None, {"partitions": results}, frames)  # type: ignore[arg-type]
    consumer._apply_fetch(message, {TP0: 6, TP1: 6})
    # The fetch position of the paused one stays at the end of what it has: the fetch after
    # resume() asks for offset 6 again, so nothing is skipped or read twice.
    assert consumer._fetch_positions == {TP0: 6, TP1: 8}
    assert read(consumer, "poll") == [(1, i) for i in range(8)]
    consumer.resume(TP0)
    assert read(consumer, "poll") == [(0, i) for i in range(6)]


def test_seek_while_paused_takes_effect_on_resume(consumer: Consumer) -> None:
    consumer.pause(TP0)
    consumer.seek(TP0, 4)
    assert consumer.paused() == {TP0} and consumer.position(TP0) == 4
    assert read(consumer, "poll") == [(1, i) for i in range(6)]
    consumer.resume(TP0)
    assert read(consumer, "poll") == []  # what was parked was from before the seek: dropped
    assert consumer._fetch_positions[TP0] == 4  # fetched again from the new position


def test_a_partition_that_leaves_the_assignment_is_no_longer_paused(consumer: Consumer) -> None:
    consumer.pause([TP0, TP1])
    consumer._drop([TP0])  # the group revoked it (or it was lost)
    assert consumer.paused() == {TP1}
    assert TP0 not in consumer._parked
    consumer._assign([TP1, TP0], refresh=False)  # and gave it back
    assert consumer.paused() == {TP1}  # still assigned throughout: still paused
    consumer._positions[TP0] = 0
    consumer._buffer.append(raw(TP0, 0, 2))
    assert read(consumer, "poll") == [(0, 0), (0, 1)]
    consumer.assign([TP0])
    assert consumer.paused() == set()
    assert consumer._parked == {}


def test_an_iteration_stops_a_partition_paused_inside_the_loop(consumer: Consumer) -> None:
    hand_out = consumer.poll_for_hand_out(0)
    got: list[tuple[int, int]] = []
    for record in consumer._hand_out(hand_out):
        got.append((record.partition, record.offset))
        if record.partition == 0:
            consumer.pause(TP0)  # e.g. its downstream is full
    assert got == [(0, 0), *[(1, i) for i in range(6)]]
    # The record being handled when it paused is done; the next one is where it resumes.
    assert consumer.position(TP0) == 1 and consumer.position(TP1) == 6
    assert read(consumer, "poll") == []  # still paused; the partition is read again from 1
    assert consumer._fetch_positions[TP0] == 1
    consumer.resume(TP0)
    consumer._buffer.append(RawBatch(TOPIC, 0, raw(TP0, 0, 6).buf, 1))  # what the fetch from 1 brings
    assert read(consumer, "poll") == [(0, i) for i in range(1, 6)]


def test_with_a_tag_filter_paused_records_and_skip_markers_wait_for_resume(consumer: Consumer) -> None:
    # With a tag filter a partition's buffer also holds markers that move its position past
    # batches the node left out: they wait with its records, so its position stays put.
    consumer.set_tag_filter("paid")
    consumer._buffer.clear()
    consumer._buffer.extend([raw(TP0, 0, 2, ["paid"]), raw(TP1, 0, 2, ["paid"]), _position_marker(TP0, 10),
                             raw(TP1, 2, 2, ["refunded"])])
    consumer.pause(TP0)
    assert read(consumer, "poll") == [(1, 0), (1, 1)]
    assert consumer.position(TP0) == 0 and consumer.position(TP1) == 4
    consumer.resume(TP0)
    assert read(consumer, "poll") == [(0, 0), (0, 1)]
    assert consumer.position(TP0) == 10


def test_the_asyncio_consumer_pauses_on_its_worker_and_its_async_for_stops_at_once() -> None:
    async def run() -> None:
        async with await AsyncConsumer.create(f"tcp://127.0.0.1:{free_port()}", poll_timeout_ms=0) as ac:
            await ac._call(fill)
            with pytest.raises(errors.InvalidRequestError, match="not assigned"):
                await ac.pause(TopicPartition(TOPIC, 5))
            got: list[tuple[int, int]] = []
            async for record in ac:
                got.append((record.partition, record.offset))
                if record.partition == 0:
                    await ac.pause(TP0)
                if len(got) == 7:
                    break
            assert got == [(0, 0), *[(1, i) for i in range(6)]]
            assert await ac.paused() == {TP0}
            assert await ac.position(TP0) == 1
            assert offsets(await ac.poll(timeout_ms=0)) == []
            await ac.resume([TP0])
            assert await ac.paused() == set()
            await ac._call(lambda c: c._buffer.append(RawBatch(TOPIC, 0, raw(TP0, 0, 6).buf, 1)))
            assert offsets(await ac.poll(timeout_ms=0)) == [(0, i) for i in range(1, 6)]

    asyncio.run(run())
