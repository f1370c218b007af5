"""The sequencer's wire API (keys 20-29), declared as data like every other schema.

ALLOCATE_IDS (20), version 0::

    request   count i32                          how many consecutive IDs, 1..SEQUENCER_GRANT_IDS_MAX
    response  epoch i32, first_id i64, count i32 IDs first_id .. first_id + count - 1

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

ALLOCATE_IDS_REQUEST_V0: Schema = (("count", "i32"),)
ALLOCATE_IDS_RESPONSE_V0: Schema = (("epoch", "i32"), ("first_id", "i64"), ("count", "i32"))


class Grant(NamedTuple):
    """IDs ``first_id`` .. ``first_id + id_count - 1``, from the sequencer of ``epoch``."""

    epoch: int
    first_id: int
    id_count: int  # "count" on the wire; a NamedTuple cannot have a field named count

    @property
    def end_id(self) -> int:
        """One past the last ID of the grant."""
        return self.first_id + self.id_count

    def to_body(self) -> dict[str, int]:
        return {"epoch": self.epoch, "first_id": self.first_id, "count": self.id_count}

    @classmethod
    def from_body(cls, body: dict[str, int]) -> Grant:
        return cls(int(body["epoch"]), int(body["first_id"]), int(body["count"]))


def check_count(count: int) -> int:
    """The requested count, or INVALID_ID_COUNT quoting the limit."""
    if not 1 <= count <= SEQUENCER_GRANT_IDS_MAX:
        raise InvalidIdCountError(
            f"asked for {count} IDs; a request takes 1..{SEQUENCER_GRANT_IDS_MAX} (SEQUENCER_GRANT_IDS_MAX)"
        )
    return count
