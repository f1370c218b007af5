"""Producer batching with an injected clock: no sockets, no sleeps."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.limits import BATCH_HEADER_BYTES
from sdk.accumulator import RecordAccumulator


def make(linger_ms: float = 10, batch_bytes_max: int = 1000, buffer_bytes_max: int = 10_000) -> RecordAccumulator:
    return RecordAccumulator(batch_bytes_max=batch_bytes_max, linger_ms=linger_ms, buffer_bytes_max=buffer_bytes_max)


def test_linger_holds_a_batch_until_it_expires() -> None:
    acc = make(linger_ms=10)
    acc.append("t", 0, 1, None, b"x" * 10, None, now_s=100.0)
    assert acc.ready(100.005, {}) == []
    assert acc.next_deadline_s({}) == pytest.approx(100.010)
    [batch] = acc.ready(100.010, {})
    assert batch.record_count == 1 and batch.sealed


def test_full_batch_is_ready_at_once_and_next_record_opens_a_new_one() -> None:
    acc = make(linger_ms=1_000, batch_bytes_max=100)
    futures = []
    full = False
    for i in range(10):
        future, full, _created = acc.append("t", 0, i, None, b"y" * 20, None, now_s=0.0)
        futures.append(future)
        if full:
            break
    assert full
    acc.append("t", 0, 99, None, b"z", None, now_s=0.0)
    ready = acc.ready(0.0, {})
    assert len(ready) == 1 and ready[0].sealed
    assert acc.pending_batches() == 1  # the new open batch still lingers


def test_in_flight_partition_waits_to_keep_order() -> None:
    acc = make(linger_ms=0)
    acc.append("t", 0, 1, None, b"a", None, now_s=0.0)
    assert acc.ready(1.0, {("t", 0): 1}) == []
    assert len(acc.ready(1.0, {})) == 1


def test_flush_makes_lingering_batches_ready() -> None:
    acc = make(linger_ms=60_000)
    acc.append("t", 0, 1, None, b"a", None, now_s=0.0)
    acc.append("t", 1, 1, None, b"b", None, now_s=0.0)
    assert acc.ready(0.0, {}) == []
    acc.flushing = True
    assert {b.partition for b in acc.ready(0.0, {})} == {0, 1}


def test_requeue_goes_first_and_respects_backoff() -> None:
    acc = make(linger_ms=0)
    acc.append("t", 0, 1, None, b"first", None, now_s=0.0)
    [first] = acc.ready(0.0, {})
    acc.append("t", 0, 2, None, b"second", None, now_s=0.0)
    first.retry_after_s = 5.0
    acc.requeue(first)
    assert acc.ready(1.0, {}) == []  # head is backing off; nothing overtakes it
    [again] = acc.ready(5.0, {})
    assert again is first


def test_buffer_accounting_and_release() -> None:
    acc = make(linger_ms=0, batch_bytes_max=100, buffer_bytes_max=200)
    acc.append("t", 0, 1, None, b"x" * 80, None, now_s=0.0)
    acc.append("t", 1, 1, None, b"x" * 80, None, now_s=0.0)
    assert not acc.has_room(94)
    for batch in acc.ready(0.0, {}):
        acc.release(batch)
    assert acc.buffered_bytes == 0 and acc.has_room(94)


def test_record_larger_than_a_batch_gets_a_batch_of_its_own() -> None:
    # batch_bytes_max is a target; the topic's message_bytes_max (checked by the producer)
    # is the limit on one record.
    acc = make(linger_ms=1_000, batch_bytes_max=100, buffer_bytes_max=1_000)
    acc.append("t", 0, 1, None, b"small", None, now_s=0.0)
    _, full, created = acc.append("t", 0, 2, None, b"x" * 200, None, now_s=0.0)
    assert full and created
    acc.append("t", 0, 3, None, b"after", None, now_s=0.0)
    ready = acc.ready(0.0, {})
    assert [b.records[0][2] for b in ready] == [b"small"]  # the head batch went first
    big = acc.batches[("t", 0)][0]
    assert big.sealed and [r[2] for r in big.records] == [b"x" * 200]


def test_expire_takes_every_old_batch_sent_or_not() -> None:
    acc = make(linger_ms=60_000, batch_bytes_max=100)
    acc.append("t", 0, 1, None, b"x" * 80, None, now_s=0.0)  # sealed soon: a second batch opens
    acc.append("t", 0, 2, None, b"y" * 80, None, now_s=5.0)
    acc.append("t", 1, 3, None, b"z", None, now_s=9.0)
    assert acc.pending_records() == 3
    expired = acc.expire(10.0, 6.0)
    assert [b.records[0][2] for b in expired] == [b"x" * 80]
    expired = acc.expire(12.0, 6.0)
    assert [b.records[0][2] for b in expired] == [b"y" * 80]
    assert ("t", 0) not in acc.open and acc.pending_records() == 1
    acc.append("t", 0, 4, None, b"new", None, now_s=12.0)  # the partition takes records again
    assert acc.pending_records() == 2


def test_futures_resolve_to_offsets_within_the_batch() -> None:
    acc = make(linger_ms=0)
    f1, _, _ = acc.append("t", 3, 10, b"k", b"a", None, now_s=0.0)
    f2, _, _ = acc.append("t", 3, 11, b"k", b"b", None, now_s=0.0)
    [batch] = acc.ready(0.0, {})
    seen = []
    f2.add_callback(lambda meta, exc: seen.append((meta, exc)))
    batch.result.complete(500)
    assert f1.result(0).offset == 500 and f2.result(0).offset == 501
    assert seen[0][0].offset == 501 and seen[0][1] is None


def test_failed_batch_raises_from_every_future() -> None:
    acc = make(linger_ms=0)
    f, _, _ = acc.append("t", 0, 1, None, b"a", None, now_s=0.0)
    acc.abort_all(errors.ClientClosedError("closed"))
    with pytest.raises(errors.ClientClosedError):
        f.result(0)


def test_contradictory_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        make(batch_bytes_max=1000, buffer_bytes_max=10)
    with pytest.raises(ValueError):
        make(linger_ms=-1)


def test_pipelining_sends_up_to_max_in_flight_per_partition() -> None:
    acc = make(linger_ms=0, batch_bytes_max=100)
    for i in range(40):
        acc.append("t", 0, i, None, b"v" * 30, None, now_s=0.0)
    first = acc.ready(0.0, {}, max_in_flight=5)
    assert len(first) == 5 and [b.order for b in first] == sorted(b.order for b in first)
    assert acc.ready(0.0, {("t", 0): 5}, max_in_flight=5) == []
    assert len(acc.ready(0.0, {("t", 0): 3}, max_in_flight=5)) == 2


def test_a_partition_that_cannot_send_sets_no_deadline() -> None:
    # Its linger ended long ago, but its slots are all in flight: only an answer frees it,
    # and an answer wakes the sender anyway. A past deadline here made the sender spin.
    acc = make(linger_ms=0)
    acc.append("t", 0, 1, None, b"a", None, now_s=0.0)
    acc.append("t", 1, 1, None, b"b", None, now_s=2.0)
    assert acc.next_deadline_s({("t", 0): 5, ("t", 1): 5}, max_in_flight=5) is None
    assert acc.next_deadline_s({("t", 0): 5}, max_in_flight=5) == pytest.approx(2.0)  # partition 1 may send
    assert acc.next_deadline_s({("t", 0): 4}, max_in_flight=5) == pytest.approx(0.0)
    [batch] = acc.ready(1.0, {("t", 1): 5}, max_in_flight=5)
    batch.attempts, batch.retry_after_s = 1, 3.0
    acc.requeue(batch)  # a resend waits until nothing of its partition is in flight
    assert acc.next_deadline_s({("t", 0): 1, ("t", 1): 5}, max_in_flight=5) is None
    assert acc.next_deadline_s({("t", 1): 5}, max_in_flight=5) == pytest.approx(3.0)


def test_failed_pipelined_batches_are_resent_in_order_and_alone() -> None:
    acc = make(linger_ms=0, batch_bytes_max=100)
    for i in range(20):
        acc.append("t", 0, i, None, b"v" * 30, None, now_s=0.0)
    sent = acc.ready(0.0, {}, max_in_flight=3)
    for batch in sent:
        batch.attempts = 1
    for batch in reversed(sent):  # answers may fail in any order
        acc.requeue(batch)
    assert acc.ready(1.0, {("t", 0): 1}, max_in_flight=3) == []  # waits for what is still in flight
    [again] = acc.ready(1.0, {}, max_in_flight=3)
    assert again is sent[0]  # the earliest first, alone
    again.attempts = 2
    [second] = acc.ready(1.0, {}, max_in_flight=3)
    assert second is sent[1]


def test_requests_are_cut_by_batch_count_and_bytes() -> None:
    from sdk.accumulator import ProducerBatch
    from sdk.producer import REQUEST_BATCHES_MAX, REQUEST_BYTES_MAX, _request_groups

    def batch(size: int) -> ProducerBatch:
        b = ProducerBatch("t", 0, 0.0)
        b.size_bytes = size
        return b

    big = [batch(REQUEST_BYTES_MAX // 4) for _ in range(10)]
    assert [len(g) for g in _request_groups(big)] == [4, 4, 2]
    small = [batch(10) for _ in range(REQUEST_BATCHES_MAX + 1)]
    assert [len(g) for g in _request_groups(small)] == [REQUEST_BATCHES_MAX, 1]
    huge = [batch(REQUEST_BYTES_MAX * 2), batch(10)]
    assert [len(g) for g in _request_groups(huge)] == [1, 1]  # a batch larger than the cap goes alone


def test_a_topic_with_a_smaller_message_bytes_max_gets_smaller_batches() -> None:
    """A batch frame is the header and at most the records bytes (a batch lz4 did not
    shrink goes as it is), so a topic whose message_bytes_max leaves less room than
    batch_bytes_max closes its batches there; other topics keep batch_bytes_max."""
    acc = RecordAccumulator(batch_bytes_max=100_000, linger_ms=1000, buffer_bytes_max=10_000_000)
    acc.set_message_bytes_max("small", 4096)
    acc.set_message_bytes_max("big", 8 << 20)
    assert acc.limit("small") == 4096 - BATCH_HEADER_BYTES and acc.limit("big") == 100_000
    for topic in ("small", "big"):
        for i in range(500):
            acc.append(topic, 0, i, None, b"x" * 86, None, 0.0)  # 100 bytes a record
    small = list(acc.batches[("small", 0)])
    assert len(small) == 500 * 100 // (4096 - BATCH_HEADER_BYTES) + 1
    assert all(b.size_bytes <= 4096 - BATCH_HEADER_BYTES for b in small)
    assert len(acc.batches[("big", 0)]) == 1
    acc.set_message_bytes_max("small", 8 << 20)  # raised: back to batch_bytes_max
    assert acc.limit("small") == 100_000
