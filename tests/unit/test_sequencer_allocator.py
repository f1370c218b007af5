"""The sequencer's ID and lease rules, with an injected clock and no ZooKeeper."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.protocol.sequencer import (
    FIRST_GLOBAL_ID,
    ID_KIND_RECORDS,
    ID_KIND_TICKS,
    SEQUENCER_GRANT_IDS_MAX,
    Grant,
)
from sequencer.allocator import IdAllocator, Lease, Reservation, takeover

BLOCK = SEQUENCER_GRANT_IDS_MAX


def run_epoch(previous: Reservation, requests: list[int]) -> tuple[Reservation, list[Grant]]:
    """One instance's life: take over from ``previous``, grant ``requests``, writing every
    reservation it asks for (as the service does, version-checked) before granting."""
    state, start = takeover(previous, BLOCK)
    allocator = IdAllocator(state.epoch, start, state.reserved_end, BLOCK)
    grants = []
    for count in requests:
        wanted = allocator.reservation_for(count)
        if wanted is not None:
            state = wanted
            allocator.reserved(wanted)
        grants.append(allocator.grant(count))
    return state, grants


def test_grants_are_consecutive_and_never_repeat_across_failovers() -> None:
    state = Reservation.decode(None)
    seen: list[int] = []
    epochs = []
    for epoch_requests in ([1, 5, BLOCK, 3], [7], [], [BLOCK, BLOCK, 2]):
        state, grants = run_epoch(state, epoch_requests)
        epochs.append(state.epoch)
        for grant in grants:
            seen.extend(range(grant.first_id, grant.end_id))
    assert len(seen) == len(set(seen)), "an ID was issued twice"
    assert seen == sorted(seen), "IDs went backwards across a failover"
    assert seen[0] == FIRST_GLOBAL_ID
    assert epochs == [1, 2, 3, 4]


def test_a_deposed_instance_granting_from_its_range_never_collides_with_its_successor() -> None:
    first, start = takeover(Reservation.decode(None), BLOCK)
    old = IdAllocator(first.epoch, start, first.reserved_end, BLOCK)
    old.grant(10)
    successor_state, successor_start = takeover(first, BLOCK)  # read after the old one's last write
    late = old.grant(100)  # the deposed instance keeps going from memory
    assert late.end_id <= successor_start
    assert successor_state.epoch == first.epoch + 1


def test_reservation_is_asked_before_the_range_runs_out() -> None:
    allocator = IdAllocator(1, 1, 1 + BLOCK, BLOCK)
    assert allocator.reservation_for(10) is None
    allocator.grant(BLOCK // 2 + 1)
    wanted = allocator.reservation_for(1)
    assert wanted is not None and wanted.reserved_end > allocator.reserved_end
    with pytest.raises(RuntimeError):  # granting past the reservation is a bug, never silent
        IdAllocator(1, 1, 5, BLOCK).grant(10)


@pytest.mark.parametrize("count", [-1, SEQUENCER_GRANT_IDS_MAX + 1])
def test_bad_counts_are_refused(count: int) -> None:
    with pytest.raises(errors.InvalidIdCountError):
        IdAllocator(1, 1, 1 + BLOCK, BLOCK).grant(count)


def test_records_end_moves_with_record_grants_only() -> None:
    allocator = IdAllocator(2, 500, 500 + BLOCK, BLOCK)
    assert allocator.grant(0).records_end == 500  # a new epoch assumes the old one used all below
    records = allocator.grant(10, ID_KIND_RECORDS)
    assert records.records_end == 510
    ticks = allocator.grant(3, ID_KIND_TICKS)
    assert (ticks.first_id, ticks.records_end) == (510, 510)
    assert allocator.grant(0).records_end == 510 and allocator.next_id == 513


def test_reservation_round_trip() -> None:
    assert Reservation.decode(Reservation(3, 77).encode()) == Reservation(3, 77)
    assert Reservation.decode(b"") == Reservation(0, FIRST_GLOBAL_ID)


def test_lease_runs_from_the_start_of_the_confirmation() -> None:
    lease = Lease(session_timeout_ms=10_000)  # lease = 8 s
    assert not lease.valid(0.0)
    lease.confirmed(started_at=100.0)
    assert lease.valid(107.9) and not lease.valid(108.0)
    lease.confirmed(started_at=99.0)  # an older confirmation finishing late changes nothing
    assert lease.valid_until == 108.0
    lease.revoke()
    assert not lease.valid(100.0)


def test_a_paused_instance_wakes_without_a_lease() -> None:
    """Paused past its session (SIGSTOP), the instance's last confirmation is older than
    the session: the lease has run out and it must confirm before answering."""
    session_ms = 6_000
    lease = Lease(session_ms)
    confirmations_every_s = lease.length_s / 4
    t = 0.0
    lease.confirmed(t)
    t += confirmations_every_s
    lease.confirmed(t)
    paused_s = session_ms / 1000 + 0.001  # the successor may start right after this
    assert not lease.valid(t + paused_s)
