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
