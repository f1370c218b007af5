"""glibc malloc settings for processes that move large buffers (batches of up to 8 MiB).

By default glibc serves every allocation above a threshold (128 KiB at first, raised
dynamically up to 32 MiB) with its own mmap, and returns the top of the heap to the
kernel past 128 KiB of free space. A producer or node building and freeing 256 KiB batches
then pays a fresh mmap, 64 page faults of zeroed memory and a munmap per buffer: measured
on this machine, laying out one 256 KiB batch took 300 µs instead of 20 µs, and encoding
a 1 KB-record batch 610 µs instead of 144 µs (docs/BENCHMARKS.md, "Where 1 KB produce went").

``tune()`` keeps buffers below ``MMAP_THRESHOLD_BYTES`` on the heap and lets up to
``TRIM_THRESHOLD_BYTES`` of free heap stay mapped for reuse: the resident memory a process
keeps beyond what it uses is bounded by that figure. Called by the producer, the consumer
and the node at start; FABRIC_MALLOC_TUNING=0 leaves the allocator alone. A no-op where
the C library has no ``mallopt`` (musl, macOS).
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD_BYTES = 16 * 1024 * 1024  # larger buffers still get their own mmap
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024  # free heap kept mapped for reuse, at most
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

_done = False


def tune() -> bool:
    """Apply the settings once per process; True if they are in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("FABRIC_MALLOC_TUNING", "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _done
