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

Built by ``scripts/install.sh`` (``cythonize -i``); without a C compiler the SDK runs on
the pure-Python path and says so at debug level.
"""

from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(object)

cdef object _python_send = None
cdef object _record_future = None
cdef object _partition_for_key = None
cdef Py_ssize_t _overhead = 0
cdef object _TS_MIN = -(1 << 63)  # a record timestamp is an i64 (batch_format.TIMESTAMP_MS_MIN/MAX)
cdef object _TS_MAX = (1 << 63) - 1


cdef inline bint _in_window(long long ts, long long first_ts) noexcept:
    """Whether ``ts`` is within the i32 delta of a batch whose first record is ``first_ts``
    (batch_format.TIMESTAMP_DELTA_MS_MIN/MAX), without overflow for any two i64s."""
    if ts >= first_ts:
        return <unsigned long long>ts - <unsigned long long>first_ts <= 2147483647ULL
    return <unsigned long long>first_ts - <unsigned long long>ts <= 2147483648ULL


def bind(python_send, record_future, partition_for_key, Py_ssize_t record_overhead_bytes):
    """Called once by sdk/producer.py with the pieces the fast path shares with Python."""
    global _python_send, _record_future, _partition_for_key, _overhead
    _python_send = python_send
    _record_future = record_future
    _partition_for_key = partition_for_key
    _overhead = record_overhead_bytes


cdef inline long long _now_ms():
    # time.time() reads CLOCK_REALTIME too; int(time.time() * 1000) and this both floor.
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <long long>ts.tv_sec * 1000 + ts.tv_nsec // 1000000


cdef class _State:
    """What send reads on every call and that never changes for a producer: looked up once."""
    cdef object acquire, release, partition_counts, sticky, acc, open_batches
    cdef Py_ssize_t batch_limit, buffer_max

    def __init__(self, core):
        self.acquire = core._lock.acquire
        self.release = core._lock.release
        self.partition_counts = core._partition_counts
        self.sticky = core._sticky
        self.acc = core._acc
        self.open_batches = core._acc.open
        self.batch_limit = core._acc.batch_bytes_max - _overhead
        self.buffer_max = core._acc.buffer_bytes_max


def send(self, topic, value, key=None, headers=None, partition=None, timestamp_ms=None, callback=None,
         tags=None, *, delay_ms=0, deliver_at_ms=0, priority=None, dedup_id="", ttl_ms=0):
    """``_ProducerCore.send`` (see there); this docstring is the compiled path's."""
    cdef Py_ssize_t size, count_c, buffered
    cdef _State state
    if (type(value) is not bytes or (key is not None and type(key) is not bytes) or headers or tags
            or delay_ms or deliver_at_ms or priority is not None or dedup_id or ttl_ms or type(topic) is not str
            or (timestamp_ms is not None and (type(timestamp_ms) is not int
                                              or not _TS_MIN <= timestamp_ms <= _TS_MAX))
            or (partition is not None and type(partition) is not int)
            or (callback is not None and not callable(callback))):
        return _python_send(self, topic, value, key, headers, partition, timestamp_ms, callback, tags,
                            delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, priority=priority,
                            dedup_id=dedup_id, ttl_ms=ttl_ms)
    found = getattr(self, "_speedups_state", None)
    if found is None:
        found = _State(self)
        self._speedups_state = found
    state = <_State>found
    ts = _now_ms() if timestamp_ms is None else timestamp_ms
    chosen = partition
    future = None
    state.acquire()
    try:
        if self._refusal is None:
            count = state.partition_counts.get(topic)
            if count is not None:
                count_c = count
                if chosen is None:
                    if key is not None:
                        chosen = _partition_for_key(key, count_c)
                    else:
                        chosen = state.sticky.get(topic)
                        if chosen is not None and chosen >= count_c:
                            chosen = None  # the Python path resets it
                elif not 0 <= chosen < count_c:
                    chosen = None  # the Python path raises
                if chosen is not None:
                    size = _overhead + len(<bytes>value) + (len(<bytes>key) if key is not None else 0)
                    batch = state.open_batches.get((topic, chosen))
                    if batch is not None:
                        acc = state.acc
                        buffered = acc.buffered_bytes
                        records = batch.records
                        if (batch.size_bytes + size < state.batch_limit and buffered + size <= state.buffer_max
                                and _in_window(ts, (<tuple>(<list>records)[0])[0])):
                            future = _record_future.__new__(_record_future)
                            future._batch = batch.result
                            future._index = len(records)
                            future._timestamp = ts
                            record = (ts, key, value, None)
                            # ints, bytes and None only: it can never be in a cycle, so the
                            # cyclic GC need not walk it (CPython untracks such tuples itself,
                            # at their first collection; this spares that pass).
                            PyObject_GC_UnTrack(record)
                            records.append(record)
                            batch.size_bytes += size
                            acc.buffered_bytes = buffered + size
    finally:
        state.release()
    if future is None:  # not the common case: the Python path decides (and raises) as it always has
        return _python_send(self, topic, value, key, headers, partition, timestamp_ms, callback, tags)
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
