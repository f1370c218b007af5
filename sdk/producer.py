"""The producer: ``send()`` appends to a per-partition batch; a sender thread ships them.

Per record, ``send()`` does a dictionary lookup, a hash (when keyed) and four list
appends under one lock; encoding, compression and I/O happen once per batch on the
sender thread, which alone touches the sockets.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import operator
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from fabric import allocator, errors
from fabric.auth.curve import ClientSecurity
from fabric.limits import BATCH_HEADER_BYTES, I32_MAX, I64_MAX, MESSAGE_BYTES_MAX_DEFAULT
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as queue_format
from fabric.protocol import tags as tags_format
from fabric.protocol.apis import ApiKey
from fabric.protocol.keyhash import partition_for_key
from fabric.transport import readable, unique_inproc_endpoint
from sdk import accumulator, bulk
from sdk._arguments import int_arg, str_arg
from sdk._client import (
    LEADER_RECHECK_INTERVAL_S,
    PARTITION_LEARN_PAUSE_S,
    PARTITION_LEARN_WAIT_MS,
    Bootstrap,
    Connections,
    DroppedNodes,
    MetadataClient,
)
from sdk.accumulator import (
    DELTA_MS_MAX,
    DELTA_MS_MIN,
    RECORD_OVERHEAD_BYTES,
    BatchResult,
    Headers,
    ProducerBatch,
    RecordAccumulator,
    RecordFuture,
    as_bytes,
    headers_bytes,
    normalize_headers,
    run_callbacks,
)

log = logging.getLogger("fabric.producer")

SENDER_POLL_MS_MAX = 50  # the sender thread wakes at least this often
LEADER_RECHECK_S = 1.0  # a request unanswered this long makes us ask whether its leader moved
# (then again every LEADER_RECHECK_INTERVAL_S; at once for a node whose connection dropped)
# Batches of one partition sent before the first is answered, as Kafka's
# max.in.flight.requests.per.connection; idempotent producers keep order up to 5 because
# the node remembers the last 5 batches of each producer (nodes/producer_state.py).
MAX_IN_FLIGHT_DEFAULT = 5
MAX_IN_FLIGHT_IDEMPOTENT = 5
MAX_IN_FLIGHT_MAX = 100
REQUEST_BATCHES_MAX = 64  # batches per PRODUCE request to one node
REQUEST_BYTES_MAX = 1024 * 1024  # ...and about this many record bytes per request (a larger batch goes alone)
NEW_CONNECTION_WAIT_MS = 100  # a produce to a node we have no socket to yet waits this long to connect
# A producer still open when the interpreter exits, without close(): it flushes what it
# holds for at most this long, then logs how many records were lost (kafka-python flushes
# at exit, librdkafka warns; we do both, within a bound).
UNCLOSED_FLUSH_S_MAX = 10.0
# A Producer handle garbage-collected without close() leaves its core orphaned, not closed:
# in `Producer(...).send(...).result(10)` the handle is collected after `send` is looked up
# and before it runs, so closing at once refused the very send the caller was making. The
# orphaned core's sender thread delivers what it is given and closes the core once it has
# had nothing to send and no call under way for this long: long enough for a call already
# begun to reach the buffer, short enough that a dropped producer's thread and sockets
# end soon after (the promise that dropping the last reference stops the thread).
ORPHAN_IDLE_S = 1.0
# close() waits this long, after its flush, for the sender thread to finish the step it is
# in (a metadata refresh or a request, each bounded) and stop.
SENDER_STOP_S = 10.0
# A metadata refresh gets at least this long even when a batch's delivery deadline is
# already due (that batch fails this turn; the others still need a routing map).
METADATA_REFRESH_MIN_S = 0.1
EPOCH_MAX = 2**15 - 1  # the batch header's producer epoch is an i16 >= 0


_ACKS: dict[int | str, int] = {0: 0, 1: 1, -1: -1, "0": 0, "1": 1, "-1": -1, "all": -1}


def _check_options(*, acks: Any, linger_ms: Any, compression: Any, enable_idempotence: Any, **ints: Any) -> None:
    """The producer's options, checked before anything starts (as the Consumer's): a
    TypeError or ValueError naming the option and its bounds, the same on the compiled and
    the pure-Python path, instead of a failure later on the sender thread."""
    if isinstance(acks, bool) or (acks.lower() if isinstance(acks, str) else acks) not in _ACKS:
        raise ValueError(f"acks must be 0, 1 or 'all' (or -1), got {acks!r}")
    if isinstance(linger_ms, bool) or not isinstance(linger_ms, int | float):
        raise TypeError(f"linger_ms must be a number of milliseconds, got {type(linger_ms).__name__} {linger_ms!r:.60}")
    if not 0 <= linger_ms <= I32_MAX:  # NaN too
        raise ValueError(f"linger_ms={linger_ms} outside [0, {I32_MAX}]")
    str_arg("compression", compression)
    if enable_idempotence is not None and not isinstance(enable_idempotence, bool):
        raise TypeError(f"enable_idempotence must be True, False or None, got {enable_idempotence!r}")
    lows = {"batch_bytes_max": 1, "buffer_bytes_max": 1, "max_block_ms": 0, "delivery_timeout_ms": 1,
            "request_timeout_ms": 1, "retry_backoff_ms": 0, "metadata_max_age_ms": 0}
    for name, value in ints.items():
        int_arg(name, value, lows[name], I64_MAX if name == "buffer_bytes_max" else I32_MAX)


def _timestamp_ms(value: Any) -> int:
    """A record timestamp given by the caller: an int (or a float, truncated) the batch
    format's i64 holds; refused here, before anything is queued."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"timestamp_ms must be an int (milliseconds) or None, not {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"timestamp_ms must be a finite number of milliseconds, got {value}")
    ts = int(value)
    if not batch_format.TIMESTAMP_MS_MIN <= ts <= batch_format.TIMESTAMP_MS_MAX:
        raise ValueError(f"timestamp_ms={ts} outside the i64 range of the batch format")
    return ts


def _with_queue_headers(cols: bulk.Columns, values: Any, keys: Any, priority: int | None, delay_ms: int,
                        ttl_ms: int, dedup_ids: Sequence[str | None] | None
                        ) -> tuple[bulk.Columns, list[bytes | None] | None]:
    """``send_batch``'s queue options as each record's ``fabric.*`` headers (after its own),
    checked as ``send`` checks them; and, with dedup ids, the bytes each record routes by
    (its key, else its id: repeats meet one partition's dedup window), None when none."""
    now_ms = int(time.time() * 1000)
    shared = queue_format.send_headers(delay_ms=delay_ms, priority=priority, ttl_ms=ttl_ms, now_ms=now_ms)
    ids: list[str | None] = [None] * cols.count
    if dedup_ids is not None:
        if isinstance(dedup_ids, str | bytes):  # iterating it would make each character an id
            raise TypeError(f"dedup_ids must be a sequence of str or None, one per record, not a {type(dedup_ids).__name__}")
        ids = list(dedup_ids)
        if len(ids) != cols.count:
            raise ValueError(f"dedup_ids has {len(ids)} items, values {cols.count}")
    own = cols.headers or [None] * cols.count
    merged: list[Headers | None] = []
    for record_headers, dedup_id in zip(own, ids, strict=True):
        extra = queue_format.send_headers(dedup_id=dedup_id, now_ms=now_ms) if dedup_id is not None else []
        merged.append([*(record_headers or []), *shared, *extra] or None)
    route: list[bytes | None] | None = None
    if any(ids):
        record_keys = [cols.key(i) for i in range(cols.count)] if cols.keys is not None else [None] * cols.count
        route = [k if k is not None else (d.encode() if d else None) for k, d in zip(record_keys, ids, strict=True)]
    return bulk.Columns(values, keys, merged), route


