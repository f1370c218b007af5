"""What a caller can get wrong costs that call, never the producer.

An audit found one bad argument ending a producer for good: the sender thread met a record
it could not encode (a 70,000-byte header name, a timestamp beyond i64, two records of one
batch more than 24.8 days apart, a float partition) or a callback that raised, died, and
every later send failed with "producer sender thread died". Now ``send`` refuses such
arguments before queueing anything, records too far apart in time go to separate
batches, and the sender survives a batch it cannot encode and a callback that raises.
Both send paths (compiled and pure Python) are compared record for record in
tests/unit/test_speedups.py, these cases included."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from fabric import errors
from fabric.local import free_port
from fabric.protocol import batch as batch_format
from sdk import bulk
from sdk.accumulator import BatchResult
from sdk.producer import _ACKS, _check_options, _ProducerCore

DAY_MS = 24 * 3600 * 1000


def offline_core(partition_counts: dict[str, int]) -> Iterator[_ProducerCore]:
    """A producer core whose batches stay queued: nobody listens at the bootstrap and the
    linger is far beyond the test. Idempotent with its id given (no INIT_PRODUCER_ID to
    wait for). ``partition_counts``: the topics it may send to, as if from METADATA."""
    made = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks="all", producer_id=7, linger_ms=600_000,
                         delivery_timeout_ms=600_000, request_timeout_ms=600_000, max_block_ms=100)
    with made._lock:
        made._partition_counts.update(partition_counts)
    try:
        yield made
    finally:
        close_from_another_thread(made)


def close_from_another_thread(made: _ProducerCore) -> None:
    """close(0) as a user's thread does (not the sender's own, which close() hands off)."""
    closer = threading.Thread(target=made.close, args=(0,))
    closer.start()
    closer.join()


@pytest.fixture(scope="module")
def core() -> Iterator[_ProducerCore]:
    yield from offline_core({"t": 2, "w": 1, "u": 2})  # one topic per test


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"topic": None}, TypeError),
    ({"topic": b"t"}, TypeError),
    ({"partition": 0.5}, TypeError),
    ({"partition": True}, TypeError),
    ({"timestamp_ms": 2**63}, ValueError),
    ({"timestamp_ms": -(2**63) - 1}, ValueError),
    ({"timestamp_ms": float("inf")}, ValueError),
    ({"timestamp_ms": float("nan")}, ValueError),
    ({"timestamp_ms": "soon"}, TypeError),
    ({"headers": [("n" * 70_000, b"v")]}, ValueError),
    ({"headers": [("\udc80", b"v")]}, ValueError),
    ({"headers": [(f"h{i}", None) for i in range(batch_format.HEADERS_PER_RECORD_MAX + 1)]}, ValueError),
    ({"tags": "paid"}, TypeError),
    ({"callback": 5}, TypeError),
])
def test_a_bad_argument_is_refused_and_queues_nothing(core: _ProducerCore, kwargs: dict[str, object],
                                                      error: type[Exception]) -> None:
    call: dict[str, object] = {"topic": "t", "value": b"v", **kwargs}
    topic = call.pop("topic")
    with core._lock:
        before = core._acc.buffered_bytes, sum(len(b.records) for q in core._acc.batches.values() for b in q)
    with pytest.raises(error):
        core.send(topic, **call)  # type: ignore[arg-type]
    with core._lock:
        after = core._acc.buffered_bytes, sum(len(b.records) for q in core._acc.batches.values() for b in q)
    assert after == before
    core.send("t", b"fine", partition=0)  # and the producer takes the next record


def test_records_further_apart_in_time_than_a_batch_holds_go_to_separate_batches(core: _ProducerCore) -> None:
    now_ms = 1_800_000_000_000
    for ts in (now_ms, now_ms + 1, now_ms - 30 * DAY_MS, now_ms + 2, now_ms + 25 * DAY_MS):
        core.send("w", b"v", partition=0, timestamp_ms=ts)
    with core._lock:
        batches = list(core._acc.batches[("w", 0)])
    assert [[r[0] for r in b.records] for b in batches] == [
        [now_ms, now_ms + 1], [now_ms - 30 * DAY_MS], [now_ms + 2], [now_ms + 25 * DAY_MS]]
    for b in batches:
        batch_format.decode_batch(core._encode(b))  # each one encodes


def test_a_batch_that_cannot_be_encoded_fails_alone_and_gives_its_sequences_back(core: _ProducerCore) -> None:
    """The guard behind the checks in send(): a record that slipped past them (put straight
    into the accumulator here) fails its batch with the reason; the sender goes on, and
    the idempotent sequence numbers stay without a gap."""
    with core._lock:
        bad_future, _, _ = core._acc.append("u", 1, 1, None, b"v", [("n" * 70_000, b"v")], 0.0)
        bad = core._acc.batches[("u", 1)].popleft()
        del core._acc.open[("u", 1)]
        good_future, _, _ = core._acc.append("u", 1, 1, None, b"v", None, 0.0)
        good = core._acc.batches[("u", 1)].popleft()
    core._send_request(None, "tcp://unused:1", [bad], 0.0)  # type: ignore[arg-type]  # never reaches the socket
    with pytest.raises(errors.InvalidRequestError, match="could not be encoded"):
        bad_future.result(0)
    assert core._next_sequence.get(("u", 1), 0) == 0 and not core._unacked.get(("u", 1))
    batch_format.decode_batch(core._encode(good))
    assert good.base_sequence == 0 and not good_future.done()


def test_a_callback_that_raises_does_not_stop_the_others() -> None:
    result = BatchResult("t", 0)
    seen: list[str] = []

    def bad() -> None:
        raise ZeroDivisionError("the caller's bug")

    result.on_done(bad)
    result.on_done(lambda: seen.append("after"))
    result.complete(5)  # on the sender thread in a producer: must not raise there
    assert seen == ["after"] and result.base_offset == 5


@pytest.mark.parametrize("name", [None, b"h"])
def test_send_batch_refuses_a_header_name_that_is_not_a_str(core: _ProducerCore, name: object) -> None:
    # A null in a Spark headers column arrives as None: a TypeError naming it, not an
    # AttributeError from inside the encoder.
    with pytest.raises(TypeError, match="header name must be a str"):
        core.send_batch("t", [b"a", b"b"], headers=[[(name, b"x")], None])  # type: ignore[list-item]


def test_send_batch_takes_headers_as_send_does(core: _ProducerCore) -> None:
    # A dict, str values and None values, as send() takes them; wrong shapes and value
    # types are a TypeError naming the header, not an unpacking error from inside.
    cols = bulk.Columns([b"a", b"b", b"c"], headers=[{"h": "1"}, None, [("n", None), ("b", bytearray(b"2"))]])
    assert cols.headers == [[("h", b"1")], None, [("n", None), ("b", b"2")]]
    for bad, text in (([[("h", 5)]], "header 'h' value"), ([{"h"}], "pairs"), ([[("h", b"1", b"2")]], "pairs")):
        with pytest.raises(TypeError, match=text):
            core.send_batch("t", [b"a"], headers=bad)  # type: ignore[arg-type]


def test_send_batch_that_finds_no_room_queues_nothing() -> None:
    # Room for the whole call or nothing: a BufferFullError after some of the call's
    # batches were queued would leave the caller unable to tell what to send again.
    made = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks="all", producer_id=7, linger_ms=600_000,
                         delivery_timeout_ms=600_000, request_timeout_ms=600_000, max_block_ms=100,
                         buffer_bytes_max=20_000, batch_bytes_max=1_000)
    try:
        with made._lock:
            made._partition_counts["t"] = 2
        made.send_batch("t", [b"x" * 100] * 100)  # about 12 KB: fits
        queued = made._acc.pending_records()
        with pytest.raises(errors.BufferFullError):
            made.send_batch("t", [b"y" * 100] * 100)  # room for some of its batches, not all
        assert made._acc.pending_records() == queued
    finally:
        closer = threading.Thread(target=made.close, args=(0,))
        closer.start()
        closer.join()


@pytest.mark.parametrize(("option", "error", "text"), [
    ({"acks": "ALLx"}, ValueError, "acks must be"), ({"acks": None}, ValueError, "acks must be"),
    ({"acks": True}, ValueError, "acks must be"), ({"linger_ms": None}, TypeError, "linger_ms"),
    ({"linger_ms": "5"}, TypeError, "linger_ms"), ({"linger_ms": -1}, ValueError, "linger_ms"),
    ({"linger_ms": float("nan")}, ValueError, "linger_ms"),
    ({"buffer_bytes_max": 1.5e6}, TypeError, "buffer_bytes_max"),  # the compiled path failed on send() before
    ({"request_timeout_ms": 0}, ValueError, "request_timeout_ms"), ({"retry_backoff_ms": -5}, ValueError, "retry"),
    ({"max_block_ms": -1}, ValueError, "max_block_ms"), ({"compression": 5}, TypeError, "compression"),
    ({"enable_idempotence": "yes"}, TypeError, "enable_idempotence"), ({"max_in_flight": 0}, ValueError, "with idempotence"),
    ({"max_in_flight": 2.0}, TypeError, "max_in_flight"), ({"batch_bytes_max": 0}, ValueError, "batch_bytes_max"),
])
def test_producer_options_are_checked_before_it_starts(option: dict[str, object], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        _ProducerCore(f"tcp://127.0.0.1:{free_port()}", **option)  # type: ignore[arg-type]


@pytest.mark.parametrize(("acks", "expected"), [("ALL", -1), ("all", -1), (-1, -1), ("-1", -1), ("1", 1), (0, 0)])
def test_acks_spellings(acks: int | str, expected: int) -> None:
    _check_options(acks=acks, linger_ms=0, compression="lz4", enable_idempotence=None)
    assert _ACKS[acks.lower() if isinstance(acks, str) else acks] == expected
