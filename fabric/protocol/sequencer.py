"""The sequencer's wire API (keys 20-29), declared as data like every other schema.

ALLOCATE_IDS (20), version 0::

    request   count i32, kind i8                 how many consecutive IDs, 0..SEQUENCER_GRANT_IDS_MAX;
                                                 kind 0: for records, 1: for ticks (control batches)
    response  epoch i32, first_id i64, count i32, records_end i64
                                                 IDs first_id .. first_id + count - 1; records_end:
                                                 one past the highest ID ever granted for records
                                                 (count 0 asks only for records_end)

The sequencer answers a standby or deposed instance's request with the request-level
error NOT_ACTIVE_SEQUENCER (40) and a count outside the range with INVALID_ID_COUNT
(45), as a header ``error_code`` and an error-message body (docs/PROTOCOL.md section 2).
Pure: bytes in, values out. ``fabric.protocol.apis`` registers these schemas.
"""

from __future__ import annotations

from typing import NamedTuple

from fabric.errors import InvalidIdCountError
from fabric.protocol.schema import Schema

ALLOCATE_IDS_KEY = 20

# 64-bit IDs: 1 is the first ever issued, -1 means "none" in batch headers.
FIRST_GLOBAL_ID = 1
SEQUENCER_GRANT_IDS_MAX = 1_000_000

ID_KIND_RECORDS = 0
ID_KIND_TICKS = 1

ALLOCATE_IDS_REQUEST_V0: Schema = (("count", "i32"), ("kind", "i8"))
ALLOCATE_IDS_RESPONSE_V0: Schema = (("epoch", "i32"), ("first_id", "i64"), ("count", "i32"), ("records_end", "i64"))


class Grant(NamedTuple):
    """IDs ``first_id`` .. ``first_id + id_count - 1``, from the sequencer of ``epoch``."""

    epoch: int
    first_id: int
    id_count: int  # "count" on the wire; a NamedTuple cannot have a field named count
    # One past the highest ID granted for records (not ticks), as the sequencer knows it: a
    # partition whose last ID is below records_end - 1 needs a tick so readers can pass it.
    records_end: int = 0

    @property
    def end_id(self) -> int:
        """One past the last ID of the grant."""
        return self.first_id + self.id_count

    def to_body(self) -> dict[str, int]:
        return {"epoch": self.epoch, "first_id": self.first_id, "count": self.id_count,
                "records_end": self.records_end}

    @classmethod
    def from_body(cls, body: dict[str, int]) -> Grant:
        return cls(int(body["epoch"]), int(body["first_id"]), int(body["count"]), int(body["records_end"]))


def check_count(count: int, *, allow_zero: bool = False) -> int:
    """The requested count, or INVALID_ID_COUNT quoting the limit."""
    low = 0 if allow_zero else 1
    if not low <= count <= SEQUENCER_GRANT_IDS_MAX:
        raise InvalidIdCountError(
            f"asked for {count} IDs; a request takes {low}..{SEQUENCER_GRANT_IDS_MAX} (SEQUENCER_GRANT_IDS_MAX)"
        )
    return count


def check_kind(kind: int) -> int:
    if kind not in (ID_KIND_RECORDS, ID_KIND_TICKS):
        raise InvalidIdCountError(f"kind={kind}: 0 (IDs for records) or 1 (IDs for ticks)")
    return kind
