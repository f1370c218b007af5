"""Per-partition batching for the producer: pure logic with the clock passed in.

``RecordAccumulator`` keeps a deque of open and sealed batches per partition and decides
which are ready to send (full, lingered long enough, or being flushed). It does no I/O
and takes ``now`` (monotonic seconds) as an argument, so tests drive it with a fake clock.
Thread safety is the caller's: the producer holds one lock around every call.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fabric.limits import BATCH_HEADER_BYTES
from fabric.protocol import batch as batch_format

log = logging.getLogger("fabric.producer")

RECORD_OVERHEAD_BYTES = 14  # the columnar per-record arrays (3 x i32 + u16)
Headers = list[tuple[str, bytes | None]]
# A record's timestamp as an i32 delta from its batch's first (batch_format); shared with sdk/producer.py.
DELTA_MS_MIN, DELTA_MS_MAX = batch_format.TIMESTAMP_DELTA_MS_MIN, batch_format.TIMESTAMP_DELTA_MS_MAX


def as_bytes(value: Any, what: str) -> bytes | None:
    """A key, value or header value as the records section carries it: bytes (str as
    UTF-8, bytearray and memoryview copied) or None; anything else is a TypeError."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be bytes, str or None, not {type(value).__name__}")


def normalize_headers(headers: Any) -> Headers:
    """One record's headers, a dict or a list of (name, value) pairs with bytes, str or None
    values, as checked (name, bytes) pairs; anything else is refused, not guessed at
    (``["ab", "cd"]`` would otherwise unpack into the headers a=b and c=d)."""
    items = headers.items() if isinstance(headers, dict) else headers
    out: Headers = []
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise TypeError(
                f"headers must be a dict or a list of (str, bytes) pairs; got the item {item!r:.80}"
            )
        if not isinstance(item[0], str):  # None (a null in a Spark headers column), bytes...
            raise TypeError(f"header name must be a str, not {type(item[0]).__name__} {item[0]!r:.40}")
        out.append((item[0], as_bytes(item[1], f"header {item[0]!r} value")))
    check_headers(out)
    return out


def check_headers(headers: Headers) -> None:
    """One record's headers as the records section can carry them (at most a u16 of them,
    names of UTF-8 with a u16 length), else ValueError: refused before the record is queued."""
    if len(headers) > batch_format.HEADERS_PER_RECORD_MAX:
        raise ValueError(f"{len(headers)} headers: a record carries at most {batch_format.HEADERS_PER_RECORD_MAX}")
    for name, _value in headers:
        if not isinstance(name, str):  # None (a null in a Spark headers column), bytes...
            raise TypeError(f"header name must be a str, not {type(name).__name__} {name!r:.40}")
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"header name {name[:40]!r} is not valid UTF-8 (a lone surrogate?)") from None
        if size > batch_format.HEADER_NAME_BYTES_MAX:
            raise ValueError(f"header name of {size} bytes: at most {batch_format.HEADER_NAME_BYTES_MAX}")


def headers_bytes(headers: Headers) -> int:
    """Bytes the headers of one record take in the records section (u16 + name + i32 + value)."""
    return sum(6 + len(n.encode("utf-8")) + (len(v) if v is not None else 0) for n, v in headers)