def _partition_index(value: Any) -> int:
    """An explicit partition: an int (numpy's included, anything with __index__), not a bool."""
    if isinstance(value, bool):
        raise TypeError("partition must be an int or None, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"partition must be an int or None, not {type(value).__name__}") from None


def _answered_offset_possible(base_offset: int, batch: ProducerBatch) -> bool:
    """Whether a PRODUCE answer's ``base_offset`` (with error 0) can be ``batch``'s: each of
    its records at an offset in [0, OFFSET_MAX], or -1 for a batch sent with sequence
    numbers, a retry the leader stored before without remembering where (PROTOCOL.md 5.2)."""
    if base_offset == -1:
        return batch.base_sequence >= 0
    return 0 <= base_offset <= batch_format.OFFSET_MAX - batch.record_count + 1


def _request_groups(batches: list[ProducerBatch]) -> list[list[ProducerBatch]]:
    """Cut one node's ready batches into PRODUCE requests of at most REQUEST_BATCHES_MAX
    batches and about REQUEST_BYTES_MAX bytes (as Kafka's max.request.size): the node
    writes a request in one turn, so smaller requests let it work while we encode more."""
    groups: list[list[ProducerBatch]] = []
    current: list[ProducerBatch] = []
    size = 0
    for batch in batches:
        if current and (len(current) == REQUEST_BATCHES_MAX or size + batch.size_bytes > REQUEST_BYTES_MAX):
            groups.append(current)
            current, size = [], 0
        current.append(batch)
        size += batch.size_bytes
    if current:
        groups.append(current)
    return groups


@dataclass
class _InFlight:
    address: str
    batches: list[ProducerBatch]
    sent_s: float
    drops: int = 0  # Connections.drops(address) when sent: a later drop lost the answer


class _ProducerCore:
    """Send records to topics (see ``Producer``, the handle users hold).

    ``acks``: 0 (fire and forget), 1 (the leader wrote it) or ``"all"``/-1 (every in-sync
    replica has it; the default). ``enable_idempotence`` (default: on with acks=all)
    stamps batches with a producer id and sequences so that retries never duplicate. ``linger_ms``: how long a batch waits to fill. ``batch_bytes_max``:
    the batch closes at this many bytes of records. ``buffer_bytes_max``: memory for
    unsent records; ``send()`` blocks up to ``max_block_ms`` when it is full, then raises
    BufferFullError (a batch must fit the buffer: ``batch_bytes_max`` above
    ``buffer_bytes_max`` is a ValueError here). Retriable errors are retried until
    ``delivery_timeout_ms``.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        acks: int | str = "all",
        linger_ms: float = 5,
        batch_bytes_max: int = 256 * 1024,
        compression: str = "lz4",
        buffer_bytes_max: int = 64 * 1024 * 1024,
        max_block_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        enable_idempotence: bool | None = None,
        producer_id: int | None = None,
        producer_epoch: int = 0,
        context: zmq.Context[Any] | None = None,
        security: ClientSecurity | None = None,
        max_in_flight: int = MAX_IN_FLIGHT_DEFAULT,
    ) -> None:
        # security: CURVE keys for a secure cluster; None reads $FABRIC_KEY_FILE/$FABRIC_SERVER_KEY
        # (read here, so a bad key file fails the constructor, not the sender thread).
        _check_options(acks=acks, linger_ms=linger_ms, batch_bytes_max=batch_bytes_max, compression=compression,
                       buffer_bytes_max=buffer_bytes_max, max_block_ms=max_block_ms,
                       delivery_timeout_ms=delivery_timeout_ms, request_timeout_ms=request_timeout_ms,
                       retry_backoff_ms=retry_backoff_ms, metadata_max_age_ms=metadata_max_age_ms,
                       enable_idempotence=enable_idempotence)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):  # its range: below
            raise TypeError(f"max_in_flight must be an int, got {type(max_in_flight).__name__} {max_in_flight!r:.60}")
        self._security = security or ClientSecurity.from_env()
        allocator.tune()  # batches are large buffers: keep them off per-buffer mmap (fabric/allocator.py)
        self.acks = _ACKS[acks.lower() if isinstance(acks, str) else acks]
        if enable_idempotence is None:
            enable_idempotence = self.acks == -1  # as Kafka: on by default with acks=all
        if enable_idempotence and self.acks != -1:
            raise ValueError("enable_idempotence needs acks='all': with fewer acks a retry may not know what was kept")
        if producer_id is not None and not (enable_idempotence and 0 <= producer_id < 2**63):
            raise ValueError("producer_id needs enable_idempotence=True and must be within [0, 2**63)")
        if not 0 <= producer_epoch < 2**15:
            raise ValueError(f"producer_epoch must be within [0, 32767], got {producer_epoch}")
        self.idempotent = enable_idempotence
        if not 1 <= max_in_flight <= (MAX_IN_FLIGHT_IDEMPOTENT if enable_idempotence else MAX_IN_FLIGHT_MAX):
            raise ValueError(
                f"max_in_flight must be within [1, {MAX_IN_FLIGHT_IDEMPOTENT}] with idempotence (the node remembers "
                f"that many batches per producer to answer retries), [1, {MAX_IN_FLIGHT_MAX}] without; got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.producer_id = producer_id if producer_id is not None else -1
        self.producer_epoch = producer_epoch if enable_idempotence else -1
        self._next_sequence: dict[tuple[str, int], int] = {}
        # A numbered batch that failed without giving its sequence numbers back (a delivery
        # timeout, above all, of a request never answered: stored or not, nobody knows)
        # leaves a gap the node refuses every later batch of the partition for
        # (OUT_OF_ORDER_SEQUENCE, final): the partition was wedged for good. Its later
        # batches start a new epoch at sequence 0 instead (nodes/producer_state.py accepts
        # that, and fences a late copy of the old one), as Kafka's producer bumps its epoch
        # (KIP-360). Only with a producer id the cluster gave: a caller's own id and epoch
        # (Spark's exactly-once writer) stay exactly as given, so its reruns still dedupe.
        self._bumps_epochs = producer_id is None
        self._partition_epochs: dict[tuple[str, int], int] = {}
        # Per partition, the batches numbered in the epoch before the current one and not
        # yet answered: their failure is that epoch's, not a reason for another bump.
        self._old_epoch_batches: dict[tuple[str, int], set[int]] = {}
        if compression not in batch_format.CODECS:
            raise ValueError(f"compression must be one of {sorted(batch_format.CODECS)}, got {compression!r}")
        if delivery_timeout_ms < request_timeout_ms:
            raise ValueError("delivery_timeout_ms must be >= request_timeout_ms")
        self.codec = batch_format.CODECS[compression]
        self.max_block_s = max_block_ms / 1000.0
        self.delivery_timeout_s = delivery_timeout_ms / 1000.0
        self.request_timeout_s = request_timeout_ms / 1000.0
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_s = retry_backoff_ms / 1000.0
        self.metadata_max_age_s = metadata_max_age_ms / 1000.0
        self._acc = RecordAccumulator(batch_bytes_max=batch_bytes_max, linger_ms=linger_ms, buffer_bytes_max=buffer_bytes_max)
        self._lock = _new_lock()
        self._due: list[Callable[[], None]] = []  # callbacks of resolved batches, run by _run_due
        self._refreshes_begun = 0  # metadata refreshes the sender started, and the last one done
        self._refreshes_done = 0
        self._space = threading.Condition(self._lock)
        self._metadata_ready = threading.Condition(self._lock)
        self._partition_counts: dict[str, int] = {}
        self._message_bytes_max: dict[str, int] = {}
        self._unknown_topics: dict[str, BaseException] = {}
        # Why the last metadata refresh failed (None once one succeeds), and whether any
        # ever did: a send() that waited max_block_ms for a topic's metadata says why, or
        # its RequestTimedOutError hid the cause (ZooKeeper unreachable, say) in a log line.
        self._metadata_error: BaseException | None = None
        self._map_read = False
        self._wanted_topics: set[str] = set()
        self._sticky: dict[str, int] = {}
        # Where a topic's keyless records start: random per producer, as Kafka's sticky
        # partitioner, so many producers (short-lived ones above all: a Spark task, a
        # script) spread over the partitions instead of all opening on partition 0.
        self._sticky_start = random.randrange(1 << 30)
        # Per topic, what its sticky partition took since it became sticky (_move_sticky):
        # bytes of the finished batches keyless records opened there, and the unfinished one.
        self._sticky_closed_bytes: dict[str, int] = {}
        self._sticky_batch: dict[str, ProducerBatch] = {}
        self._in_flight: dict[int, _InFlight] = {}
        # Taken from the accumulator by this sender turn and not yet in flight (being encoded
        # and sent): flush() must wait for these too.
        self._sending: list[ProducerBatch] = []
        self._in_flight_slots: dict[tuple[str, int], int] = {}  # per partition, at most max_in_flight
        # Idempotent: every batch holding sequence numbers, not yet answered, per partition
        # in sequence order; an OUT_OF_ORDER_SEQUENCE answer is retriable unless the batch
        # is the first of these (then an earlier batch is not missing: the node lost it).
        self._unacked: dict[tuple[str, int], deque[ProducerBatch]] = {}
        self._acknowledged: set[tuple[str, int]] = set()  # partitions that acknowledged a batch of ours
        self._closed = False
        self._stop = threading.Event()
        self._refusal: BaseException | None = None  # why send() must refuse (closed, sender died)
        self._closed_why = "send() after close()"  # what that refusal says once closed
        # Set (without the lock) once the Producer handle was collected: the sender thread
        # then closes the core after ORPHAN_IDLE_S with nothing to do (_close_if_abandoned).
        self._orphaned = False
        self._idle_since_s = 0.0  # when an orphaned core last had something to do
        self._orphan_lost = 0  # records an orphaned core failed to deliver, logged when it closes
        # Calls under way whose records are not in the buffer yet (send() waiting for a
        # topic's metadata or for room, send_batch() between its two locked steps): an
        # orphaned core must not close under them.
        self._calls_waiting = 0
        self._ctx = context or zmq.Context.instance()
        self._bootstrap = Bootstrap(bootstrap)
        wake = unique_inproc_endpoint("producer-wake")
        self._wake_pull = self._ctx.socket(zmq.PULL)
        self._wake_pull.bind(wake)
        self._wake_push = self._ctx.socket(zmq.PUSH)
        self._wake_push.setsockopt(zmq.LINGER, 0)
        self._wake_push.setsockopt(zmq.SNDHWM, 1)
        self._wake_push.connect(wake)
        self._refresh_needed = True
        self._last_recheck_s = 0.0
        self._dropped = DroppedNodes()  # nodes whose connection dropped: their requests are suspect
        # The compiled send, when built: an instance attribute, so core.send is it.
        self._fast = _fast_send(self) if _fast_send is not None else None
        if self._fast is not None:
            setattr(self, "send", self._fast.send)  # noqa: B010 (mypy: a method is not assignable)
        self._thread = threading.Thread(target=self._run_sender, name="fabric-producer-sender", daemon=True)
        self._thread.start()
        _UNCLOSED_CORES.add(self)  # flushed at interpreter exit unless closed (_close_unclosed_at_exit)

    # -- user thread ------------------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Headers | dict[str, bytes | str | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Any = None,
        tags: Iterable[str] | None = None,
        *,
        delay_ms: int = 0,
        deliver_at_ms: int = 0,
        priority: int | None = None,
        dedup_id: str = "",
        ttl_ms: int = 0,
    ) -> RecordFuture:
        """Queue one record; returns a RecordFuture resolving to RecordMetadata (topic,
        partition, offset, timestamp). ``future.result(timeout)`` raises the built-in
        TimeoutError when no answer came within ``timeout`` seconds (the record may still be
        delivered), else the record's own error (DeliveryTimeoutError, ...).

        Raised by send() itself, before anything is queued: TypeError/ValueError for a bad
        argument; for a topic new to this producer, what METADATA says of it
        (UnknownTopicOrPartitionError for an unknown topic, AuthorizationFailedError, ...),
        or RequestTimedOutError when no metadata came within ``max_block_ms`` (its message
        says why: the last metadata error, such as ZooKeeper not answering, or that nothing
        answered from the bootstrap yet); BufferFullError
        when the buffer stayed full for ``max_block_ms``; MessageTooLargeError;
        ClientClosedError after ``close()``. A ``partition`` at or past the topic's count
        may have just been added: send() asks again for up to PARTITION_LEARN_WAIT_MS (3 s,
        or ``max_block_ms`` if shorter) before it raises UnknownTopicOrPartitionError.

        ``callback(metadata, exception)``: ``callback(RecordMetadata, None)`` once the record
        is acknowledged, ``callback(None, exception)`` once it failed. It runs on the
        producer's sender thread (records that ``close()`` fails: on the thread calling
        close()), with no lock held; an exception it raises is logged (``fabric.producer``)
        and the producer goes on. A slow callback delays every answer behind it: hand long
        work to an executor of your own. From a callback, ``send()`` cannot wait for what
        the sender thread itself provides: a full buffer raises BufferFullError at once, a
        topic this producer has not sent to yet InvalidRequestError, a partition past the
        known count UnknownTopicOrPartitionError; ``close()`` works (it finishes on a thread
        of its own) and ``flush()`` raises RuntimeError (it would wait for itself).

        ``delay_ms``/``deliver_at_ms``, ``priority`` (0..9), ``dedup_id`` and ``ttl_ms`` are
        queue-mode options carried as ``fabric.*`` headers (docs/QUEUES.md); bad values raise.
        ``tags`` (e.g. ``("paid", "eu")``) go in the ``fabric.tags`` header and the batch's
        tag bloom, for consumers with a ``tag_filter`` (docs/GROUPS.md, "Tag filters")."""
        # Everything a caller can get wrong is refused here, before the record is queued: a
        # record the sender thread could not encode would fail with its whole batch.
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        if partition is not None:
            partition = _partition_index(partition)
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        value_b = value if value.__class__ is bytes else as_bytes(value, "value")
        key_b = key if key is None or key.__class__ is bytes else as_bytes(key, "key")
        header_list = normalize_headers(headers) if headers else None
        if delay_ms or deliver_at_ms or priority is not None or dedup_id or ttl_ms:
            # queue-mode options travel as documented record headers (docs/QUEUES.md)
            header_list = [*(header_list or []), *queue_format.send_headers(
                delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, priority=priority, ttl_ms=ttl_ms, dedup_id=dedup_id,
                now_ms=int(time.time() * 1000))]
        if tags:
            if isinstance(tags, str | bytes):  # iterating it would make each character a tag
                raise TypeError(f"tags must be an iterable of str, such as ({tags!r},), not a single {type(tags).__name__}")
            header_list = [*(header_list or []), (tags_format.TAGS_HEADER, tags_format.encode_tags(tags))]
        ts = int(time.time() * 1000) if timestamp_ms is None else _timestamp_ms(timestamp_ms)
        sticky = False  # keyless, no partition given: the sticky partitioner chooses
        with self._lock:
            if self._refusal is not None:
                raise self._refusal
            count = self._partition_counts.get(topic)
            if count is None:
                count = self._await_topic(topic)
            if partition is None:
                if key_b is not None or dedup_id:
                    # A dedup id without a key routes by the id: its repeats meet the same
                    # partition's dedup window (docs/QUEUES.md).
                    partition = partition_for_key(key_b if key_b is not None else dedup_id.encode(), count)
                else:
                    sticky = True
                    partition = self._sticky.get(topic)
                    if partition is None or partition >= count:
                        partition = self._sticky[topic] = self._sticky_start % count
            elif not 0 <= partition < count and not (partition > 0 and self._learns_partition(topic, partition)):
                raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} (it has {count})")
            acc = self._acc
            limit = acc.topic_limits.get(topic, acc.batch_bytes_max)  # acc.limit(topic), without the call
            size = RECORD_OVERHEAD_BYTES + (len(value_b) if value_b else 0) + (len(key_b) if key_b else 0)
            # Fast path, most records: the partition's open batch has room and will not be
            # filled by this record. It does what RecordAccumulator.append does for that
            # case, without the call; everything else (new batch, full batch, headers,
            # buffer limit) goes through append() below.
            batch = acc.open.get((topic, partition))
            if (
                batch is not None
                and header_list is None
                and batch.size_bytes + size < limit - RECORD_OVERHEAD_BYTES
                and acc.buffered_bytes + size <= acc.buffer_bytes_max
                and DELTA_MS_MIN <= ts - batch.records[0][0] <= DELTA_MS_MAX  # the batch's i32 timestamp window
            ):
                records = batch.records
                future = RecordFuture(batch.result, len(records), ts)
                records.append((ts, key_b, value_b, None))
                batch.size_bytes += size
                acc.buffered_bytes += size
                if callback is not None:
                    future.add_callback(callback)
                return future
            if header_list is not None:
                size += headers_bytes(header_list)
            if size > limit - RECORD_OVERHEAD_BYTES:
                frame_max = self._message_bytes_max.get(topic, MESSAGE_BYTES_MAX_DEFAULT)
                if size + BATCH_HEADER_BYTES > frame_max:
                    raise errors.MessageTooLargeError(
                        f"record of {size} bytes (key, value, headers and {RECORD_OVERHEAD_BYTES} bytes of lengths) "
                        f"does not fit topic {topic!r}'s message_bytes_max={frame_max} with the "
                        f"{BATCH_HEADER_BYTES}-byte batch header",
                        record_bytes=size, limit_bytes=frame_max,
                    )
            if sticky and (batch is None or batch.size_bytes + size > limit):
                partition = self._move_sticky(topic, partition, count, size)  # it would open a batch here
            if acc.buffered_bytes + size > acc.buffer_bytes_max:
                self._wait_for_room(size)
            future, full, created = self._acc.append(topic, partition, ts, key_b, value_b, header_list, time.monotonic())
            if created and sticky:
                self._sticky_batch[topic] = self._acc.batches[(topic, partition)][-1]  # the one it opened
            # Wake the sender for a batch it may send now. While the partition's
            # max_in_flight slots are taken it could not: it looks again when an answer
            # frees one, and a wake for nothing costs it a turn (at a steady rate with
            # max_in_flight=1 that was most records' wake).
            if (full or created) and self._in_flight_slots.get((topic, partition), 0) < self.max_in_flight:
                self._wake()
        if callback is not None:
            future.add_callback(callback)
        return future

    def _move_sticky(self, topic: str, partition: int, count: int, size: int) -> int:
        """The partition for a keyless record of ``size`` bytes that would open a batch on
        the sticky one: the next partition once the sticky one has taken
        ``batch_bytes_max`` bytes (Kafka's KIP-794 rule), else the same one.

        Counting bytes rather than batches keeps batches as large as the linger allows at
        any rate: moving on with every new batch (KIP-480) spreads a modest stream of
        records over every partition in smaller batches (more requests for the same
        records, which cost latency here when the CPU is shared). The first rule here moved on only
        when a batch *filled*, so at modest rates, where batches leave at their linger long
        before they fill, a topic's keyless records all went to one partition for good.
        Called with the lock held."""
        opened = self._sticky_batch.pop(topic, None)
        taken = self._sticky_closed_bytes.get(topic, 0) + (opened.size_bytes if opened is not None else 0)
        if taken + size <= self._acc.limit(topic):
            self._sticky_closed_bytes[topic] = taken  # the batch this record opens is counted apart
            return partition
        self._sticky_closed_bytes[topic] = 0
        partition = self._sticky[topic] = (partition + 1) % count
        return partition

    _send_python = send  # the compiled fast path (sdk/_speedups.pyx) hands everything else here

    def _refuse(self, exc: BaseException) -> None:
        """From now on send() raises ``exc`` (called with the lock held); the compiled send
        keeps its own copy."""
        self._refusal = exc
        if self._fast is not None:
            self._fast.refusal = exc

    def send_batch(
        self,
        topic: str,
        values: Any,
        keys: Any = None,
        headers: Sequence[Headers | dict[str, bytes | str | None] | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        *,
        priority: int | None = None,
        delay_ms: int = 0,
        ttl_ms: int = 0,
        dedup_ids: Sequence[str | None] | None = None,
    ) -> bulk.BulkFuture:
        """Queue many records at once; returns a BulkFuture (``result()`` lists the batches).

        ``values`` (and ``keys``) are sequences of bytes/str/None or Arrow binary/string
        arrays; ``headers`` per record None, a dict or a list of (name, value) pairs, as
        for ``send``. The records share one timestamp. Without keys or ``partition`` they fill whole batches that go
        to one partition after another (sticky, as ``send``); with keys each record goes to
        its key's partition (slower: a Python step per record), and records whose key is
        None go stickily, as without keys. Same guarantees as
        ``send``: acks, idempotence, order within a partition, retries, buffer limits. A
        record that cannot fit ``message_bytes_max`` refuses the whole call, before
        anything is queued; the call waits up to ``max_block_ms`` for buffer room for all
        of its records (an empty buffer takes any size), so ``BufferFullError`` too means
        that nothing was queued.

        Queue-mode options, as ``send``'s (docs/QUEUES.md): ``priority``, ``delay_ms`` and
        ``ttl_ms`` apply to every record of the call; ``dedup_ids`` is one id per record
        (None or "" for none), aligned with ``values``, and a record with an id but no key
        goes to the partition its id hashes to, as with ``send``. They are checked before
        anything is queued, with send's errors (InvalidPriorityError, InvalidDelayError,
        InvalidRequestError, TypeError; ValueError for ``dedup_ids`` of another length)."""
        cols = bulk.Columns(values, keys, headers)
        route: list[bytes | None] | None = None
        if priority is not None or delay_ms or ttl_ms or dedup_ids is not None:  # checked even for no records
            cols, route = _with_queue_headers(cols, values, keys, priority, delay_ms, ttl_ms, dedup_ids)
        if cols.count == 0:
            return bulk.BulkFuture([])
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        if partition is not None:
            partition = _partition_index(partition)
        ts = int(time.time() * 1000) if timestamp_ms is None else _timestamp_ms(timestamp_ms)
        with self._lock:
            if self._refusal is not None:
                raise self._refusal
            count = self._partition_counts.get(topic)
            if count is None:
                count = self._await_topic(topic)
            limit = self._message_bytes_max.get(topic, MESSAGE_BYTES_MAX_DEFAULT)
            batch_bytes_max = self._acc.limit(topic)
            sticky = self._sticky.get(topic, self._sticky_start) % count
            if partition is not None and partition >= count > 0 and self._learns_partition(topic, partition):
                count = self._partition_counts[topic]
            self._calls_waiting += 1  # its records are compressed outside the lock, before they are pending
        try:
            return self._send_prepared(topic, cols, partition, ts, count, limit, batch_bytes_max, sticky, route)
        finally:
            with self._lock:
                self._calls_waiting -= 1

    def _send_prepared(self, topic: str, cols: bulk.Columns, partition: int | None, ts: int, count: int,
                       limit: int, batch_bytes_max: int, sticky: int,
                       route: list[bytes | None] | None) -> bulk.BulkFuture:
        """send_batch() once the topic is known: cut, compress (no lock held) and queue.
        ``route``: per record, what places a keyless one (its dedup id), or None."""
        if partition is not None and not 0 <= partition < count:
            raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} (it has {count})")
        bulk.check_fits(cols, topic, limit)
        groups: list[tuple[int, bulk.Columns]]
        if partition is None and (cols.keys is not None or route is not None):
            groups = bulk.by_key(cols, count, route)
        else:
            groups = [(partition if partition is not None else -1, cols)]
        pieces: list[tuple[int, bulk.Piece]] = []
        for target, group in groups:
            for start, end in group.cut(0, group.count, batch_bytes_max):
                if target < 0:  # sticky: each full batch to the next partition
                    chosen, sticky = sticky, (sticky + 1) % count
                else:
                    chosen = target
                pieces.append((chosen, group.piece(chosen, start, end)))
        payloads = [batch_format.compress_records(piece.records, self.codec, adaptive=True) for _, piece in pieces]
        parts: list[tuple[BatchResult, int]] = []
        with self._lock:
            if self._refusal is not None:  # closed while the records were being compressed
                raise self._refusal
            # Room for the whole call before any of it is queued (an empty buffer takes any
            # size, as for one large record): a BufferFullError then means nothing went in,
            # and the caller may simply send the call again.
            self._wait_for_room(sum(piece.size_bytes for _, piece in pieces))
            if any(target < 0 for target, _group in groups):
                self._sticky[topic] = sticky
                self._sticky_closed_bytes[topic] = 0  # that partition has taken nothing yet
                self._sticky_batch.pop(topic, None)
            for (chosen, piece), payload in zip(pieces, payloads, strict=True):
                result = self._acc.append_prepared(topic, chosen, (payload, ts, piece.tag_bloom), piece.record_count,
                                                   piece.size_bytes, time.monotonic())
                parts.append((result, piece.record_count))
                self._wake()
        return bulk.BulkFuture(parts)

    def _wait_for_room(self, size: int) -> None:
        """Block (lock held, released while waiting) until the buffer has room, up to max_block_ms."""
        if self._acc.has_room(size):
            return
        if threading.current_thread() is self._thread:
            raise errors.BufferFullError(
                f"producer buffer of buffer_bytes_max={self._acc.buffer_bytes_max} is full, and send() from a send "
                "callback cannot wait for room: the callback runs on the thread that would free it")
        deadline = time.monotonic() + self.max_block_s
        self._calls_waiting += 1
        try:
            while not self._acc.has_room(size):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise errors.BufferFullError(
                        f"producer buffer of buffer_bytes_max={self._acc.buffer_bytes_max} stayed full for max_block_ms={int(self.max_block_s * 1000)}"
                    )
                self._space.wait(remaining)
                if self._closed:
                    raise errors.ClientClosedError("producer closed while send() was blocked")
        finally:
            self._calls_waiting -= 1  # the lock is held again here (Condition.wait retakes it)

    def _await_topic(self, topic: str) -> int:
        """Ask the sender thread for this topic's metadata; called with the lock held."""
        if threading.current_thread() is self._thread:
            raise errors.InvalidRequestError(
                f"topic {topic!r} is new to this producer, and send() from a send callback cannot wait for its "
                "metadata (the callback runs on the thread that fetches it): send to it, or call "
                "partitions_for() on it, once outside the callback first")
        self._calls_waiting += 1
        try:
            return self._wait_for_topic(topic)
        finally:
            self._calls_waiting -= 1  # the lock is held again here (Condition.wait retakes it)

    def _wait_for_topic(self, topic: str) -> int:
        """_await_topic's wait (lock held, released while waiting), up to max_block_ms."""
        self._unknown_topics.pop(topic, None)
        self._wanted_topics.add(topic)
        self._wake()
        deadline = time.monotonic() + self.max_block_s
        waiting: BaseException | None = None  # the retriable error METADATA last listed the topic with
        ask_again_s = math.inf
        while topic not in self._partition_counts:
            exc = self._unknown_topics.pop(topic, None)
            if exc is not None:
                if not (isinstance(exc, errors.FabricError) and exc.retriable):
                    raise exc  # UNKNOWN_TOPIC_OR_PARTITION, AUTHORIZATION_FAILED, ... as the node said
                # LEADER_NOT_AVAILABLE (a topic just created), NODE_NOT_READY, ...: passing
                # states, asked about again after the backoff, within max_block_ms.
                waiting, ask_again_s = exc, time.monotonic() + self.retry_backoff_s
            now = time.monotonic()
            if now >= ask_again_s:
                ask_again_s = math.inf
                self._wanted_topics.add(topic)
                self._wake()
            remaining = deadline - now
            if remaining <= 0:
                if isinstance(waiting, errors.FabricError):
                    why = f" (metadata lists it with {waiting.name})"
                elif self._metadata_error is not None:
                    why = f" (last metadata error: {self._metadata_error})"
                elif not self._map_read:
                    bootstrap = f"zk://{self._bootstrap.zk}" if self._bootstrap.zk else ",".join(self._bootstrap.addresses)
                    why = f" (no routing map read yet: nothing answered from bootstrap {bootstrap} so far)"
                else:
                    why = ""
                raise errors.RequestTimedOutError(
                    f"no metadata for topic {topic!r} within max_block_ms={int(self.max_block_s * 1000)}{why}")
            self._metadata_ready.wait(max(0.0, min(remaining, 0.1, ask_again_s - now)))
        return self._partition_counts[topic]

    def _learns_partition(self, topic: str, partition: int) -> bool:
        """Whether metadata refreshed after this call (lock held) lists ``partition``: one
        past the cached count may have been added since (as Kafka's producer, which asks
        again before it refuses), and the node asked may hear of it a little after the
        others, so ask again for up to PARTITION_LEARN_WAIT_MS (within max_block_ms). Not
        on the sender thread, which does the refresh: the cached count then."""
        if threading.current_thread() is self._thread:
            return partition < self._partition_counts.get(topic, 0)
        self._calls_waiting += 1
        try:
            return self._wait_for_partition(topic, partition)
        finally:
            self._calls_waiting -= 1  # the lock is held again here (Condition.wait retakes it)

    def _wait_for_partition(self, topic: str, partition: int) -> bool:
        """_learns_partition's wait (lock held, released while waiting)."""
        deadline = time.monotonic() + min(self.max_block_s, PARTITION_LEARN_WAIT_MS / 1000.0)
        while not self._closed:
            wanted = self._refreshes_begun + 1
            self._refresh_needed = True
            self._wake()
            while self._refreshes_done < wanted and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._metadata_ready.wait(min(remaining, 0.1))
            if partition < self._partition_counts.get(topic, 0):
                return True
            if time.monotonic() >= deadline:
                break
            self._metadata_ready.wait(PARTITION_LEARN_PAUSE_S)  # the lock is released meanwhile
        return False

    def _wake(self) -> None:
        try:
            self._wake_push.send(b"", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # one wake is already pending; that is enough

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until each batch is acknowledged or failed;
        the built-in TimeoutError if that takes longer than ``timeout`` seconds. After
        ``close()`` it returns at once: nothing is left to send."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("flush() from a send callback would wait for itself: the callback runs on "
                               "the producer's sender thread, which resolves the batches")
        with self._lock:
            results = [b.result for b in self._pending_batches()]
            self._acc.flushing = True
            self._wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for result in results:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not result.wait(remaining):
                    raise TimeoutError(f"flush did not complete within {timeout} s")
        finally:
            with self._lock:
                self._acc.flushing = False

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, stop the sender thread and close sockets. Unsent records fail with ClientClosedError.
        Returns within ``timeout`` plus at most SENDER_STOP_S (10 s) for the sender thread.
        ``timeout=0`` does not flush (Kafka's ``close(Duration.ZERO)``): what is not yet
        acknowledged fails at once, without the warning a flush that timed out gives."""
        with self._lock:
            if self._closed:
                return
        if threading.current_thread() is self._thread:
            # Dropped from a callback on the sender thread: that thread cannot join itself.
            threading.Thread(target=self.close, args=(timeout,), name="fabric-producer-close", daemon=True).start()
            return
        if timeout is None or timeout > 0:
            try:
                self.flush(timeout)
            except TimeoutError:
                log.warning("close(): flush timed out; failing what is left")
        with self._lock:
            if self._closed:  # the sender thread closed an orphaned core meanwhile: nothing was left
                return
            self._closed = True
            self._refuse(errors.ClientClosedError(self._closed_why))
            self._space.notify_all()
        self._stop.set()
        self._wake()
        self._thread.join(timeout=SENDER_STOP_S)
        with self._lock:
            self._due += self._acc.abort_all(errors.ClientClosedError("producer closed before the record was sent"))
            for flight in self._in_flight.values():
                for batch in flight.batches:
                    self._due += batch.result.settle(-1, errors.ClientClosedError("producer closed before an answer came"))
            self._in_flight.clear()
        self._run_due()
        self._wake_push.close(linger=0)

    def close_unattended(self) -> None:
        """What a producer that nobody closed does when the interpreter exits (its handle
        alive or orphaned): flush within UNCLOSED_FLUSH_S_MAX, then say how many records
        were lost."""
        with self._lock:
            if self._closed:
                return
            pending = [(b.result, b.record_count) for b in self._pending_batches()]
            self._closed_why = ("send() after the interpreter began to exit, with the Producer not closed: "
                                "keep a reference to it, or use `with Producer(...) as producer:`")
        if not pending:
            self.close(0)
            return
        self.close(UNCLOSED_FLUSH_S_MAX)
        lost = sum(count for result, count in pending if result.exception is not None)
        if lost:
            log.error(
                "producer was not closed: %d of %d records were not delivered (flushed for up to "
                "UNCLOSED_FLUSH_S_MAX=%.0f s at exit); call flush() or close()",
                lost, sum(count for _, count in pending), UNCLOSED_FLUSH_S_MAX,
            )

    def _orphan(self) -> None:
        """The Producer handle was garbage-collected without close() (not at interpreter
        exit: close_unattended). The core goes on delivering what it is given, a send
        already looked up on the handle included, and its sender thread closes it once
        it has been idle for ORPHAN_IDLE_S (_close_if_abandoned)."""
        # No lock: a cyclic collection may run this on a thread inside one of this core's
        # own locked sections. The sender reads these flags on its next turn.
        self._closed_why = (f"send() after the Producer was garbage-collected and its sender stopped, idle for "
                            f"ORPHAN_IDLE_S={ORPHAN_IDLE_S:g} s: keep a reference to it, or use "
                            "`with Producer(...) as producer:`")
        self._idle_since_s = time.monotonic()
        self._orphaned = True

    def _close_if_abandoned(self) -> bool:
        """On the sender thread, at the start of each turn of an orphaned core: close it
        (True) once it has had nothing pending and no call under way for ORPHAN_IDLE_S.
        A record sent since the last turn is pending still (this turn's ready() has not
        run) or was taken by a turn's ready(), which marks the core busy: none is missed."""
        now = time.monotonic()
        with self._lock:
            # Nobody will call flush(): what is sent leaves without waiting for its linger.
            self._acc.flushing = True
            # Every batch holds buffer bytes until it is answered or failed (_finish):
            # cheaper than listing _pending_batches() on each turn of a busy orphan.
            if self._calls_waiting or self._wanted_topics or self._due or self._acc.buffered_bytes or self._in_flight:
                self._idle_since_s = now
                return False
            if now - self._idle_since_s < ORPHAN_IDLE_S:
                return False
            self._closed = True
            self._refuse(errors.ClientClosedError(self._closed_why))
            self._space.notify_all()
            self._metadata_ready.notify_all()
            self._stop.set()
            self._wake_push.close(linger=0)  # under the lock: send() and flush() wake with it under the lock
            lost, self._orphan_lost = self._orphan_lost, 0
        if lost:
            log.error("producer was garbage-collected without close(): %d records failed after that (their "
                      "futures hold the errors); keep a reference and call flush() or close()", lost)
        return True

    def _pending_batches(self) -> list[ProducerBatch]:
        """Every batch not yet answered, wherever it is (call with the lock held): queued,
        being sent this turn, in flight, or (idempotent) between a failure and its requeue."""
        batches = [b for q in self._acc.batches.values() for b in q] + self._sending
        batches += [b for f in self._in_flight.values() for b in f.batches]
        batches += [b for q in self._unacked.values() for b in q]
        return list({id(b): b for b in batches}.values())

    @property
    def closed(self) -> bool:
        """close() was called: send() raises ClientClosedError."""
        return self._closed

    def partitions_for(self, topic: str) -> int:
        """How many partitions ``topic`` has, from the routing map (fetched first if the
        topic is new to this producer, waiting up to ``max_block_ms``; an unknown topic
        raises UnknownTopicOrPartitionError, one METADATA lists with another error that is
        not retriable raises that error, AuthorizationFailedError for instance; a retriable
        one, LEADER_NOT_AVAILABLE for a topic just created, is waited on)."""
        with self._lock:
            count = self._partition_counts.get(topic)
            return count if count is not None else self._await_topic(topic)

    # -- sender thread ----------------------------------------------------------------------
    def _run_sender(self) -> None:
        conns = Connections(self._ctx, security=self._security)
        meta = MetadataClient(self._bootstrap, conns)
        conns.poller.register(self._wake_pull, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if self._orphaned and self._close_if_abandoned():
                    break
                self._sender_turn(conns, meta)
                self._run_due()
        except Exception as exc:  # a bug, not an operating error: fail loudly, never hang
            log.exception("producer sender thread died")
            with self._lock:
                fatal = errors.UnknownServerError(f"producer sender thread died: {exc!r}")
                self._refuse(fatal)
                self._due += self._acc.abort_all(fatal)
                for batch in self._pending_batches():
                    self._due += batch.result.settle(-1, fatal)
                self._metadata_ready.notify_all()
                self._space.notify_all()
        finally:
            self._run_due()
            conns.close()
            self._wake_pull.close(linger=0)

    def _run_due(self) -> None:
        """Run the callbacks of batches resolved so far, holding no lock: a callback may
        call send(), flush() or close() (they take the lock), and a slow one must not hold
        up send() in other threads. Only the sender thread and close() resolve batches."""
        if not self._due:
            return
        with self._lock:
            due, self._due = self._due, []
        run_callbacks(due)

    def _sender_turn(self, conns: Connections, meta: MetadataClient) -> None:
        now = time.monotonic()
        if self._refresh_needed or self._wanted_topics or now - meta.metadata.fetched_at > self.metadata_max_age_s:
            self._refresh_metadata(meta)
        if self.idempotent and self.producer_id < 0:
            self._init_producer_id(conns, meta)
            if self.producer_id < 0:
                self._expire_queued(time.monotonic())  # the delivery timeout holds here too
                return
        self._expire_queued(now)
        with self._lock:
            ready = self._acc.ready(now, self._in_flight_slots, self.max_in_flight)
            self._sending = list(ready)
            if ready:
                self._idle_since_s = now  # an orphaned core's idle time starts again (_close_if_abandoned)
        # On a secure cluster a PRODUCE carries one topic: a node refuses a request whole
        # when its principal may not produce one topic in it (docs/PROTOCOL.md section 12),
        # and that failed the batches of topics it may produce, sent along in the same one.
        per_topic = self._security is not None
        by_node: dict[tuple[str, str], list[ProducerBatch]] = {}
        for batch in ready:
            address = meta.metadata.leader_address(batch.topic, batch.partition)
            if address is None:
                self._refresh_needed = True  # the map names no (reachable) leader: ask again
                self._retry(batch, errors.LeaderNotAvailableError(f"no leader known for {batch.topic}/{batch.partition}"), now)
                continue
            by_node.setdefault((address, batch.topic if per_topic else ""), []).append(batch)
        for (address, _topic), batches in by_node.items():
            for group in _request_groups(batches):
                self._send_request(conns, address, group, now)
        with self._lock:
            self._sending = []
            deadline = self._acc.next_deadline_s(self._in_flight_slots, self.max_in_flight)
        timeout_s = SENDER_POLL_MS_MAX / 1000.0
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.0, deadline - time.monotonic()))
        if self._in_flight:
            oldest = min(f.sent_s for f in self._in_flight.values())
            timeout_s = min(timeout_s, max(0.0, oldest + self.request_timeout_s - time.monotonic()))
        for address, frames in conns.poll(math.ceil(timeout_s * 1000)):  # rounded up: never spin
            self._handle_response(address, frames)
            self._run_due()
        while readable(self._wake_pull):
            self._wake_pull.recv(zmq.NOBLOCK)
        self._check_timeouts(conns, meta)

    def _refresh_metadata(self, meta: MetadataClient, avoid: set[str] | None = None) -> None:
        with self._lock:
            wanted = set(self._wanted_topics)
            known = set(self._partition_counts)
            self._refreshes_begun += 1
            begun = self._refreshes_begun
            # The refresh runs on the sender thread, which alone fails batches past their
            # delivery_timeout_ms: it must not outlast the earliest of those deadlines (a
            # cluster that takes connections but never answers held it for ~30 s).
            created = [b.created_s for b in self._pending_batches()]
        deadline_s = None
        if created:
            deadline_s = max(min(created) + self.delivery_timeout_s, time.monotonic() + METADATA_REFRESH_MIN_S)
        try:
            metadata = meta.refresh(sorted(wanted | known) if (wanted or known) else None, avoid=avoid or (),
                                    deadline_s=deadline_s)
        except errors.FabricError as exc:
            cut_short = deadline_s is not None and time.monotonic() >= deadline_s
            # Cut short for a delivery deadline, it proves nothing about the wanted topics:
            # they stay wanted (send() waits for them up to max_block_ms, as it would anyway).
            log.log(logging.DEBUG if cut_short else logging.WARNING, "metadata refresh failed: %s", exc)
            with self._lock:
                self._refreshes_done = begun
                self._metadata_error = exc
                if not cut_short:
                    for topic in wanted:
                        self._unknown_topics[topic] = exc
                        self._wanted_topics.discard(topic)
                self._metadata_ready.notify_all()
            time.sleep(self.retry_backoff_s)
            return
        self._refresh_needed = False
        with self._lock:
            self._metadata_error = None
            self._map_read = True
            for name, topic_meta in metadata.topics.items():
                self._partition_counts[name] = topic_meta.partition_count
                self._message_bytes_max[name] = topic_meta.message_bytes_max
                self._acc.set_message_bytes_max(name, topic_meta.message_bytes_max)
            for topic in wanted:
                if topic not in metadata.topics:
                    # The error the answer listed it with (AUTHORIZATION_FAILED on a secure
                    # cluster, ...): _await_topic raises it, or waits on a retriable one.
                    self._unknown_topics[topic] = meta.topic_error(topic)
                self._wanted_topics.discard(topic)
            self._refreshes_done = begun
            self._metadata_ready.notify_all()

    def _init_producer_id(self, conns: Connections, meta: MetadataClient) -> None:
        """Ask any node for a producer id (nodes hand them out from blocks reserved in ZooKeeper)."""
        with self._lock:
            oldest = min((q[0].created_s for q in self._acc.batches.values() if q), default=None)
        timeout_ms = self.request_timeout_ms
        deadline_s = None
        if oldest is not None:  # do not wait past the oldest record's delivery deadline, all nodes asked together
            deadline_s = max(oldest + self.delivery_timeout_s, time.monotonic() + self.retry_backoff_s)
        try:
            candidates = meta.candidates(deadline_s=deadline_s)
        except errors.FabricError as exc:
            # No node address known yet and the bootstrap (ZooKeeper) did not answer: an
            # outage to wait out, as a failed metadata refresh is, not a reason for the
            # sender thread to die and leave the producer refusing every send for good.
            log.warning("init producer id: %s", exc)
            candidates = []
        for address in candidates:
            if deadline_s is not None:
                timeout_ms = min(self.request_timeout_ms, math.ceil((deadline_s - time.monotonic()) * 1000))
                if timeout_ms <= 0:
                    break
            try:
                body = conns.request(address, ApiKey.INIT_PRODUCER_ID, {"client_id": "python"},
                                     timeout_ms=timeout_ms).body
                errors.raise_for_code(body["error"], "init producer id")
            except errors.FabricError as exc:
                log.warning("init producer id via %s failed: %s", address, exc)
                continue
            self.producer_id, self.producer_epoch = body["producer_id"], body["producer_epoch"]
            return
        time.sleep(self.retry_backoff_s)

    def _encode(self, batch: ProducerBatch) -> bytes:
        """Encode once; a retry resends these exact bytes, sequence numbers included. If the
        encoding fails, the batch's sequence numbers are given back (it never leaves)."""
        if batch.encoded is None and batch.base_sequence >= 0:  # renumbered (_give_back_sequences)
            return self._frame(batch, batch.base_sequence)
        if batch.encoded is None:
            base_sequence = -1
            key = (batch.topic, batch.partition)
            if self.idempotent:
                base_sequence = self._next_sequence.get(key, 0)
                # Sequences wrap from 2^31 - 1 to 0, as the node counts them (Kafka's rule,
                # nodes/producer_state.py): base_sequence is an i32 >= 0.
                self._next_sequence[key] = (base_sequence + batch.record_count) % (I32_MAX + 1)
                batch.base_sequence = base_sequence
                with self._lock:
                    self._unacked.setdefault(key, deque()).append(batch)
            try:
                return self._frame(batch, base_sequence)
            except Exception:
                if self.idempotent:  # it was the last batch numbered for its partition
                    self._next_sequence[key] = base_sequence
                    batch.base_sequence = -1
                    with self._lock:
                        self._unacked[key].remove(batch)
                raise
        return batch.encoded

    def _frame(self, batch: ProducerBatch, base_sequence: int) -> bytes:
        """The batch's bytes, stored in ``batch.encoded``: header, sequence numbers and records."""
        epoch = self._partition_epochs.get((batch.topic, batch.partition), self.producer_epoch)
        if batch.prepared is not None:
            payload, first_ts, bloom = batch.prepared
            batch.encoded = batch_format.frame_batch(
                payload, batch.prepared_count, first_ts, first_ts, producer_id=self.producer_id,
                producer_epoch=epoch, base_sequence=base_sequence, tag_bloom=bloom)
            return batch.encoded
        laid = _records_section(batch.records) if _records_section is not None and not batch.has_headers else None
        if laid is not None:  # the compiled layout (sdk/_speedups.pyx): the same bytes as encode_batch's
            section, first_ts, max_ts = laid
            batch.encoded = batch_format.frame_batch(
                batch_format.compress_records(section, self.codec, adaptive=True), len(batch.records), first_ts,
                max_ts, producer_id=self.producer_id, producer_epoch=epoch, base_sequence=base_sequence)
            return batch.encoded
        timestamps, keys, values, headers = batch.columns()
        batch.encoded = batch_format.encode_batch(
            timestamps, keys, values, headers,
            codec=self.codec, producer_id=self.producer_id, producer_epoch=epoch,
            base_sequence=base_sequence, tag_bloom=tags_format.batch_bloom(headers), adaptive=True,
        )
        return batch.encoded

    def _send_request(self, conns: Connections, address: str, batches: list[ProducerBatch], now: float) -> None:
        frames_batches: list[bytes] = []
        sendable: list[ProducerBatch] = []
        for batch in batches:
            try:
                frames_batches.append(self._encode(batch))
            except Exception as exc:
                # send() refuses what cannot be encoded, so this is a bug; it must cost this
                # batch's records (failed with the reason), never the sender thread and with
                # it every later record of the producer.
                log.exception("a batch of %s/%d could not be encoded", batch.topic, batch.partition)
                with self._lock:
                    self._finish(batch, -1, errors.InvalidRequestError(
                        f"{batch.topic}/{batch.partition}: the batch could not be encoded: {exc!r}"))
                continue
            sendable.append(batch)
        if not sendable:
            return
        batches = sendable
        correlation_id = conns.next_id()
        body = {
            "acks": self.acks,
            "timeout_ms": self.request_timeout_ms,
            "entries": [{"topic": b.topic, "partition": b.partition} for b in batches],
        }
        try:
            # Never wait on a connection that is not up: the sender serves every partition,
            # and one dead leader must not hold up the others (the batches back off and are
            # resent once the metadata names a reachable leader). A new socket gets a short
            # while to connect.
            conns.send(address, apis.encode_request(ApiKey.PRODUCE, body, correlation_id, batches=frames_batches),
                       wait_connect_ms=0 if address in conns.sockets else NEW_CONNECTION_WAIT_MS)
        except errors.FabricError as exc:
            self._refresh_needed = True
            for batch in batches:
                self._retry(batch, exc, now)
            return
        for batch in batches:
            batch.attempts += 1
            if batch.first_sent_s < 0:
                batch.first_sent_s = now
        if self.acks == 0:
            with self._lock:
                for batch in batches:
                    self._finish(batch, -1, None)
            return
        with self._lock:
            self._in_flight[correlation_id] = _InFlight(address, batches, now, conns.drops(address))
            slots = self._in_flight_slots
            for b in batches:
                tp = (b.topic, b.partition)
                # A resend holds every slot of its partition: it goes alone (RecordAccumulator.ready).
                # So does a partition's first batch until one is acknowledged: a node that does
                # not know this producer id yet takes any sequence (nodes/producer_state.py), so
                # a later batch must not reach it before the first one is in the in-sync replicas.
                b.slots = self.max_in_flight if b.attempts > 1 or tp not in self._acknowledged else 1
                slots[tp] = slots.get(tp, 0) + b.slots

    def _handle_response(self, address: str, frames: list[Any]) -> None:
        try:
            message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
        except errors.FabricError as exc:
            log.warning("undecodable response from %s: %s", address, exc)
            return
        if message.header.api_key != ApiKey.PRODUCE:
            # Another API's answer carrying a PRODUCE's correlation id (a node that echoed a
            # wrong one): read as a PRODUCE answer, its body raised KeyError in the sender
            # thread, which died and failed every later record of the producer.
            log.warning("answer of %s from %s is no PRODUCE answer: dropped", message.header.api_key, address)
            return
        with self._lock:
            flight = self._in_flight.pop(message.header.correlation_id, None)
            if flight is None:
                return  # an answer to a request we already timed out and retried
            self._release_slots(flight)
        now = time.monotonic()
        if message.header.error_code:
            request_error = errors.error_for_code(message.header.error_code)(message.body.get("message", ""))
            for batch in flight.batches:  # a request-level error: the request had no effect (PROTOCOL.md 2)
                self._retry_or_fail(batch, request_error, now, refused=True)
            return
        # One result per entry, in the request's order (a partition may have several
        # batches in one request).
        results: list[dict[str, Any] | None] = list(message.body["results"])
        results += [None] * (len(flight.batches) - len(results))
        for batch, result in zip(flight.batches, results, strict=False):
            if result is not None and (result["topic"], result["partition"]) != (batch.topic, batch.partition):
                result = None
            if result is None:
                self._retry_or_fail(batch, errors.UnknownServerError("the node's answer left this batch out"), now)
            elif result["error"] == errors.OutOfOrderSequenceError.code and (
                    not self._is_first_unacked(batch) or batch.encoded is None):
                # An earlier batch of this partition failed or is still on its way (a
                # pipelined request overtook a resend), or was refused while this one was
                # in flight and gave its sequences back (encoded is None: renumbered since
                # it was sent): resend this one after it, in order, with its own numbers.
                self._retry(batch, errors.OutOfOrderSequenceError(result["message"]), now)
            elif result["error"]:
                self._retry_or_fail(batch, errors.error_for_code(result["error"])(result["message"]), now,
                                    refused=result["error"] != errors.OutOfOrderSequenceError.code)
            elif not _answered_offset_possible(result["base_offset"], batch):
                # Written, the answer says, at an offset no log has: handed to the futures it
                # became RecordMetadata.offset (a negative one, or offsets past 2^63 - 1).
                # Failed as an answer left out is: its records may be in the log, so an
                # idempotent producer neither resends them nor gives their numbers back
                # (its later batches of the partition start a new epoch, in order).
                self._retry_or_fail(batch, errors.UnknownServerError(
                    f"{batch.topic}/{batch.partition}: the node's answer gave this batch of {batch.record_count} "
                    f"records base offset {result['base_offset']}: offsets outside [0, {batch_format.OFFSET_MAX}] "
                    f"(its records may have been written)", topic=batch.topic, partition=batch.partition,
                    base_offset=result["base_offset"]), now)
            else:
                with self._lock:
                    self._acknowledged.add((batch.topic, batch.partition))
                    self._finish(batch, result["base_offset"], None)

    def _is_first_unacked(self, batch: ProducerBatch) -> bool:
        with self._lock:
            queue = self._unacked.get((batch.topic, batch.partition))
            return not queue or queue[0] is batch

    def _release_slots(self, flight: _InFlight) -> None:
        """Called with the lock held: the partitions of an ended request may send again."""
        slots = self._in_flight_slots
        for b in flight.batches:
            tp = (b.topic, b.partition)
            left = slots.get(tp, 0) - b.slots
            if left > 0:
                slots[tp] = left
            else:
                slots.pop(tp, None)

    def _retry_or_fail(self, batch: ProducerBatch, exc: errors.FabricError, now: float, *,
                       refused: bool = False) -> None:
        """``refused``: the node answered this batch with ``exc`` (it stored none of it)."""
        if exc.retriable:
            self._refresh_needed = True
            self._retry(batch, exc, now)
        else:
            if isinstance(exc, errors.MessageTooLargeError):
                self._refresh_needed = True  # the topic's limit may have been lowered: later batches close at it
            with self._lock:
                given_back = refused and self._give_back_sequences(batch)
                self._finish(batch, -1, exc, sequences_given_back=given_back)

    def _give_back_sequences(self, batch: ProducerBatch) -> bool:
        """A batch the node refused (an answer for it, not retriable: nothing was stored)
        gives its sequence numbers back, as Kafka's producer adjusts them after a failed
        batch: the partition's later batches move down by its record count and are framed
        again. Without this the node refused every later batch of the partition as
        OUT_OF_ORDER_SEQUENCE, for good (it still expects the refused batch's first number).
        A later batch already in flight was sent with its old numbers: its
        OUT_OF_ORDER_SEQUENCE answer is retried (``_handle_response``). Only a batch sent
        once: an earlier attempt whose answer never came may have been stored, and the node
        checks a batch's size before its sequence, so a retry refused after the topic's limit
        was lowered proves nothing; renumbering then would make the next batch a
        "duplicate" of the stored one and drop it. Lock held."""
        key = (batch.topic, batch.partition)
        numbered = list(self._unacked.get(key, ()))
        if (batch.base_sequence < 0 or batch.attempts > 1 or batch not in numbered
                or id(batch) in self._old_epoch_batches.get(key, ())):  # the numbers now count another epoch
            return False
        count = batch.record_count
        for other in numbered[numbered.index(batch) + 1:]:
            other.base_sequence = (other.base_sequence - count) % (I32_MAX + 1)
            other.encoded = None
        self._next_sequence[key] = (self._next_sequence.get(key, 0) - count) % (I32_MAX + 1)
        return True

    def _new_epoch(self, key: tuple[str, int]) -> None:
        """The partition's sequence numbers lost their continuity (see ``_partition_epochs``):
        batches numbered from now on start at 0 in the next epoch. Lock held."""
        epoch = self._partition_epochs.get(key, self.producer_epoch)
        if not self._bumps_epochs or self.producer_id < 0 or epoch >= EPOCH_MAX:
            return
        self._partition_epochs[key] = epoch + 1
        self._next_sequence[key] = 0
        self._old_epoch_batches[key] = {id(b) for b in self._unacked.get(key, ())}

    def _retry(self, batch: ProducerBatch, exc: BaseException, now: float) -> None:
        with self._lock:
            if now - batch.created_s >= self.delivery_timeout_s:
                self._finish(batch, -1, errors.DeliveryTimeoutError(
                    f"{batch.topic}/{batch.partition}: not acknowledged within delivery_timeout_ms "
                    f"after {batch.attempts} attempts; last error: {exc}"))
                return
            batch.retry_after_s = now + self.retry_backoff_s
            batch.last_error = exc
            self._acc.requeue(batch)

    def _finish(self, batch: ProducerBatch, base_offset: int, exc: BaseException | None, *,
                sequences_given_back: bool = False) -> None:
        """Called with the lock held."""
        self._acc.release(batch)
        self._space.notify_all()
        if batch.base_sequence >= 0:
            key = (batch.topic, batch.partition)
            queue = self._unacked.get(key)
            if queue is not None:
                try:
                    queue.remove(batch)  # almost always the first
                except ValueError:
                    pass
            old = self._old_epoch_batches.get(key)
            if old is not None and id(batch) in old:
                old.discard(id(batch))
            elif exc is not None and not sequences_given_back:
                self._new_epoch(key)
        batch.encoded = None
        if self._sticky_batch.get(batch.topic) is batch:  # its size is final: keep the count, not the batch
            self._sticky_closed_bytes[batch.topic] = self._sticky_closed_bytes.get(batch.topic, 0) + batch.size_bytes
            del self._sticky_batch[batch.topic]
        if exc is not None and self._orphaned:
            self._orphan_lost += batch.record_count  # nobody may look at its futures: logged at close
        self._due += batch.result.settle(base_offset, exc)  # callbacks run once the lock is released

    def _expire_queued(self, now: float) -> None:
        """Fail every queued batch older than delivery_timeout_ms, sendable or not."""
        with self._lock:
            for batch in self._acc.expire(now, self.delivery_timeout_s):
                why = "no producer id yet" if self.idempotent and self.producer_id < 0 else "not acknowledged"
                self._finish(batch, -1, errors.DeliveryTimeoutError(
                    f"{batch.topic}/{batch.partition}: {why} within delivery_timeout_ms="
                    f"{int(self.delivery_timeout_s * 1000)} after {batch.attempts} attempts"
                    + (f"; last error: {batch.last_error}" if batch.last_error is not None else "")))

    def _check_timeouts(self, conns: Connections, meta: MetadataClient) -> None:
        now = time.monotonic()
        expired: list[tuple[int, _InFlight]] = []
        dropped = self._dropped.update(conns, now)

        def suspect(f: _InFlight) -> bool:
            return now - f.sent_s >= LEADER_RECHECK_S or f.address in dropped

        slow = [f for f in self._in_flight.values() if suspect(f)]
        if slow and now - self._last_recheck_s >= LEADER_RECHECK_INTERVAL_S:
            # A killed or paused leader never answers. Rather than wait request_timeout_ms,
            # ask where the partitions are led now (not the silent leader itself); requests
            # to a moved leader are resent (the idempotent producer makes the resend
            # harmless if the first one landed).
            self._last_recheck_s = now
            self._refresh_metadata(meta, avoid={f.address for f in slow})
        moved = {
            cid for cid, f in self._in_flight.items()
            if suspect(f)
            and any(meta.metadata.leader_address(b.topic, b.partition) != f.address for b in f.batches)
        }
        with self._lock:
            # ...or whose connection dropped (a heartbeat closed it while this process was
            # stopped) and came back: the answers went with it (PROTOCOL.md 5.3).
            dropping = {f.address for cid, f in self._in_flight.items()
                        if now - f.sent_s >= self.request_timeout_s or cid in moved
                        or conns.lost_and_back(f.address, f.drops)}
            # A fresh socket for each of those nodes: late answers to the old one are lost,
            # so every request still waiting on it is resent too (in sequence order).
            for correlation_id, flight in list(self._in_flight.items()):
                if flight.address in dropping:
                    expired.append((correlation_id, self._in_flight.pop(correlation_id)))
                    self._release_slots(flight)
        for address in dropping:
            conns.drop(address)
        for _, flight in expired:
            timeout = errors.RequestTimedOutError(f"no answer from {flight.address} (timed out or leader moved)")
            for batch in flight.batches:
                self._retry_or_fail(batch, timeout, now)


