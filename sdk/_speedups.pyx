# cython: language_level=3, binding=True
"""The compiled twin of ``_ProducerCore.send``'s fast path (issue 15).

``send()`` costs about 2 us of Python per record, almost all of it the bytecode of its one
common case: a bytes value (and maybe a bytes key), no headers or queue options, and the
partition's open batch has room. This module does exactly that case in C and hands every
other call, unchanged, to the pure-Python ``send`` (``_send_python``), so the two cannot
disagree about anything but speed: the records appended (``(timestamp_ms, key, value,
None)``), the accounting, the sticky partition and the future are the same, and the
batch encoder (pure Python, shared) makes identical wire bytes. ``FABRIC_PURE_PYTHON=1``
(read at import) turns it off; ``tests/unit/test_speedups.py`` checks the two side by side.

What makes the C path fast is what it does not do per record: look up its state by name
(``FastSend`` holds it, and is what ``Producer.send`` is bound to), call a lock's Python
methods (``FastLock`` is taken from C), or build a future through ``type.__new__`` and
three attribute stores (``RecordFuture`` here is an extension type with a free list). The
compiled ``RecordFuture`` and ``ProducerBatch`` are twins of sdk/accumulator.py's: the same
attributes as C fields, and its methods (``bind_accumulator``); sdk/accumulator.py uses
them when this module is built.

Built by ``scripts/install.sh`` (``cythonize -i``); without a C compiler the SDK runs on
the pure-Python path and says so at debug level.
"""

cimport cython
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PY_LOCK_ACQUIRED,
    PyLockStatus,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)
    ctypedef long long PY_TIMEOUT_T
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock, PY_TIMEOUT_T, int) nogil

cdef object _python_send = None
cdef object _partition_for_key = None
cdef object _PyFuture = None  # sdk/accumulator.py's RecordFuture and ProducerBatch: their methods run the twins'
cdef object _PyBatch = None
cdef Py_ssize_t _overhead = 0
cdef object _TS_MIN = -(1 << 63)  # a record timestamp is an i64 (batch_format.TIMESTAMP_MS_MIN/MAX)
cdef object _TS_MAX = (1 << 63) - 1


cdef inline bint _in_window(long long ts, long long first_ts) noexcept:
    """Whether ``ts`` is within the i32 delta of a batch whose first record is ``first_ts``
    (batch_format.TIMESTAMP_DELTA_MS_MIN/MAX), without overflow for any two i64s."""
    if ts >= first_ts:
        return <unsigned long long>ts - <unsigned long long>first_ts <= 2147483647ULL
    return <unsigned long long>first_ts - <unsigned long long>ts <= 2147483648ULL


def bind_accumulator(python_future, python_batch):
    """Called once by sdk/accumulator.py with its pure-Python ``RecordFuture`` and
    ``ProducerBatch``: the compiled twins hold their fields in C and run their methods, so
    the two cannot differ in anything but where the fields live."""
    global _PyFuture, _PyBatch
    _PyFuture = python_future
    _PyBatch = python_batch


def bind(python_send, partition_for_key, Py_ssize_t record_overhead_bytes):
    """Called once by sdk/producer.py with the pieces the fast path shares with Python."""
    global _python_send, _partition_for_key, _overhead
    _python_send = python_send
    _partition_for_key = partition_for_key
    _overhead = record_overhead_bytes


cdef inline long long _now_ms():
    # time.time() reads CLOCK_REALTIME too; int(time.time() * 1000) and this both floor.
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef class FastLock:
    """``threading.Lock``'s interface (acquire, release, locked, ``with``) over CPython's own
    lock, so that ``FastSend`` takes and drops the producer's lock with two C calls instead
    of two Python method calls that parse their arguments. ``threading.Condition`` works on
    it as on a Lock. A blocked ``acquire`` waits without the GIL; unlike Lock's, it is not
    interrupted by a signal (the producer holds its lock for microseconds, never across a
    wait: its conditions release it)."""

    cdef PyThread_type_lock _handle
    cdef bint _held

    def __cinit__(self):
        self._handle = PyThread_allocate_lock()
        if self._handle == NULL:
            raise MemoryError("could not allocate a lock")

    def __dealloc__(self):
        if self._handle != NULL:
            if self._held:  # as CPython's lock does: a lock is never freed while held
                PyThread_release_lock(self._handle)
            PyThread_free_lock(self._handle)

    cdef inline bint _try(self) noexcept:
        if PyThread_acquire_lock(self._handle, NOWAIT_LOCK):
            self._held = True
            return True
        return False

    cdef inline void _release(self) noexcept:
        self._held = False
        PyThread_release_lock(self._handle)

    def acquire(self, bint blocking=True, double timeout=-1):
        cdef PY_TIMEOUT_T wait_us
        cdef PyLockStatus status
        if not blocking and timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        if timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be a non-negative number")
        if self._try():
            return True
        if not blocking or timeout == 0:
            return False
        wait_us = -1 if timeout == -1 else <PY_TIMEOUT_T>(timeout * 1e6)
        with nogil:
            status = PyThread_acquire_lock_timed(self._handle, wait_us, 0)
        if status == PY_LOCK_ACQUIRED:
            self._held = True
            return True
        return False

    def release(self):
        if not self._held:
            raise RuntimeError("release unlocked lock")
        self._release()

    def locked(self):
        return self._held

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


