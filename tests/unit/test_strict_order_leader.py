"""A leader's strict-order rules (nodes/strict_order.py): forged IDs, stale grants, ticks."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.protocol import batch as batch_format
from fabric.protocol.sequencer import Grant
from nodes.strict_order import (
    GrantPool,
    StrictOrder,
    check_producer_batch,
    last_global_id,
    make_tick,
)

TP = ("ledger", 0)


def producer_batch(records: int = 3, global_id_base: int = -1) -> bytearray:
    return bytearray(batch_format.encode_batch([1] * records, [None] * records, [b"v"] * records,
                                               global_id_base=global_id_base))


class Grants:
    def __init__(self, *grants: Grant) -> None:
        self.grants = list(grants)
        self.asked: list[int] = []

    def __call__(self, count: int, kind: int) -> Grant:
        self.asked.append(count)
        return self.grants.pop(0)


def test_a_producer_batch_with_ids_is_refused() -> None:
    check_producer_batch(batch_format.read_header(producer_batch()), *TP)
    with pytest.raises(errors.InvalidGlobalIdError):
        check_producer_batch(batch_format.read_header(producer_batch(global_id_base=5)), *TP)
    with pytest.raises(errors.InvalidRequestError):  # the control bit: refused on every topic, before
        batch_format.check_produced(batch_format.read_header(make_tick(1)))


def test_one_grant_is_split_over_a_request_in_order_and_the_crc_stays_valid() -> None:
    order = StrictOrder(Grants(Grant(1, 100, 5)))
    pool = order.grant(5)
    first, second = producer_batch(3), producer_batch(2)
    assert order.stamp(TP, 0, first, 3, pool, lambda: None) == 100
    order.appended(TP, 0, 100, 3, now_s=0.0)
    assert order.stamp(("ledger", 1), 0, second, 2, pool, lambda: None) == 103
    for buf, base in ((first, 100), (second, 103)):
        header = batch_format.validate(buf, 1 << 20)  # CRC recomputed over the stamped ID
        assert header.global_id_base == base
    with pytest.raises(errors.SequencerNotAvailableError):  # retriable: the producer sends it again
        GrantPool(Grant(1, 1, 1)).take(2)


def test_stale_epochs_and_regressions_are_refused() -> None:
    order = StrictOrder(Grants(Grant(3, 500, 10), Grant(2, 900, 10), Grant(3, 400, 10)))
    pool = order.grant(10)
    order.appended(TP, 0, order.stamp(TP, 0, producer_batch(10), 10, pool, lambda: None), 10, now_s=0.0)
    with pytest.raises(errors.StaleSequencerEpochError):
        order.grant(10)  # a deposed sequencer answering late
    pool = order.grant(10)  # current epoch, but below what the partition already holds
    with pytest.raises(errors.GlobalIdRegressionError):
        order.stamp(TP, 0, producer_batch(10), 10, pool, lambda: None)


def test_the_last_id_comes_from_the_log_after_a_leader_change() -> None:
    stamped = producer_batch(4)
    batch_format.stamp_global_id(stamped, 1_000)
    assert last_global_id(bytes(stamped)) == 1_003
    assert last_global_id(None) == 0
    order = StrictOrder(Grants(Grant(1, 900, 1)))
    with pytest.raises(errors.GlobalIdRegressionError):
        order.stamp(TP, 3, producer_batch(1), 1, order.grant(1), lambda: bytes(stamped))


def test_ticks_only_for_idle_partitions_that_readers_wait_on() -> None:
    order = StrictOrder(Grants(Grant(1, 1, 0, records_end=40), Grant(1, 60, 0, records_end=60)))
    idle, busy = ("t", 0), ("t", 1)
    led = [(idle, 0.05), (busy, 0.05)]
    assert order.idle(led, now_s=10.0) == [idle, busy]  # just taken over: idle at once
    assert order.needs_tick(idle)  # last ID not known yet: tick to be safe
    order.appended(idle, 0, 5, 1, now_s=10.0)
    order.appended(busy, 0, 50, 1, now_s=10.03)
    assert order.idle(led, now_s=10.06) == [idle]
    assert order.idle(led, now_s=10.08) == [idle, busy]
    order.grant(0)  # records_end 40: a record with ID 39 exists somewhere
    assert order.needs_tick(idle) and not order.needs_tick(busy)
    order.grant(0)  # records_end 60: ID 59 is above busy's 50 too
    assert order.needs_tick(busy)
    order.appended(idle, 0, 61, 1, now_s=10.1)  # its tick took ID 61
    assert not order.needs_tick(idle)
    tick = make_tick(1700000000000)
    header = batch_format.validate(tick, 1 << 20)
    assert header.attributes & batch_format.ATTRIBUTE_CONTROL and header.record_count == 1


def test_a_new_leader_epoch_reads_the_last_id_from_the_log_again() -> None:
    order = StrictOrder(Grants(Grant(1, 10, 1), Grant(1, 20, 1)))
    order.appended(TP, 0, 50, 1, now_s=0.0)  # epoch 0 ended at 50 ...
    with pytest.raises(errors.GlobalIdRegressionError):
        order.stamp(TP, 0, producer_batch(1), 1, order.grant(1), lambda: None)
    # ... but epoch 1's log (truncated to what was committed) ends at 5.
    in_log = producer_batch(1)
    batch_format.stamp_global_id(in_log, 5)
    assert order.stamp(TP, 1, producer_batch(1), 1, order.grant(1), lambda: bytes(in_log)) == 20


def test_a_failed_grant_fails_fast_for_a_moment() -> None:
    now = [0.0]

    def source(count: int, kind: int) -> Grant:
        raise errors.SequencerNotAvailableError("down")

    order = StrictOrder(source, clock=lambda: now[0])
    with pytest.raises(errors.SequencerNotAvailableError):
        order.grant(1)
    order.grant_source = Grants(Grant(1, 1, 1))
    with pytest.raises(errors.SequencerNotAvailableError, match="a moment ago"):
        order.grant(1)
    now[0] += 1.0
    assert order.grant(1).grant == Grant(1, 1, 1)


def test_the_tick_does_not_walk_the_led_partitions_when_no_topic_is_strict_order() -> None:
    """It runs every 10 ms; a walk of every led partition was 6 % of an idle node at 2,000."""
    from collections.abc import Iterator
    from types import SimpleNamespace

    from fabric.zk import TopicConfig
    from nodes import strict_order

    class Untouchable(dict[tuple[str, int], None]):
        def __iter__(self) -> Iterator[tuple[str, int]]:
            raise AssertionError("walked every led partition")

    node = SimpleNamespace(configs={"t": TopicConfig(partitions=1)}, leaders=Untouchable({("t", 0): None}),
                           session_ok=lambda: True)
    strict_order.tick(node, 1.0)  # type: ignore[arg-type]
