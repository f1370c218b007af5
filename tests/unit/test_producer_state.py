"""Idempotence rules, fed events, no I/O."""

from __future__ import annotations

import pytest

from fabric import errors
from nodes.producer_state import APPEND, DUPLICATE, ProducerStates


def test_sequence_rules() -> None:
    s = ProducerStates()
    assert s.check(7, 0, 0, 10) == (APPEND, -1)
    s.record(7, 0, 0, 10, base_offset=100)
    assert s.check(7, 0, 10, 5) == (APPEND, -1)
    s.record(7, 0, 10, 5, base_offset=110)
    assert s.check(7, 0, 0, 10) == (DUPLICATE, 100)
    assert s.check(7, 0, 10, 5) == (DUPLICATE, 110)
    with pytest.raises(errors.OutOfOrderSequenceError):
        s.check(7, 0, 20, 1)  # gap
    with pytest.raises(errors.OutOfOrderSequenceError):
        s.check(7, 0, 12, 10)  # partial overlap


def test_epochs_fence() -> None:
    s = ProducerStates()
    s.record(1, 3, 0, 5, base_offset=0)
    with pytest.raises(errors.InvalidProducerEpochError):
        s.check(1, 2, 5, 1)
    with pytest.raises(errors.OutOfOrderSequenceError):
        s.check(1, 4, 7, 1)
    assert s.check(1, 4, 0, 1) == (APPEND, -1)


def test_unknown_producer_and_non_idempotent_always_append() -> None:
    s = ProducerStates()
    assert s.check(-1, -1, -1, 3) == (APPEND, -1)
    assert s.check(42, 0, 900, 3) == (APPEND, -1)


def test_old_duplicate_outside_window_still_refused_to_write() -> None:
    s = ProducerStates()
    for i in range(20):
        s.record(5, 0, i * 10, 10, base_offset=i * 10)
    assert s.check(5, 0, 0, 10) == (DUPLICATE, -1)


def test_idle_producer_ids_expire_and_active_ones_stay() -> None:
    """Every short-lived producer takes a new id: without expiry each partition kept up to
    PRODUCERS_PER_PARTITION_MAX of them for good (Kafka forgets an id after
    producer.id.expiration.ms)."""
    now = [0.0]
    s = ProducerStates(clock=lambda: now[0], expiration_ms=60_000)
    s.record(1, 0, 0, 1, base_offset=0)  # a producer that keeps writing
    for pid in range(100, 1_100):  # a thousand that write once and go
        now[0] += 0.05
        s.record(pid, 0, 0, 1, base_offset=pid)
        s.record(1, 0, pid - 99, 1, base_offset=pid)
    assert len(s.producers) == 1_001  # 50 s: nothing idle for a minute yet
    for pid in range(2_000, 2_600):  # ten minutes of the same churn
        now[0] += 1.0
        s.record(pid, 0, 0, 1, base_offset=pid)
        s.record(1, 0, pid - 1_000, 1, base_offset=pid)
    assert len(s.producers) == 61  # the last minute's ids and the active one
    assert 100 not in s.producers and 1 in s.producers
    assert s.check(1, 0, 1_600, 1) == (APPEND, -1)  # the active one's sequence is still checked
    with pytest.raises(errors.OutOfOrderSequenceError):
        s.check(1, 0, 1_700, 1)
    assert s.check(100, 0, 5, 1) == (APPEND, -1)  # a forgotten id is appended as an unknown one


def test_recent_batches_are_bounded_per_producer() -> None:
    s = ProducerStates()
    for i in range(20):
        s.record(7, 0, i, 1, base_offset=100 + i)
    assert [offset for _, _, offset in s.producers[7].recent] == [115, 116, 117, 118, 119]
    assert s.check(7, 0, 19, 1) == (DUPLICATE, 119)
    assert s.check(7, 0, 10, 1) == (DUPLICATE, -1)  # older than the window: a duplicate, offset unknown
