"""Node-side tag filtering for FETCH v1: skip whole batches whose tag bloom proves that no
record in them matches, without decompressing or re-encoding anything.

The batches that go out are byte for byte what the producer made; the client still
filters every record exactly (``fabric/protocol/tags.py``). What the node saves is wire
bytes and the client's decoding of batches that cannot match.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from fabric.protocol import batch as batch_format
from fabric.protocol.tags import TagFilter

FILTER_READS_MAX: Final[int] = 16  # reads per partition per fetch while everything read is filtered out


def read_filtered(read: Callable[[int, int, int], list[bytes]], offset_limit: int, fetch_offset: int, bytes_max: int,
                  tag_filter: TagFilter) -> tuple[list[bytes], int, int]:
    """``read(offset, bytes_max, offset_limit)`` is the partition log's read. Returns the batches to send,
    the offset the client should continue from (past every batch examined, sent or not;
    -1 when nothing was read) and the bytes left out."""
    kept: list[bytes] = []
    kept_bytes = 0
    filtered_bytes = 0
    offset = fetch_offset
    examined = False
    for _ in range(FILTER_READS_MAX):
        chunk = read(offset, max(1, bytes_max - kept_bytes), offset_limit)
        if not chunk:
            break
        for buf in chunk:
            examined = True
            header = batch_format.read_header(buf)
            if tag_filter.may_match(batch_format.tag_bloom(buf)):
                kept.append(buf)
                kept_bytes += len(buf)
            else:
                filtered_bytes += len(buf)
            offset = max(offset, header.next_offset)
        if kept or kept_bytes >= bytes_max:
            break
    return kept, (offset if examined else -1), filtered_bytes
