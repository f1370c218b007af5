"""Wall clocks that differ between processes (docs/DESIGN.md, "Clocks"): a queue counts
delays, TTLs and dedup windows from its own append, not from the producer's timestamp; a
new queue leader reads the old one's times on its own clock; the ``__queue_state``
trimmer dates writers by its own clock. Real logs in a temp RocksDB, clocks injected.
(The SDK's side: tests/unit/test_queue_consumer.py; retention: tests/unit/test_retention.py;
real processes under libfaketime: tests/fault/test_clock_skew.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric import zk as zkl
from fabric.protocol import batch
from fabric.protocol import queues as qp
from nodes.log import PartitionLog, Store
from nodes.queue_compaction import QueueCompaction
from nodes.queue_share import SharePartition
from nodes.queue_snapshot import SNAPSHOT_HEADER, StateLogIndex, load_record
from nodes.queue_state import AVAILABLE, DELAYED, Change, QueueConfig, ShareState

DAY_MS = 86_400_000
HOUR_MS = 3_600_000
NOW_MS = 1_700_000_000_000  # this node's clock


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(str(tmp_path / "db"))
    try:
        yield s
    finally:
        s.close()


def _append(store: Store, plog: PartitionLog, records: list[tuple[int, list[tuple[str, bytes | None]]]],
            append_ms: int, key: bytes | None = None, value: bytes = b"v") -> None:
    """One batch of (timestamp, headers) records, appended here at ``append_ms``."""
    raw = bytearray(batch.encode_batch([ts for ts, _ in records], [key] * len(records), [value] * len(records),
                                       [h for _, h in records]))
    wb = store.new_write_batch()
    plog.append(wb, raw, batch.read_header(raw), 0, append_ms)
    store.write(wb)
    plog.high_watermark = plog.log_end_offset


def _share(**config: str) -> SharePartition:
    return SharePartition("jobs", 0, 1, zkl.TopicConfig.build(1, 1, {"queue": "true", **config}, 0))


def test_queue_times_count_from_our_append_not_from_the_producers_clock(store: Store) -> None:
    """Before, every time counted from the record's timestamp, the producer's clock: a
    producer a day behind had its 60 s TTL expire at once (dropped unseen) and a producer a
    day ahead had its 500 ms delay last a day; a dedup id sent again by a producer whose
    clock was a day ahead of the first one's was taken as new."""
    plog = PartitionLog(store, "jobs", 0, 1)
    share = _share()
    _append(store, plog, [(NOW_MS - DAY_MS, qp.send_headers(ttl_ms=60_000, now_ms=0))], NOW_MS)  # offset 0
    _append(store, plog, [(NOW_MS + DAY_MS, qp.send_headers(delay_ms=500, now_ms=0))], NOW_MS)  # offset 1
    _append(store, plog, [(NOW_MS - DAY_MS, qp.send_headers(dedup_id="order-17", now_ms=0))], NOW_MS)  # 2
    _append(store, plog, [(NOW_MS + DAY_MS, qp.send_headers(dedup_id="order-17", now_ms=0))], NOW_MS + 1_000)
    g = share.group("workers", plog)
    assert share.ingest(g, plog, NOW_MS + 100)
    assert g.state.counts()["deduplicated"] == 1  # offset 3 repeats offset 2 one second later
    leases, finished = g.state.acquire("w", 10, NOW_MS + 100)
    assert [lease.offset for lease in leases] == [0, 2] and not finished  # not expired; 1 still delayed
    assert g.state.entry(1).state == DELAYED and g.state.entry(1).visible_at_ms == NOW_MS + 500
    leases, finished = g.state.acquire("w", 10, NOW_MS + 500)
    assert [lease.offset for lease in leases] == [1] and not finished
    assert g.state.entry(0).expires_at_ms == NOW_MS + 60_000  # the TTL counts from the append too


def test_deliver_at_is_a_wall_clock_time_judged_by_ours(store: Store) -> None:
    """``deliver_at_ms`` is the one absolute time a producer gives: ours decides it."""
    plog = PartitionLog(store, "jobs", 0, 1)
    share = _share()
    _append(store, plog, [(NOW_MS - DAY_MS, qp.send_headers(deliver_at_ms=NOW_MS + 2_000, now_ms=NOW_MS))], NOW_MS)
    g = share.group("workers", plog)
    assert share.ingest(g, plog, NOW_MS)
    assert g.state.entry(0).visible_at_ms == NOW_MS + 2_000


def test_a_restored_delay_waits_no_longer_than_was_left_when_written() -> None:
    """A leader 3 h ahead of us wrote a nack (no delay) as visible at its now: restored
    as is, the message stayed hidden 3 h after the failover. Without a copy of the
    record's batch to read its clock by, a delay now lasts at most what was left of it."""
    writer_ms = NOW_MS + 3 * HOUR_MS
    for visible_at_ms, expected_ms in ((writer_ms, NOW_MS), (writer_ms + 120_000, NOW_MS + 120_000)):
        state = ShareState(QueueConfig())
        state.append(0, NOW_MS - 60_000)
        state.restore(Change(0, AVAILABLE, 1, visible_at_ms, "nack", written_ms=writer_ms), NOW_MS)
        assert state.entry(0).visible_at_ms == expected_ms
        assert state.entry(0).state == (AVAILABLE if expected_ms <= NOW_MS else DELAYED)
    # A leader whose clock agrees with ours: the delay ends when it said.
    state = ShareState(QueueConfig())
    state.append(0, NOW_MS - 60_000)
    state.restore(Change(0, DELAYED, 1, NOW_MS + 5_000, "nack", written_ms=NOW_MS - 55_000), NOW_MS)
    assert state.entry(0).visible_at_ms == NOW_MS + 5_000