def run_callbacks(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        try:
            callback()
        except Exception:  # the caller's code, on the sender thread: it must not stop the producer
            log.exception("a send callback raised (the producer goes on)")


class BatchResult:
    """The outcome of one batch, shared by the futures of all its records.

    Lighter than concurrent.futures.Future (no Condition per record): an Event is
    created only if someone actually waits.
    """

    __slots__ = ("_callbacks", "_event", "_lock", "base_offset", "done", "exception", "leader_epoch", "partition", "topic")

    def __init__(self, topic: str = "", partition: int = -1) -> None:
        self.topic = topic
        self.partition = partition
        self.done = False
        self.base_offset = -1
        self.leader_epoch = -1
        self.exception: BaseException | None = None
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[], None]] | None = None
        self._lock = threading.Lock()

    def complete(self, base_offset: int, exception: BaseException | None = None) -> None:
        run_callbacks(self.settle(base_offset, exception))

    def settle(self, base_offset: int, exception: BaseException | None = None) -> list[Callable[[], None]]:
        """Resolve and wake the waiters; return the callbacks for the caller to run once it
        holds no lock of its own (``run_callbacks``): a callback may call the producer."""
        with self._lock:
            if self.done:
                return []
            self.base_offset = base_offset
            self.exception = exception
            self.done = True
            event, callbacks = self._event, self._callbacks
            self._callbacks = None
        if event is not None:
            event.set()
        return callbacks or []

    def wait(self, timeout_s: float | None) -> bool:
        with self._lock:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout_s)

    def on_done(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int  # -1 with acks=0
    timestamp: int


class RecordFuture:
    """What ``Producer.send`` returns: resolves to RecordMetadata or raises."""

    __slots__ = ("_batch", "_index", "_timestamp")

    def __init__(self, batch: BatchResult, index: int, timestamp: int) -> None:
        self._batch = batch
        self._index = index
        self._timestamp = timestamp

    def done(self) -> bool:
        return self._batch.done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The RecordMetadata once acknowledged (``offset`` -1 with acks=0), or the record's
        error (DeliveryTimeoutError, ClientClosedError, what the node answered, ...).
        ``timeout`` seconds (None: no bound) without an outcome raise the built-in
        TimeoutError, not a FabricError: the record is still on its way and may yet be
        delivered, and ``result()`` may be called again."""
        if not self._batch.wait(timeout):
            raise TimeoutError(f"record not acknowledged within {timeout} s")
        if self._batch.exception is not None:
            raise self._batch.exception
        batch = self._batch
        base = batch.base_offset
        return RecordMetadata(batch.topic, batch.partition, -1 if base < 0 else base + self._index, self._timestamp)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The record's error, None once acknowledged; the built-in TimeoutError as ``result``."""
        if not self._batch.wait(timeout):
            raise TimeoutError(f"record not acknowledged within {timeout} s")
        return self._batch.exception

    def add_callback(self, callback: Callable[[RecordMetadata | None, BaseException | None], Any]) -> None:
        """``callback(metadata, None)`` on success, ``callback(None, exception)`` on failure,
        on the thread that settles the record (the producer's sender thread, or the one
        calling ``close()``); at once on this thread if the record is settled already."""

        def fire() -> None:
            exc = self._batch.exception
            if exc is not None:
                callback(None, exc)
            else:
                callback(self.result(0), None)

        self._batch.on_done(fire)


class ProducerBatch:
    """Records of one partition on their way to one PRODUCE request.

    A record is kept as one tuple (timestamp, key, value, headers): one list append per
    record on the caller's thread; the sender thread splits the columns when it encodes.
    """

    __slots__ = ("attempts", "base_sequence", "created_s", "encoded", "first_sent_s", "has_headers", "last_error",
                 "order", "partition", "prepared", "prepared_count", "records", "result", "retry_after_s", "sealed", "size_bytes", "slots", "topic")

    def __init__(self, topic: str, partition: int, created_s: float, order: int = 0) -> None:
        self.order = order  # creation order within the producer: retries are requeued by it
        self.base_sequence = -1  # set when first encoded (idempotent producers)
        self.slots = 1  # in-flight slots of its partition this batch holds while sent
        self.topic = topic
        self.partition = partition
        self.created_s = created_s
        self.records: list[tuple[int, bytes | None, bytes | None, Headers | None]] = []
        self.size_bytes = 0
        self.has_headers = False
        self.sealed = False  # no more appends (full, sent or flushed)
        self.result = BatchResult(topic, partition)
        self.encoded: bytes | None = None
        self.attempts = 0
        self.retry_after_s = 0.0
        self.first_sent_s = -1.0
        self.last_error: BaseException | None = None  # why the last attempt failed, for the final error
        # send_batch: records already laid out and compressed (payload, first timestamp,
        # tag bloom); only the header, with the sequence numbers, is left to add.
        self.prepared: tuple[Any, int, int | None] | None = None
        self.prepared_count = 0

    @property
    def record_count(self) -> int:
        return self.prepared_count if self.prepared is not None else len(self.records)

    def columns(self) -> tuple[list[int], list[bytes | None], list[bytes | None], list[Headers | None] | None]:
        timestamps, keys, values, headers = (list(c) for c in zip(*self.records, strict=True))
        return timestamps, keys, values, headers if self.has_headers else None


class RecordAccumulator:
    def __init__(self, *, batch_bytes_max: int, linger_ms: float, buffer_bytes_max: int) -> None:
        if batch_bytes_max <= 0 or buffer_bytes_max < batch_bytes_max:
            raise ValueError(
                f"need 0 < batch_bytes_max ({batch_bytes_max}) <= buffer_bytes_max ({buffer_bytes_max})"
            )
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        self.batch_bytes_max = batch_bytes_max
        # Per topic whose message_bytes_max leaves a batch less room than batch_bytes_max:
        # the records bytes a batch of it may hold (set_message_bytes_max).
        self.topic_limits: dict[str, int] = {}
        self.linger_s = linger_ms / 1000.0
        self.buffer_bytes_max = buffer_bytes_max
        self.buffered_bytes = 0
        self.batches: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self.open: dict[tuple[str, int], ProducerBatch] = {}  # the batch still taking records
        self.flushing = False
        self._order = itertools.count()

    def set_message_bytes_max(self, topic: str, message_bytes_max: int) -> None:
        """A topic's largest batch frame (from metadata). Its batches close before they
        outgrow it: a frame is the batch header and at most the records bytes (producers
        send a batch lz4 did not shrink as it is), so a topic whose limit is below
        ``batch_bytes_max`` gets smaller batches instead of every batch refused as
        MESSAGE_TOO_LARGE. (Kafka's producer splits a batch the broker refused instead.)"""
        room = message_bytes_max - BATCH_HEADER_BYTES
        if room < self.batch_bytes_max:
            self.topic_limits[topic] = max(room, RECORD_OVERHEAD_BYTES)
        else:
            self.topic_limits.pop(topic, None)

    def limit(self, topic: str) -> int:
        """The records bytes at which a batch of ``topic`` closes."""
        return self.topic_limits.get(topic, self.batch_bytes_max)

    def has_room(self, size_bytes: int) -> bool:
        return self.buffered_bytes + size_bytes <= self.buffer_bytes_max or self.buffered_bytes == 0

    def append(
        self,
        topic: str,
        partition: int,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        now_s: float,
    ) -> tuple[RecordFuture, bool, bool]:
        """Append one record; returns (future, a batch of this partition became full,
        this record opened a new batch).

        A full batch wakes the sender; a new batch wakes it too, so it sleeps until that
        batch's linger ends, not its idle interval.
        This is the per-record hot path: keep it to a few dictionary and list operations.
        """
        size = RECORD_OVERHEAD_BYTES + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        if headers:
            size += headers_bytes(headers)
        tp = (topic, partition)
        batch = self.open.get(tp)
        limit = self.topic_limits.get(topic, self.batch_bytes_max)
        full = False
        created = False
        # batch_bytes_max is a target, as Kafka's batch.size: a record larger than it gets a
        # batch of its own (sealed below), and the topic's message_bytes_max, which the
        # producer checks before calling here, is the real limit on one record.
        # A record outside the open batch's timestamp window (its first record's timestamp
        # plus or minus an i32 of milliseconds, about 24.8 days) starts a batch of its own:
        # replayed history can mix timestamps further apart than that.
        if (batch is None or batch.size_bytes + size > limit
                or not DELTA_MS_MIN <= timestamp_ms - batch.records[0][0] <= DELTA_MS_MAX):
            created = True
            if batch is not None:
                batch.sealed = True
                full = True
            batch = self.open[tp] = ProducerBatch(topic, partition, now_s, next(self._order))
            queue = self.batches.get(tp)
            if queue is None:
                queue = self.batches[tp] = deque()
            queue.append(batch)
        records = batch.records
        index = len(records)
        records.append((timestamp_ms, key, value, headers))
        if headers:
            batch.has_headers = True
        batch.size_bytes += size
        self.buffered_bytes += size
        if batch.size_bytes >= limit - RECORD_OVERHEAD_BYTES:
            batch.sealed = True
            del self.open[tp]
            full = True
        return RecordFuture(batch.result, index, timestamp_ms), full, created

    def append_prepared(self, topic: str, partition: int, prepared: tuple[Any, int, int | None], record_count: int,
                         size_bytes: int, now_s: float) -> BatchResult:
        """Queue a batch ``send_batch`` laid out itself, sealed, behind the partition's open
        batch (which it seals: records keep the order they were given in)."""
        tp = (topic, partition)
        open_batch = self.open.pop(tp, None)
        if open_batch is not None:
            open_batch.sealed = True
        batch = ProducerBatch(topic, partition, now_s, next(self._order))
        batch.prepared = prepared
        batch.prepared_count = record_count
        batch.size_bytes = size_bytes
        batch.sealed = True
        self.buffered_bytes += size_bytes
        queue = self.batches.get(tp)
        if queue is None:
            queue = self.batches[tp] = deque()
        queue.append(batch)
        return batch.result

    def ready(self, now_s: float, in_flight: dict[tuple[str, int], int], max_in_flight: int = 1) -> list[ProducerBatch]:
        """Pop the batches that may be sent now, oldest first per partition.

        ``in_flight`` counts the slots each partition has in flight: up to
        ``max_in_flight`` batches of a partition are sent without waiting for answers
        (pipelining). A batch being retried goes only when nothing of its partition is in
        flight, and alone (the producer gives it every slot), as Kafka's producer does: the
        idempotent node refuses a sequence after a gap, so resends go in sequence order.
        """
        out: list[ProducerBatch] = []
        for key, queue in self.batches.items():
            used = in_flight.get(key, 0)
            while queue and used < max_in_flight:
                head = queue[0]
                if head.retry_after_s > now_s:
                    break
                if head.attempts and used:
                    break  # a resend waits for the partition's earlier requests to end
                if not (head.sealed or self.flushing or now_s - head.created_s >= self.linger_s):
                    break
                if not head.sealed:
                    head.sealed = True
                    del self.open[key]
                out.append(queue.popleft())
                if head.attempts:
                    break  # and goes alone
                used += 1
        return out

    def requeue(self, batch: ProducerBatch) -> None:
        """Put a batch that failed with a retriable error back in its queue, in creation
        order: the batches of a partition that failed together are resent in sequence order."""
        queue = self.batches.setdefault((batch.topic, batch.partition), deque())
        index = 0
        while index < len(queue) and queue[index].order < batch.order:
            index += 1
        queue.insert(index, batch)

    def release(self, batch: ProducerBatch) -> None:
        self.buffered_bytes -= batch.size_bytes

    def next_deadline_s(self, in_flight: dict[tuple[str, int], int], max_in_flight: int = 1) -> float | None:
        """When the next batch ``ready`` would hand out becomes sendable by time (its
        linger or retry backoff ends), if any. A partition that cannot send for another
        reason (its in-flight slots are used, or its head is a resend waiting for earlier
        requests to end) has no deadline: an answer frees it, and an answer wakes the
        sender anyway. Counting such a partition's past deadline made the sender poll with
        no timeout, spinning a core for as long as its requests were in flight (Kafka's
        ``RecordAccumulator.ready`` also leaves muted partitions out of its next check)."""
        deadline: float | None = None
        for key, queue in self.batches.items():
            if not queue:
                continue
            head = queue[0]
            used = in_flight.get(key, 0)
            if used >= max_in_flight or (head.attempts and used):
                continue
            at = max(head.created_s + self.linger_s, head.retry_after_s) if not head.sealed else head.retry_after_s
            deadline = at if deadline is None else min(deadline, at)
        return deadline

    def expire(self, now_s: float, timeout_s: float) -> list[ProducerBatch]:
        """Remove and return every queued batch created ``timeout_s`` or more before
        ``now_s``, open ones included: the delivery timeout holds whether or not a batch
        could be sent (no leader, no producer id, no answer)."""
        out: list[ProducerBatch] = []
        for key, queue in self.batches.items():
            if not queue or now_s - queue[0].created_s < timeout_s:
                continue  # batches are queued oldest first
            keep = deque(b for b in queue if now_s - b.created_s < timeout_s)
            out.extend(b for b in queue if now_s - b.created_s >= timeout_s)
            self.batches[key] = keep
            open_batch = self.open.get(key)
            if open_batch is not None and open_batch not in keep:
                open_batch.sealed = True
                del self.open[key]
        return out

    def pending_records(self) -> int:
        return sum(b.record_count for q in self.batches.values() for b in q)

    def pending_batches(self) -> int:
        return sum(len(q) for q in self.batches.values())

    def abort_all(self, exc: BaseException) -> list[Callable[[], None]]:
        """Fail every queued batch; returns their callbacks, for the caller to run unlocked."""
        self.open.clear()
        callbacks: list[Callable[[], None]] = []
        for queue in self.batches.values():
            while queue:
                batch = queue.popleft()
                self.release(batch)
                callbacks += batch.result.settle(-1, exc)
        return callbacks


def _load_speedups() -> Any:
    """sdk/_speedups (the compiled twin of the per-record path, built by
    scripts/install.sh), or None: not built, or ``FABRIC_PURE_PYTHON=1``. Behaviour and wire
    bytes are the same either way (tests/unit/test_speedups.py); only the time per record
    differs."""
    if os.environ.get("FABRIC_PURE_PYTHON", "") == "1" or sys.byteorder != "little":  # it writes native i32s
        return None
    try:
        from sdk import _speedups
    except ImportError:
        log.debug("sdk._speedups is not built (scripts/install.sh builds it): Producer.send runs on pure Python")
        return None
    _speedups.bind_accumulator(PythonRecordFuture, PythonProducerBatch)
    return _speedups


PythonRecordFuture, PythonProducerBatch = RecordFuture, ProducerBatch  # the compiled twins run their methods
SPEEDUPS: Any = _load_speedups()
if SPEEDUPS is not None and not TYPE_CHECKING:
    # The compiled twins, with the same attributes and methods: what the producer makes.
    RecordFuture, ProducerBatch = SPEEDUPS.RecordFuture, SPEEDUPS.ProducerBatch
