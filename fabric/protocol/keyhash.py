"""Key to partition: ``crc32(key) mod partition_count``.

CRC-32 is zlib's (IEEE 802.3, reflected polynomial 0xEDB88320, init and final xor
0xFFFFFFFF), the same function as the record-batch checksum, so a C client needs only
zlib's ``crc32()`` and one ``%``::

    uint32_t h = (uint32_t)crc32(0L, key, key_len);
    int32_t partition = (int32_t)(h % partition_count);

Records without a key are spread by the producer's sticky partitioner instead.
"""

from __future__ import annotations

import zlib


def key_hash(key: bytes) -> int:
    """The unsigned 32-bit hash of a key."""
    return zlib.crc32(key) & 0xFFFFFFFF


def partition_for_key(key: bytes, partition_count: int) -> int:
    if partition_count <= 0:
        raise ValueError(f"partition_count must be positive, got {partition_count}")
    return (zlib.crc32(key) & 0xFFFFFFFF) % partition_count