def test_a_new_leader_reads_the_old_ones_times_on_its_own_clock(store: Store) -> None:
    """The writer's clock is 2 days ahead of ours; we hold a copy of its records' batch,
    appended here at NOW_MS. Its record times, read as they were, made the group look 2
    days idle (expired at once under a 1-day queue_group_retention_ms) and ended a 2 min
    nack delay at once."""
    plog = PartitionLog(store, "jobs", 0, 1)
    _append(store, plog, [(NOW_MS - 1_000, []), (NOW_MS - 1_000, [])], NOW_MS - 1_000)
    share = _share()
    writer_ms = NOW_MS + 2 * DAY_MS
    nack = {"offset": 1, "last_offset": 1, "state": AVAILABLE, "delivery_count": 1,
            "visible_at_ms": writer_ms + 120_000, "reason": "nack"}
    load_record(share, plog, "workers", nack, [], writer_ms, appended_here_ms=NOW_MS)
    g = share.groups["workers"]
    assert g.used_ms == NOW_MS  # its last use, on our clock
    change = g.restore[1]
    assert (change.visible_at_ms, change.written_ms) == (NOW_MS + 120_000, NOW_MS)
    # A snapshot's records carry the group's last use; the time it was taken ends its id.
    share = _share()
    used = {"offset": 0, "last_offset": -1, "state": qp.STATE_USED, "delivery_count": 0, "visible_at_ms": 0,
            "reason": ""}
    load_record(share, plog, "workers", used, [(SNAPSHOT_HEADER, b"2.7.3.%d" % writer_ms)], writer_ms - HOUR_MS,
                appended_here_ms=NOW_MS)
    assert share.groups["workers"].used_ms == NOW_MS - HOUR_MS  # idle an hour, not 2 days and an hour
    # Without a copy here, the times are taken as written (restore bounds the delays).
    share = _share()
    load_record(share, plog, "workers", nack, [], writer_ms)
    assert share.groups["workers"].restore[1].visible_at_ms == writer_ms + 120_000


def test_the_trimmer_dates_writers_by_its_own_clock(store: Store) -> None:
    """A writer is gone (holds nothing back) once out of the routing map and quiet for
    WRITER_GONE_GRACE_MS, by the trimmer's clock: its records' timestamps are the writer's,
    and a writer a day behind had a queue just made taken as gone at once."""
    plog = PartitionLog(store, qp.STATE_TOPIC, 3, 1)
    record = qp.encode_state_record(0, AVAILABLE, 1, 0, "")
    raw = bytearray(batch.encode_batch([NOW_MS - DAY_MS], [qp.state_key("jobs", 0, "workers")], [record],
                                       [[(qp.HEADER_STATE_INCARNATION, b"7")]]))
    wb = store.new_write_batch()
    plog.append(wb, raw, batch.read_header(raw), 0, NOW_MS)
    store.write(wb)
    plog.high_watermark = plog.log_end_offset
    index = StateLogIndex(epoch=1, next_offset=0)
    assert QueueCompaction._scan(plog, index)
    assert index.writers[("jobs", 0, b"7")].newest_ms == NOW_MS


def test_a_repeat_the_old_leader_delivered_is_not_dropped_by_a_copy_dated_later(store: Store) -> None:
    """A replica that was down copies a queue's batches late and dates them by its own
    append (docs/DESIGN.md, "Clocks"): the first send of dedup id X 6 s after the leader
    appended it. The leader took a repeat of X sent 9 s after the first (outside an 8 s
    window) in and delivered it; that replica, now the leader, found the repeat 3 s after
    its copy of the first, dropped it as a duplicate, and the message was lost: never
    delivered again, not acknowledged, not dead-lettered. What the old leader wrote of the
    message says it took it in."""
    plog = PartitionLog(store, "jobs", 0, 1)
    _append(store, plog, [(NOW_MS, qp.send_headers(dedup_id="X", now_ms=0))], NOW_MS)  # offset 0, copied late
    _append(store, plog, [(NOW_MS, qp.send_headers(dedup_id="X", now_ms=0))], NOW_MS + 3_000)  # offset 1
    _append(store, plog, [(NOW_MS, qp.send_headers(dedup_id="X", now_ms=0))], NOW_MS + 4_000)  # offset 2
    share = _share(dedup_window_ms="8000")
    leased = {"offset": 1, "last_offset": 1, "state": "leased", "delivery_count": 1, "visible_at_ms": 0,
              "reason": ""}
    load_record(share, plog, "workers", leased, [], NOW_MS + 5_000, appended_here_ms=NOW_MS + 5_000)
    g = share.groups["workers"]
    assert share.ingest(g, plog, NOW_MS + 6_000)
    leases, _ = g.state.acquire("w", 10, NOW_MS + 6_000)
    # Offset 1 comes back (its lease ended with the old leader); offset 2, of which the old
    # leader wrote nothing, is still a repeat within the window here.
    assert [(lease.offset, lease.delivery_count) for lease in leases] == [(0, 1), (1, 2)]
    assert g.state.counts()["deduplicated"] == 1