@cython.freelist(256)
cdef class RecordFuture:
    """sdk/accumulator.py's ``RecordFuture`` (see there), compiled: what ``Producer.send``
    returns, resolving to RecordMetadata or raising."""

    cdef public object _batch
    cdef public Py_ssize_t _index
    cdef public object _timestamp

    def __init__(self, batch, index, timestamp):
        _PyFuture.__init__(self, batch, index, timestamp)

    def done(self):
        return _PyFuture.done(self)

    def result(self, timeout=None):
        return _PyFuture.result(self, timeout)

    def exception(self, timeout=None):
        return _PyFuture.exception(self, timeout)

    def add_callback(self, callback):
        """``callback(metadata, None)`` on success, ``callback(None, exception)`` on failure."""
        _PyFuture.add_callback(self, callback)


cdef class ProducerBatch:
    """sdk/accumulator.py's ``ProducerBatch`` (see there), compiled: records of one
    partition on their way to one PRODUCE request. ``FastSend`` reads and updates its
    records and size as C fields."""

    cdef public object order, base_sequence, slots, topic, partition, created_s, has_headers, sealed, result
    cdef public object encoded, attempts, retry_after_s, first_sent_s, last_error, prepared, prepared_count
    cdef public list records
    cdef public Py_ssize_t size_bytes

    def __init__(self, topic, partition, created_s, order=0):
        _PyBatch.__init__(self, topic, partition, created_s, order)

    @property
    def record_count(self):
        return _PyBatch.record_count.fget(self)

    def columns(self):
        return _PyBatch.columns(self)


cdef class FastSend:
    """One producer's compiled ``send``: what never changes for a producer, looked up once."""

    cdef object core, acc
    cdef dict partition_counts, sticky, open_batches, topic_limits
    cdef FastLock lock
    cdef public object refusal  # the core's _refusal, mirrored by _ProducerCore._refuse
    cdef Py_ssize_t batch_limit, buffer_max

    def __init__(self, core):
        self.core = core
        self.lock = <FastLock?>core._lock
        self.partition_counts = core._partition_counts
        self.sticky = core._sticky
        self.acc = core._acc
        self.open_batches = core._acc.open
        self.topic_limits = core._acc.topic_limits
        self.batch_limit = core._acc.batch_bytes_max - _overhead
        self.buffer_max = core._acc.buffer_bytes_max
        self.refusal = core._refusal

    cdef RecordFuture _append(self, str topic, bytes value, object key, object chosen, object ts):
        """The record appended to its partition's open batch, when the Python path would do
        just that (the lock held); None for everything else: a new or full batch, the buffer
        limit, a partition to check or to choose, a timestamp outside the batch's window."""
        cdef Py_ssize_t size, count_c, buffered, limit = self.batch_limit
        cdef ProducerBatch batch
        cdef list records
        cdef RecordFuture future
        count = self.partition_counts.get(topic)
        if count is None:
            return None
        count_c = count
        if chosen is None:
            if key is not None:
                chosen = _partition_for_key(key, count_c)
            else:
                chosen = self.sticky.get(topic)
                if chosen is None or chosen >= count_c:
                    return None  # the Python path resets it
        elif not 0 <= chosen < count_c:
            return None  # the Python path raises
        found = self.open_batches.get((topic, chosen))
        if type(found) is not ProducerBatch:
            return None
        batch = <ProducerBatch>found
        if self.topic_limits:  # a topic whose message_bytes_max is below batch_bytes_max
            room = self.topic_limits.get(topic)
            if room is not None:
                limit = <Py_ssize_t>room - _overhead
        size = _overhead + len(value) + (len(<bytes>key) if key is not None else 0)
        records = batch.records
        acc = self.acc
        buffered = acc.buffered_bytes
        if not (batch.size_bytes + size < limit and buffered + size <= self.buffer_max
                and _in_window(ts, (<tuple>records[0])[0])):
            return None
        future = RecordFuture.__new__(RecordFuture)
        future._batch = batch.result
        future._index = len(records)
        future._timestamp = ts
        record = (ts, key, value, None)
        # ints, bytes and None only: it can never be in a cycle, so the cyclic GC need not
        # walk it (CPython untracks such tuples itself, at their first collection; this
        # spares that pass).
        PyObject_GC_UnTrack(record)
        records.append(record)
        batch.size_bytes += size
        acc.buffered_bytes = buffered + size
        return future

    def send(self, topic, value, key=None, headers=None, partition=None, timestamp_ms=None, callback=None,
             tags=None, *, delay_ms=0, deliver_at_ms=0, priority=None, dedup_id="", ttl_ms=0):
        """``_ProducerCore.send`` (see there); this docstring is the compiled path's."""
        cdef RecordFuture future = None
        cdef FastLock lock = self.lock
        if (type(value) is not bytes or (key is not None and type(key) is not bytes) or headers or tags
                or delay_ms or deliver_at_ms or priority is not None or dedup_id or ttl_ms or type(topic) is not str
                or (timestamp_ms is not None and (type(timestamp_ms) is not int
                                                  or not _TS_MIN <= timestamp_ms <= _TS_MAX))
                or (partition is not None and type(partition) is not int)
                or (callback is not None and not callable(callback))):
            return _python_send(self.core, topic, value, key, headers, partition, timestamp_ms, callback, tags,
                                delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, priority=priority,
                                dedup_id=dedup_id, ttl_ms=ttl_ms)
        ts = _now_ms() if timestamp_ms is None else timestamp_ms
        # Only when the lock is free: the sender holds it for a turn's bookkeeping, and the
        # Python path waits for it as it always has. Held, it guards the state as it does on
        # the Python path (a keyed record's hash is Python code, so other threads may run).
        if lock._try():
            try:
                if self.refusal is None:
                    future = self._append(topic, value, key, partition, ts)
            finally:
                lock._release()
        if future is None:  # not the common case: the Python path decides (and raises) as it always has
            return _python_send(self.core, topic, value, key, headers, partition, timestamp_ms, callback, tags)
        if callback is not None:
            future.add_callback(callback)
        return future


