"""An ordered reader whose records wait for the watermark asks again where partitions are led."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fabric import errors
from sdk.ordered import OrderedConsumer, OrderedMerge

STALL_RECHECK_S = 1.0  # sdk.ordered.STALL_RECHECK_S


class FakeConsumer:
    """Fetches nothing; counts the map re-reads (``fail``: no node answers them)."""

    def __init__(self) -> None:
        self.refreshes: list[list[str]] = []
        self.fail = False

    def poll_raw_batches(self, timeout_ms: int) -> list[Any]:
        return []

    @contextlib.contextmanager
    def _within(self, seconds: float) -> Iterator[None]:
        assert 0 < seconds <= 1.0  # within the poll's time
        yield

    def _refresh(self, topics: list[str]) -> None:
        self.refreshes.append(topics)
        if self.fail:
            raise errors.NoBrokersAvailableError("no node answered a metadata request")


def reader(now: list[float]) -> Any:
    """An OrderedConsumer without sockets: a fake consumer that fetches nothing."""
    ordered = OrderedConsumer.__new__(OrderedConsumer)
    ordered.topic = "ledger"
    ordered.merge = OrderedMerge([0, 1], clock=lambda: now[0])
    ordered.cut_id = 0
    ordered._cut_offsets = {}
    ordered._rechecked_at = float("-inf")
    ordered.consumer = FakeConsumer()
    return ordered


def test_records_waiting_on_a_silent_partition_make_the_consumer_reread_the_map() -> None:
    """A leader cut off from ZooKeeper alone answers every fetch, with nothing new, until it
    is healed; the consumer re-read the map only for unanswered fetches, so the whole order
    stalled until the heal while a new leader took the partition's writes (a fault hunt)."""
    now = [100.0]
    ordered = reader(now)
    ordered.merge.push(1, 7, 0, "record")  # partition 0 has said nothing: W stays 0
    assert ordered.poll(timeout_ms=1) == []
    assert ordered.consumer.refreshes == []  # waiting less than STALL_RECHECK_S: nothing yet
    now[0] += STALL_RECHECK_S
    assert ordered.poll(timeout_ms=1) == []
    assert ordered.consumer.refreshes == [["ledger"]]
    now[0] += STALL_RECHECK_S / 2
    ordered.poll(timeout_ms=1)
    assert len(ordered.consumer.refreshes) == 1  # at most once per interval
    now[0] += STALL_RECHECK_S / 2
    ordered.consumer.fail = True  # no node answers (ZooKeeper away on every node): polling goes on
    assert ordered.poll(timeout_ms=1) == []
    assert len(ordered.consumer.refreshes) == 2


def test_an_idle_topic_does_not_reread_the_map() -> None:
    now = [100.0]
    ordered = reader(now)  # nothing waits: no stall, however long
    now[0] += 10 * STALL_RECHECK_S
    assert ordered.poll(timeout_ms=1) == []
    assert ordered.consumer.refreshes == []
