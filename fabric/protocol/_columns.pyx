# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled twin of ``fabric.protocol.batch._record_columns_py``: one pass over a
records section's fixed-width columns, with no Python object per record.

A leader checks every batch a producer sends (``batch.check_records``); in pure Python
that unpacks three Python ints per record and was the largest piece of Python in
staging a batch of small records (about 50 ns a record). Built by scripts/install.sh
with Cython; without it, or with ``FABRIC_PURE_PYTHON=1``, the pure function runs, with
the same results (tests/unit/test_record_columns.py compares the two).
"""

from libc.stdint cimport int32_t, uint16_t
from libc.string cimport memcpy


def record_columns(const unsigned char[::1] records, Py_ssize_t n):
    """(smallest timestamp delta, largest delta, smallest key/value length, sum of the
    non-negative key/value lengths, whether any record has headers) of the first
    ``14 * n`` bytes of ``records``: n i32 deltas, 2n i32 lengths, n u16 header counts,
    little-endian (the caller checks the byte order)."""
    if n < 1 or records.shape[0] < 14 * n:
        raise ValueError(f"a records section of {records.shape[0]} bytes cannot hold {n} records")
    cdef const unsigned char* p = &records[0]
    cdef Py_ssize_t i
    cdef int32_t value
    cdef uint16_t count
    cdef int32_t low, high
    cdef long long total = 0
    cdef bint headers = False
    memcpy(&value, p, 4)
    low = high = value
    for i in range(1, n):
        memcpy(&value, p + 4 * i, 4)
        if value < low:
            low = value
        elif value > high:
            high = value
    cdef const unsigned char* lengths = p + 4 * n
    cdef int32_t shortest
    memcpy(&shortest, lengths, 4)
    for i in range(2 * n):
        memcpy(&value, lengths + 4 * i, 4)
        if value < shortest:
            shortest = value
        if value > 0:
            total += value
    cdef const unsigned char* counts = p + 12 * n
    for i in range(n):
        memcpy(&count, counts + 2 * i, 2)
        if count:
            headers = True
            break
    return low, high, shortest, total, headers
