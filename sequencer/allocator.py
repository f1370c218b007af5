"""The sequencer's decisions, pure: which IDs to grant, when to reserve, whether it may answer.

Nothing here touches ZooKeeper, a socket or the wall clock; the service
(``sequencer/service.py``) performs the writes these classes ask for and passes the time
in. That keeps the two safety rules testable with an injected clock:

* **Never issue an ID twice.** IDs are granted only from ``[next_id, reserved_end)``,
  where ``reserved_end`` was written to ZooKeeper with a version-checked ``set`` *before*
  any ID below it is handed out. A new active instance starts at the ``reserved_end`` it
  read, so it is above every ID any earlier instance could ever have granted, whatever
  that instance does afterwards.
* **Answer only while provably active** (``Lease``): a confirmation that our own
  ephemeral znode is still held by our session, sent at ``t0``, proves the session cannot
  expire on the server before ``t0 + session timeout`` (the server restarts its expiry
  timer on every message of the session). We answer until ``t0 + 0.8 x session
  timeout``, leaving a fifth of the session for clock-rate differences. A process paused
  past its session finds its lease run out when it wakes, and must confirm again (and
  fails, because the session is gone) before it answers anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fabric.protocol.sequencer import (
    FIRST_GLOBAL_ID,
    ID_KIND_RECORDS,
    SEQUENCER_GRANT_IDS_MAX,
    Grant,
    check_count,
)

# One ZooKeeper write reserves this many IDs. At a million IDs per write, 2^63 IDs last
# longer than anyone's cluster, and a reservation is rare enough to be free.
RESERVATION_BLOCK_IDS_DEFAULT = 1_000_000
LEASE_FRACTION_OF_SESSION = 0.8


@dataclass(frozen=True)
class Reservation:
    """The persistent znode ``/fabric/sequencer/state``: the newest sequencer epoch and the
    end (exclusive) of the highest ID range ever reserved."""

    epoch: int
    reserved_end: int

    def encode(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "reserved_end": self.reserved_end}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Reservation:
        if not raw:
            return cls(0, FIRST_GLOBAL_ID)
        data = json.loads(raw)
        return cls(int(data["epoch"]), int(data["reserved_end"]))


def takeover(previous: Reservation, block_ids: int = RESERVATION_BLOCK_IDS_DEFAULT) -> tuple[Reservation, int]:
    """What a newly elected instance writes (version-checked against ``previous``), and the
    first ID it may grant once that write succeeded: the old ``reserved_end``, which is
    above every ID granted by any earlier epoch."""
    if block_ids < SEQUENCER_GRANT_IDS_MAX:
        raise ValueError(f"block_ids={block_ids} must be at least SEQUENCER_GRANT_IDS_MAX={SEQUENCER_GRANT_IDS_MAX}")
    start = max(previous.reserved_end, FIRST_GLOBAL_ID)
    return Reservation(previous.epoch + 1, start + block_ids), start


class IdAllocator:
    """Grants consecutive IDs from the reserved range of one epoch."""

    def __init__(self, epoch: int, start_id: int, reserved_end: int,
                 block_ids: int = RESERVATION_BLOCK_IDS_DEFAULT) -> None:
        if not FIRST_GLOBAL_ID <= start_id <= reserved_end:
            raise ValueError(f"start_id={start_id} must lie in [{FIRST_GLOBAL_ID}, reserved_end={reserved_end}]")
        self.epoch = epoch
        self.next_id = start_id
        self.reserved_end = reserved_end
        self.block_ids = block_ids
        # An earlier epoch may have granted record IDs up to start_id - 1: assume it did.
        self.records_end = start_id

    @property
    def remaining(self) -> int:
        return self.reserved_end - self.next_id

    def reservation_for(self, count: int) -> Reservation | None:
        """The reservation to write before ``count`` more IDs can be granted, or None when
        the current range covers them. Also asks early, once less than half a block is
        left, so the write seldom sits in front of a request."""
        check_count(count, allow_zero=True)
        if self.remaining >= max(count, self.block_ids // 2):
            return None
        return Reservation(self.epoch, max(self.reserved_end, self.next_id + count) + self.block_ids)

    def reserved(self, reservation: Reservation) -> None:
        """The service's version-checked write of ``reservation`` succeeded."""
        if reservation.epoch != self.epoch or reservation.reserved_end < self.reserved_end:
            raise ValueError(f"reservation {reservation} does not extend epoch {self.epoch} up to {self.reserved_end}")
        self.reserved_end = reservation.reserved_end

    def grant(self, count: int, kind: int = ID_KIND_RECORDS) -> Grant:
        """``count`` IDs (0: none, just the state). Record grants move ``records_end``."""
        check_count(count, allow_zero=True)
        if self.next_id + count > self.reserved_end:
            # A programming error in the service (it must reserve first), never bad input.
            raise RuntimeError(f"grant of {count} from {self.next_id} passes reserved_end={self.reserved_end}")
        first = self.next_id
        self.next_id += count
        if kind == ID_KIND_RECORDS and count:
            self.records_end = self.next_id
        return Grant(self.epoch, first, count, self.records_end)


class Lease:
    """May this instance answer now? Valid until ``t0 + fraction x session timeout`` of the
    latest successful confirmation that started at ``t0`` (monotonic seconds)."""

    def __init__(self, session_timeout_ms: int, fraction: float = LEASE_FRACTION_OF_SESSION) -> None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"lease fraction {fraction} must be in (0, 1)")
        self.length_s = session_timeout_ms / 1000.0 * fraction
        self.valid_until = float("-inf")

    def confirmed(self, started_at: float) -> None:
        """A confirmation sent at ``started_at`` succeeded. An older confirmation that
        finishes late never shortens nor lengthens beyond what its start time proves."""
        self.valid_until = max(self.valid_until, started_at + self.length_s)

    def revoke(self) -> None:
        self.valid_until = float("-inf")

    def valid(self, now: float) -> bool:
        return now < self.valid_until

    def remaining_s(self, now: float) -> float:
        return max(0.0, self.valid_until - now)