def _install_speedups() -> bool:
    """Let the compiled ``send`` and batch layout (sdk/_speedups.pyx) take the common case
    when sdk/accumulator.py loaded them (``accumulator.SPEEDUPS``)."""
    global _records_section, _new_lock, _fast_send
    speedups = accumulator.SPEEDUPS
    if speedups is None:
        return False
    speedups.bind(_ProducerCore._send_python, partition_for_key, RECORD_OVERHEAD_BYTES)
    _new_lock = speedups.FastLock
    _fast_send = speedups.FastSend
    _records_section = speedups.records_section
    return True


# Every core not yet closed, its handle alive or orphaned: flushed at interpreter exit.
# Weak, so that a core whose sender stopped is collected as soon as nothing uses it.
_UNCLOSED_CORES: weakref.WeakSet[_ProducerCore] = weakref.WeakSet()


def _close_unclosed_at_exit() -> None:
    """At interpreter exit, each producer nobody closed flushes for up to
    UNCLOSED_FLUSH_S_MAX and logs what it lost. One hook for every core, apart from the
    handles' finalizers (which only orphan a core): an orphaned core has no finalizer
    left to run. Registered at import, after zmq and logging were imported, so it runs
    before their own exit hooks (atexit runs last-registered first): its sockets and
    its log still work. The sender threads are daemons, still running here."""
    for core in list(_UNCLOSED_CORES):
        core.close_unattended()


