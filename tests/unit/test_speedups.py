"""The compiled send (sdk/_speedups.pyx) and the pure-Python send side by side.

Two producers (nobody listening at their bootstrap, so nothing leaves them) get the same
seeded stream of sends: bytes and str values, keys, tombstones, headers, queue options,
explicit and out-of-range partitions, bad priorities, records big enough to close batches. One sends
through the compiled path, the other through ``_send_python``. Their accumulators must
then hold the same batches with the same records, the futures the same positions, the
errors the same types, and every batch must encode to the same bytes through the compiled
layout (``records_section``) as through ``encode_batch``. The integration
tests exercise the compiled path end to end (it is what ``Producer.send`` is when built);
``scripts/test.sh`` also runs the producer's integration tests with
``FABRIC_PURE_PYTHON=1``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fabric.local import free_port
from fabric.protocol.keyhash import partition_for_key
from sdk import accumulator
from sdk import producer as producer_module
from sdk.accumulator import (
    RECORD_OVERHEAD_BYTES,
    BatchResult,
    PythonProducerBatch,
    PythonRecordFuture,
    RecordMetadata,
)
from sdk.producer import _ProducerCore

speedups = pytest.importorskip("sdk._speedups", reason="the compiled path is not built (scripts/install.sh builds it)")

TOPICS = {"a": 3, "b": 1}
SENDS = 4_000


@pytest.fixture
def cores(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[_ProducerCore, _ProducerCore]]:
    """A producer core with the compiled send and one without. Under FABRIC_PURE_PYTHON=1
    the producer left the compiled path unbound: bind it here as the producer would."""
    if os.environ.get("FABRIC_PURE_PYTHON", "") != "1":
        assert producer_module.SPEEDUPS, "sdk._speedups is built but Producer.send does not use it"
    else:
        speedups.bind(_ProducerCore._send_python, partition_for_key, RECORD_OVERHEAD_BYTES)
        speedups.bind_accumulator(PythonRecordFuture, PythonProducerBatch)
        monkeypatch.setattr(accumulator, "ProducerBatch", speedups.ProducerBatch)
        monkeypatch.setattr(producer_module, "_new_lock", speedups.FastLock)
        monkeypatch.setattr(producer_module, "_fast_send", speedups.FastSend)
    made = []
    for _ in range(2):
        # linger and delivery timeouts far beyond the test: every batch stays in the accumulator
        core = _ProducerCore(f"tcp://127.0.0.1:{free_port()}", acks=1, linger_ms=600_000, batch_bytes_max=4096,
                             delivery_timeout_ms=600_000, request_timeout_ms=600_000, max_block_ms=100)
        with core._lock:
            core._partition_counts.update(TOPICS)
            core._message_bytes_max["b"] = 2048  # smaller than batch_bytes_max: its own batch limit
            core._acc.set_message_bytes_max("b", 2048)
            core._sticky_start = made[0]._sticky_start if made else core._sticky_start  # drawn once, shared
        made.append(core)
    try:
        yield made[0], made[1]
    finally:
        closers = [threading.Thread(target=core.close, args=(0,)) for core in made]  # each waits for its sender
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()


def _call(rng: random.Random) -> tuple[tuple[Any, ...], dict[str, Any]]:
    topic = rng.choice(["a", "a", "a", "b"])
    roll = rng.random()
    value: Any = rng.randbytes(rng.choice([0, 10, 100, 100, 900, 2100]))
    if roll < 0.05:
        value = None
    elif roll < 0.1:
        value = value.hex()
    key: Any = None
    if rng.random() < 0.3:
        key = rng.randbytes(rng.randint(0, 8))
        if rng.random() < 0.2:
            key = key.hex()
    kwargs: dict[str, Any] = {"timestamp_ms": 1_700_000_000_000 + rng.randint(0, 10_000)}
    if rng.random() < 0.05:
        kwargs["headers"] = {"h": b"v", "n": None}
    if rng.random() < 0.05:
        kwargs["partition"] = rng.randint(-1, TOPICS[topic])  # sometimes out of range
    if rng.random() < 0.02:
        kwargs["priority"] = rng.randint(0, 10)  # 10 is refused
    if rng.random() < 0.02:
        kwargs["dedup_id"] = f"d{rng.randint(0, 5)}"
    # Refused or set apart the same way by both: timestamps beyond an open batch's i32 window
    # (a batch of their own) or beyond i64, and arguments of the wrong type.
    if rng.random() < 0.03:
        kwargs["timestamp_ms"] += rng.choice([-1, 1]) * rng.randint(2**31 - 20_000, 2**31 + 20_000)
    if rng.random() < 0.005:
        kwargs["timestamp_ms"] = rng.choice([2**63, -(2**63) - 1, 2**63 - 1, -(2**63)])
    if rng.random() < 0.005:
        kwargs["partition"] = rng.choice([True, 0.5, "0"])
    if rng.random() < 0.005:
        kwargs["callback"] = 5
    if rng.random() < 0.005:
        topic = rng.choice([None, 5, b"a"])
    return (topic, value, key), kwargs


def _send(send: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        future = send(*args, **kwargs)
    except Exception as exc:  # the type is what is compared
        return type(exc).__name__
    return (future._index, future._timestamp, future._batch.topic, future._batch.partition)


def _contents(core: _ProducerCore) -> list[tuple[str, int, list[Any]]]:
    with core._lock:
        return [(b.topic, b.partition, list(b.records)) for q in core._acc.batches.values() for b in q]


def test_compiled_and_python_send_leave_the_same_records(cores: tuple[_ProducerCore, _ProducerCore],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, python = cores
    assert compiled._fast is not None and compiled.send == compiled._fast.send
    rng = random.Random(20261123)
    outcomes: list[tuple[Any, Any]] = []
    handed_over = 0  # calls the compiled send handed to the Python one

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal handed_over
        handed_over += 1
        return _ProducerCore._send_python(*args, **kwargs)

    speedups.bind(counted, partition_for_key, RECORD_OVERHEAD_BYTES)
    try:
        for _ in range(SENDS):
            args, kwargs = _call(rng)
            outcomes.append((_send(compiled.send, args, kwargs),
                             _send(lambda *a, **k: _ProducerCore._send_python(python, *a, **k), args, kwargs)))
    finally:
        speedups.bind(_ProducerCore._send_python, partition_for_key, RECORD_OVERHEAD_BYTES)
    assert handed_over < SENDS / 2  # most sends took the compiled path
    assert [a for a, _ in outcomes] == [b for _, b in outcomes]
    assert sum(isinstance(a, str) for a, _ in outcomes) > 10  # errors were compared too
    assert _contents(compiled) == _contents(python)
    assert len(_contents(compiled)) > 10  # batches were closed and new ones opened
    with compiled._lock, python._lock:
        assert compiled._sticky == python._sticky
        assert compiled._sticky_closed_bytes == python._sticky_closed_bytes
        assert [(t, b.partition, b.size_bytes) for t, b in compiled._sticky_batch.items()] == \
            [(t, b.partition, b.size_bytes) for t, b in python._sticky_batch.items()]
        assert compiled._acc.buffered_bytes == python._acc.buffered_bytes
        pairs = list(zip([b for q in compiled._acc.batches.values() for b in q],
                         [b for q in python._acc.batches.values() for b in q], strict=True))
    laid_out = 0
    for ours, theirs in pairs:
        assert ours.size_bytes == theirs.size_bytes
        laid_out += speedups.records_section(ours.records) is not None
        monkeypatch.setattr(producer_module, "_records_section", speedups.records_section)
        compiled_bytes = compiled._encode(ours)  # the compiled layout where it applies
        monkeypatch.setattr(producer_module, "_records_section", None)
        assert compiled_bytes == python._encode(theirs)  # identical wire bytes
        monkeypatch.undo()
    assert laid_out > 20  # batches without headers went through the compiled layout

    before = int(time.time() * 1000)
    future = compiled.send("a", b"now")  # no timestamp given: the wall clock, in ms
    assert before <= future._timestamp <= int(time.time() * 1000) + 1


def test_the_compiled_layout_is_encode_batchs_layout() -> None:
    """Random records (null keys and values, empty ones, timestamps out of order) laid out
    by ``records_section`` and by ``encode_batch``: the same batch bytes. What the compiled
    layout does not take (headers, a timestamp delta beyond i32, a non-bytes value) it
    hands back as None for the Python encoder."""
    from fabric.protocol import batch as batch_format

    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 300)
        records = [(1_700_000_000_000 + rng.randint(-5_000, 5_000),
                    None if rng.random() < 0.5 else rng.randbytes(rng.randint(0, 9)),
                    None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 200)), None) for _ in range(n)]
        timestamps, keys, values, _ = (list(column) for column in zip(*records, strict=True))
        want = batch_format.encode_batch(timestamps, keys, values, codec=batch_format.CODEC_NONE)
        laid = speedups.records_section(records)
        assert laid is not None
        section, first_ts, max_ts = laid
        assert batch_format.frame_batch(batch_format.compress_records(section, batch_format.CODEC_NONE),
                                        n, first_ts, max_ts) == want
    assert speedups.records_section([]) is None
    assert speedups.records_section([(1, None, b"x", [("h", b"v")])]) is None
    assert speedups.records_section([(0, None, b"x", None), (2**40, None, b"x", None)]) is None
    assert speedups.records_section([(2**70, None, b"x", None)]) is None
    assert speedups.records_section([(0, None, bytearray(b"x"), None)]) is None


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_the_compiled_twins_behave_as_the_python_classes(compiled: bool) -> None:
    """``RecordFuture`` and ``ProducerBatch`` compiled and in Python: the same attributes,
    the same answers before and after their batch resolves, callbacks run the same way."""
    future_type, batch_type = ((speedups.RecordFuture, speedups.ProducerBatch) if compiled
                               else (PythonRecordFuture, PythonProducerBatch))
    batch = batch_type("t", 2, 5.0, 7)
    assert {name: getattr(batch, name) for name in PythonProducerBatch.__slots__ if name != "result"} == {
        "attempts": 0, "base_sequence": -1, "created_s": 5.0, "encoded": None, "first_sent_s": -1.0,
        "has_headers": False, "last_error": None, "order": 7, "partition": 2, "prepared": None,
        "prepared_count": 0, "records": [], "retry_after_s": 0.0, "sealed": False, "size_bytes": 0,
        "slots": 1, "topic": "t"}
    assert type(batch.result) is BatchResult and (batch.result.topic, batch.result.partition) == ("t", 2)
    batch.records += [(1, None, b"a", None), (2, b"k", b"b", None)]
    assert batch.record_count == 2 and batch.columns() == ([1, 2], [None, b"k"], [b"a", b"b"], None)
    batch.prepared, batch.prepared_count = (b"", 1, None), 5
    assert batch.record_count == 5

    seen: list[Any] = []
    ok = future_type(batch.result, 1, 99)
    ok.add_callback(lambda meta, exc: seen.append((meta, exc)))
    assert not ok.done()
    with pytest.raises(TimeoutError):
        ok.result(0.01)
    with pytest.raises(TimeoutError):
        ok.exception(0.01)
    batch.result.complete(40)
    ok.add_callback(lambda meta, exc: seen.append((meta, exc)))  # after: runs at once
    assert ok.done() and ok.exception(0) is None
    assert ok.result(0) == RecordMetadata("t", 2, 41, 99)
    assert seen == [(RecordMetadata("t", 2, 41, 99), None)] * 2
    assert (ok._batch, ok._index, ok._timestamp) == (batch.result, 1, 99)

    failed = BatchResult("t", 0)
    bad = future_type(failed, 0, 1)
    errors_seen: list[Any] = []
    bad.add_callback(lambda meta, exc: errors_seen.append((meta, type(exc))))
    failed.complete(-1, ValueError("no"))
    with pytest.raises(ValueError):
        bad.result(0)
    assert isinstance(bad.exception(0), ValueError) and errors_seen == [(None, ValueError)]
    unacked = BatchResult("t", 0)
    unacked.complete(-1)  # acks=0: no offset
    assert future_type(unacked, 3, 1).result(0).offset == -1


def test_the_fast_lock_is_a_lock() -> None:
    """``FastLock`` has threading.Lock's interface, and a Condition works over it."""
    lock = speedups.FastLock()
    assert not lock.locked()
    assert lock.acquire() and lock.locked()
    assert not lock.acquire(False)
    assert not lock.acquire(timeout=0.01)
    held_elsewhere: list[bool] = []
    thread = threading.Thread(target=lambda: held_elsewhere.append(lock.acquire(timeout=0.01)))
    thread.start()
    thread.join()
    assert held_elsewhere == [False]
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(False, 1.0)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-2)
    with lock:
        assert lock.locked()
    assert not lock.locked()

    condition = threading.Condition(lock)
    ready: list[int] = []

    def waiter() -> None:
        with condition:
            condition.wait_for(lambda: bool(ready), timeout=10)
            ready.append(2)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.05)
    with condition:
        ready.append(1)
        condition.notify_all()
    thread.join(10)
    assert ready == [1, 2]
    with pytest.raises(RuntimeError):
        condition.wait(0.01)  # not held: as with a Lock