from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport int32_t
from libc.string cimport memcpy, memset

cdef Py_ssize_t _NOT_BYTES = -2


cdef inline Py_ssize_t _blob_size(object blob) noexcept:
    """A key's or value's length: -1 for None (null), _NOT_BYTES for anything but bytes."""
    if blob is None:
        return -1
    if type(blob) is not bytes:
        return _NOT_BYTES
    return PyBytes_GET_SIZE(blob)


cdef inline char* _put(object blob, char* length_at, char* blob_at) noexcept:
    """Write a key's or value's i32 length (-1: null) at ``length_at`` and its bytes at
    ``blob_at`` (checked by ``_blob_size`` already); returns where the next one goes."""
    cdef int32_t length = -1
    cdef Py_ssize_t size
    if blob is not None:
        size = PyBytes_GET_SIZE(blob)
        length = <int32_t>size
        memcpy(blob_at, PyBytes_AS_STRING(blob), size)
        blob_at += size
    memcpy(length_at, &length, 4)
    return blob_at


def records_section(list records):
    """The uncompressed records section of a batch of ``(timestamp_ms, key, value, None)``
    tuples, as ``fabric.protocol.batch.encode_batch`` lays it out (PROTOCOL.md section 4):
    ``(section, first_ts, max_ts)``; None when a record is anything else (headers, a
    timestamp delta outside i32) so that the Python encoder decides, and raises, as always."""
    cdef Py_ssize_t n = len(records), i, keys_bytes = 0, values_bytes = 0, length, size
    cdef long long first_ts, max_ts, ts, delta
    cdef object record
    if n == 0:
        return None
    for i in range(n):
        record = records[i]
        if type(record) is not tuple or len(<tuple>record) != 4 or (<tuple>record)[3] is not None:
            return None
        if type((<tuple>record)[0]) is not int:
            return None
        try:
            ts = (<tuple>record)[0]
        except OverflowError:
            return None
        size = _blob_size(<object>PyTuple_GET_ITEM(record, 1))
        if size == _NOT_BYTES:
            return None
        keys_bytes += max(size, 0)
        size = _blob_size(<object>PyTuple_GET_ITEM(record, 2))
        if size == _NOT_BYTES:
            return None
        values_bytes += max(size, 0)
        if i == 0:
            first_ts = ts
            max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        delta = ts - first_ts
        if delta < -2147483648 or delta > 2147483647:
            return None
    length = n * 14 + keys_bytes + values_bytes  # 3 i32 arrays and 1 u16 array, then the blobs
    out = PyBytes_FromStringAndSize(NULL, length)
    cdef char* base = PyBytes_AS_STRING(out)
    cdef char* ts_at = base
    cdef char* key_len_at = base + 4 * n
    cdef char* value_len_at = base + 8 * n
    cdef char* counts_at = base + 12 * n
    cdef char* keys_at = base + 14 * n
    cdef char* values_at = keys_at + keys_bytes
    cdef int32_t delta32
    memset(counts_at, 0, 2 * n)  # no record here has headers
    for i in range(n):  # x86 and arm64 are little-endian, as the wire is
        record = records[i]
        delta32 = <int32_t>(<long long>(<tuple>record)[0] - first_ts)
        memcpy(ts_at + 4 * i, &delta32, 4)
        keys_at = _put(<object>PyTuple_GET_ITEM(record, 1), key_len_at + 4 * i, keys_at)
        values_at = _put(<object>PyTuple_GET_ITEM(record, 2), value_len_at + 4 * i, values_at)
    return out, first_ts, max_ts
