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
from sdk.accumulator import BatchResult
from sdk.producer import _ProducerCore

DAY_MS = 24 * 3600 * 1000


@pytest.fixture(scope="module")
def core() -> Iterator[_ProducerCore]:
    # Nobody listens at the bootstrap and the linger is far beyond the test: batches stay
    # queued. An idempotent producer with its id given (no INIT_PRODUCER_ID to wait for).
    made = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks="all", producer_id=7, linger_ms=600_000,
                         delivery_timeout_ms=600_000, request_timeout_ms=600_000, max_block_ms=100)
    with made._lock:
        made._partition_counts.update({"t": 2, "w": 1, "u": 2})  # one topic per test
    try:
        yield made
    finally:
        closer = threading.Thread(target=made.close, args=(0,))
        closer.start()
        closer.join()


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"topic": None}, TypeError),
    ({"topic": b"t"}, TypeError),
    ({"partition": 0.5}, TypeError),
    ({"partition": True}, TypeError),
    ({"timestamp_ms": 2**63}, ValueError),
    ({"timestamp_ms": -(2**63) - 1}, ValueError),
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
