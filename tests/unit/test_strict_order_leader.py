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

    def __call__(self, count: int) -> Grant:
        self.asked.append(count)
        return self.grants.pop(0)


def test_a_producer_batch_with_ids_is_refused() -> None:
    check_producer_batch(batch_format.read_header(producer_batch()), *TP)
    with pytest.raises(errors.InvalidGlobalIdError):
        check_producer_batch(batch_format.read_header(producer_batch(global_id_base=5)), *TP)
    with pytest.raises(errors.InvalidRequestError):
        check_producer_batch(batch_format.read_header(make_tick(1)), *TP)


def test_one_grant_is_split_over_a_request_in_order_and_the_crc_stays_valid() -> None:
    order = StrictOrder(Grants(Grant(1, 100, 5)))
    pool = order.grant(5)
    first, second = producer_batch(3), producer_batch(2)
    assert order.stamp(TP, first, 3, pool, lambda: None) == 100
    order.appended(TP, 100, 3, now_s=0.0)
    assert order.stamp(("ledger", 1), second, 2, pool, lambda: None) == 103
    for buf, base in ((first, 100), (second, 103)):
        header = batch_format.validate(buf, 1 << 20)  # CRC recomputed over the stamped ID
        assert header.global_id_base == base
    with pytest.raises(RuntimeError):
        GrantPool(Grant(1, 1, 1)).take(2)


def test_stale_epochs_and_regressions_are_refused() -> None:
    order = StrictOrder(Grants(Grant(3, 500, 10), Grant(2, 900, 10), Grant(3, 400, 10)))
    pool = order.grant(10)
    order.appended(TP, order.stamp(TP, producer_batch(10), 10, pool, lambda: None), 10, now_s=0.0)
    with pytest.raises(errors.StaleSequencerEpochError):
        order.grant(10)  # a deposed sequencer answering late
    pool = order.grant(10)  # current epoch, but below what the partition already holds
    with pytest.raises(errors.GlobalIdRegressionError):
        order.stamp(TP, producer_batch(10), 10, pool, lambda: None)


def test_the_last_id_comes_from_the_log_after_a_leader_change() -> None:
    stamped = producer_batch(4)
    batch_format.stamp_global_id(stamped, 1_000)
    assert last_global_id(bytes(stamped)) == 1_003
    assert last_global_id(None) == 0
    order = StrictOrder(Grants(Grant(1, 900, 1)))
    with pytest.raises(errors.GlobalIdRegressionError):
        order.stamp(TP, producer_batch(1), 1, order.grant(1), lambda: bytes(stamped))


def test_ticks_are_due_only_for_idle_partitions() -> None:
    order = StrictOrder(Grants(), tick_interval_ms=50)
    idle, busy = ("t", 0), ("t", 1)
    order.led(idle, now_s=10.0)
    order.led(busy, now_s=10.0)
    order.appended(busy, 7, 1, now_s=10.03)
    assert order.ticks_due([idle, busy], now_s=10.04) == [idle]
    assert order.ticks_due([idle, busy], now_s=10.08) == [idle, busy]
    tick = make_tick(1700000000000)
    header = batch_format.validate(tick, 1 << 20)
    assert header.attributes & batch_format.ATTRIBUTE_CONTROL and header.record_count == 1