atexit.register(_close_unclosed_at_exit)

_records_section: Callable[[list[Any]], tuple[bytes, int, int] | None] | None = None
_new_lock: Callable[[], Any] = threading.Lock  # the compiled send takes a FastLock from C
_fast_send: Callable[[_ProducerCore], Any] | None = None  # a producer's compiled send (sdk/_speedups.pyx)
SPEEDUPS = _install_speedups()  # whether Producer.send runs the compiled fast path


def _forwarded(method: Callable[..., Any]) -> Any:
    """A Producer method that calls its core's: so ``help(Producer)`` shows it, with the
    core's signature and docstring. Each instance replaces it with the core's bound method,
    so a call costs nothing extra."""
    name = method.__name__

    @functools.wraps(method)
    def forward(self: Producer, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._core, name)(*args, **kwargs)

    return forward


class Producer:
    """Send records to topics.

    ``bootstrap``: ``zk://HOST:PORT[/chroot]`` (ZooKeeper) or ``tcp://HOST:PORT,...`` (nodes);
    None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded (ConfigError if neither,
    fabric/bootstrap.py). An empty string is a ValueError, never "find one".

    ``acks``: 0 (fire and forget), 1 (the leader wrote it) or ``"all"``/-1 (every in-sync
    replica has it; the default). ``enable_idempotence`` (default: on with acks=all)
    stamps batches with a producer id and sequences so that retries never duplicate.
    ``linger_ms``: how long a batch waits to fill. ``batch_bytes_max``: the batch closes
    at this many bytes of records (a target: a larger record gets a batch of its own, up
    to the topic's ``message_bytes_max``, 8 MiB by default), or sooner for a topic whose
    ``message_bytes_max`` less the 72-byte batch header is smaller. ``buffer_bytes_max``: memory
    for unsent records; ``send()`` blocks up to ``max_block_ms`` when it is full, then
    raises BufferFullError. Retriable errors are retried until ``delivery_timeout_ms``,
    which holds in every state (no leader, no producer id, no answer); it must be at least
    ``request_timeout_ms`` (else ValueError here). ``send()``'s docstring says what it
    raises at once, what its future raises, and what a ``callback`` may do.

    Call ``close()`` (or use ``with``). A producer garbage-collected without ``close()``
    goes on delivering what it was given, so a temporary works:
    ``Producer(bootstrap).send("t", b"v").result(10)``. It closes itself once it has had
    nothing to send and no call under way for ``ORPHAN_IDLE_S`` (1 s); a send after that
    raises ClientClosedError, and records that failed after the collection are logged.
    A producer still open when the interpreter exits (referenced or not) flushes for up to
    ``UNCLOSED_FLUSH_S_MAX`` (10 s) and logs how many records it could not deliver.

    This is a thin handle: the sender thread holds the ``_ProducerCore`` behind it, not
    the handle, so dropping the last reference to a Producer really collects it and stops
    the thread (after that idle second) instead of leaving it running forever.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        acks: int | str = "all",
        linger_ms: float = 5,
        batch_bytes_max: int = 256 * 1024,
        compression: str = "lz4",
        buffer_bytes_max: int = 64 * 1024 * 1024,
        max_block_ms: int = 60_000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        enable_idempotence: bool | None = None,
        producer_id: int | None = None,
        producer_epoch: int = 0,
        context: zmq.Context[Any] | None = None,
        security: ClientSecurity | None = None,
        max_in_flight: int = MAX_IN_FLIGHT_DEFAULT,
    ) -> None:
        # The same parameters as _ProducerCore (tests/unit/test_producer_handle.py checks it).
        core = _ProducerCore(
            bootstrap, acks=acks, linger_ms=linger_ms, batch_bytes_max=batch_bytes_max, compression=compression,
            buffer_bytes_max=buffer_bytes_max, max_block_ms=max_block_ms, delivery_timeout_ms=delivery_timeout_ms,
            request_timeout_ms=request_timeout_ms, retry_backoff_ms=retry_backoff_ms,
            metadata_max_age_ms=metadata_max_age_ms, enable_idempotence=enable_idempotence,
            producer_id=producer_id, producer_epoch=producer_epoch, context=context, security=security,
            max_in_flight=max_in_flight,
        )
        self._core = core
        # Bound methods of the core: send() on the handle costs no extra call.
        self.send = core.send
        self.send_batch = core.send_batch
        self.flush = core.flush
        self.partitions_for = core.partitions_for
        # finalize holds the core, never the handle. It does not run at interpreter exit:
        # _close_unclosed_at_exit flushes every unclosed core then, orphaned ones included.
        self._finalizer = weakref.finalize(self, core._orphan)
        self._finalizer.atexit = False

    send = _forwarded(_ProducerCore._send_python)
    send_batch = _forwarded(_ProducerCore.send_batch)
    flush = _forwarded(_ProducerCore.flush)
    partitions_for = _forwarded(_ProducerCore.partitions_for)

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, stop the sender thread and close sockets. Unsent records fail with ClientClosedError.
        Returns within ``timeout`` plus at most SENDER_STOP_S (10 s) for the sender thread.
        ``timeout=0`` does not flush: what is not yet acknowledged fails at once."""
        self._finalizer.detach()
        self._core.close(timeout)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Settings and state (acks, producer_id, ...) live on the core.
        return getattr(self._core, name)
