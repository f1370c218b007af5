"""The pure half of ``__queue_state`` compaction (``nodes/queue_compaction.py`` runs it):
what a snapshot of a queue partition writes, how a loader reads it back, and where each
writer's state starts in a ``__queue_state`` partition. No sockets, no storage, no clock.

A snapshot's records carry SNAPSHOT_HEADER (its id). Each group's first is a ``used``
record that also carries the group's dead-letter and drop counts (SNAPSHOT_COUNTS_HEADER);
then the messages below the group's start offset, as done; then each message that is not
as the data log says. The last is the marker that says the snapshot is complete: a
tombstone of the group-less name "", which every loader takes as a no-op.

Counts need care, because a snapshot's counts replace the count of every dead letter and
drop before it: a loader that meets a group's counts forgets what it had counted for the
group, a restated record never counts (``Change.counted``), and a record written after the
snapshot counts as always. A snapshot cut short by a crash so leaves the counts exact too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from fabric import errors
from fabric.protocol import queues as qp
from nodes.log import PartitionLog
from nodes.queue_share import COUNTING, SharePartition
from nodes.queue_state import ACKED, Change

log = logging.getLogger("fabric.queues")

# Snapshot once at least this many records were written (or read at load) since the last
# snapshot and at least twice as many as it wrote: snapshots are then at most a third of
# the writes, and a writer's part of the log at most about three times its live state plus this.
SNAPSHOT_AFTER_RECORDS_MIN: Final[int] = 10_000
# ... or this long after the last one, when anything of the partition is in __queue_state:
# the first record of a queue nobody uses holds back every later record of the partitions
# that share its __queue_state partition until it is restated.
SNAPSHOT_INTERVAL_S: Final[float] = 300.0
# A partition holding more messages than this in all its groups is not snapshotted (a warning
# says so): restating it would stall the node's loop for too long. Its __queue_state grows
# until the backlog shrinks below it.
SNAPSHOT_MESSAGES_MAX: Final[int] = 1_000_000
SNAPSHOT_WRITE_BYTES_MAX: Final[int] = 1024 * 1024  # one write of a snapshot (records: STATE_RECORDS_PER_WRITE)
SNAPSHOT_HEADER: Final[str] = "fabric.snapshot"  # the snapshot's id, on each of its records
SNAPSHOT_COUNTS_HEADER: Final[str] = "fabric.snapshot.finished"  # b"<dead_lettered> <dropped>"
# A restated group record keeps the group's last use as its timestamp (the idle clock of
# queue_group_retention_ms), but never further back than this: a batch's timestamps are i32
# ms deltas from its first, at most about 24.8 days.
SNAPSHOT_TIMESTAMP_SPREAD_MS: Final[int] = 20 * 24 * 3600 * 1000

StateRecord = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]  # timestamp, key, value, headers
WriterKey = tuple[str, int, bytes | None]  # queue, partition, incarnation (None: written before records had it)


def runs(changes: list[Change]) -> list[list[Change]]:
    """Consecutive offsets with the same decision, as one record each (at most STATE_RANGE_MAX)."""
    out: list[list[Change]] = []
    for change in changes:
        run = out[-1] if out else None
        if run is not None and change.offset == run[-1].offset + 1 and len(run) < qp.STATE_RANGE_MAX and (
                change.state, change.delivery_count, change.visible_at_ms, change.reason) == (
                run[0].state, run[0].delivery_count, run[0].visible_at_ms, run[0].reason):
            run.append(change)
        else:
            out.append([change])
    return out


def snapshot_records(share: SharePartition, log_start: int, snapshot_id: bytes, now_ms: int) -> list[StateRecord]:
    """Every group's state as records that, read after the data log from ``log_start`` on,
    rebuild it: per group a ``used`` record with its counts, the messages below its start
    offset as done (ACKED: a restated record never counts), then each message that is not as
    the log says; last, the marker that says the snapshot is complete."""
    headers: list[tuple[str, bytes | None]] = [(SNAPSHOT_HEADER, snapshot_id)]
    out: list[StateRecord] = []
    for name, g in share.groups.items():
        if name == COUNTING:
            continue
        key = qp.state_key(share.topic, share.partition, name)
        used_ms = min(now_ms, max(g.used_ms or now_ms, g.used_written_ms, now_ms - SNAPSHOT_TIMESTAMP_SPREAD_MS))
        counts = f"{g.state.dead_total} {g.state.dropped_total}".encode()
        state = g.state
        out.append((used_ms, key, qp.encode_state_record(state.start_offset, qp.STATE_USED, 0, 0, ""),
                    [*headers, (SNAPSHOT_COUNTS_HEADER, counts)]))
        if state.purged_below > state.start_offset:  # a purge past what the group has read
            out.append((used_ms, key, qp.encode_state_record(state.purged_below, qp.STATE_PURGED, 0, 0, ""), headers))
        for first in range(log_start, state.start_offset, qp.STATE_RANGE_MAX):
            last = min(first + qp.STATE_RANGE_MAX, state.start_offset) - 1
            out.append((used_ms, key, qp.encode_state_record(first, ACKED, 0, 0, "", last_offset=last), headers))
        for run in runs(state.restatement()):
            c = run[0]
            out.append((used_ms, key, qp.encode_state_record(c.offset, c.state, c.delivery_count, c.visible_at_ms,
                                                             c.reason, last_offset=run[-1].offset), headers))
    if share.purge_floor > log_start:  # the floor of groups that start later
        floor = qp.encode_state_record(share.purge_floor, qp.STATE_PURGED, 0, 0, "")
        out.append((now_ms, qp.state_key(share.topic, share.partition, COUNTING), floor, headers))
    marker = qp.encode_state_record(0, qp.STATE_DELETED, 0, 0, "snapshot")
    out.append((now_ms, qp.state_key(share.topic, share.partition, COUNTING), marker, headers))
    return out


def messages_held(share: SharePartition) -> int:
    """How many messages a snapshot of ``share`` walks (SNAPSHOT_MESSAGES_MAX bounds it)."""
    return sum(g.state.next_offset - g.state.start_offset for name, g in share.groups.items() if name != COUNTING)


def split_writes(records: list[StateRecord], records_max: int,
                 bytes_max: int = SNAPSHOT_WRITE_BYTES_MAX) -> list[list[StateRecord]]:
    """Records in order, in writes of at most ``records_max`` records and ``bytes_max``
    bytes (always at least one record)."""
    writes: list[list[StateRecord]] = []
    size = 0
    for record in records:
        record_bytes = len(record[1] or b"") + len(record[2] or b"") + sum(len(k) + len(v or b"") for k, v in record[3]) + 32
        if not writes or len(writes[-1]) >= records_max or size + record_bytes > bytes_max:
            writes.append([])
            size = 0
        writes[-1].append(record)
        size += record_bytes
    return writes


def snapshot_due(records_since: int, last_snapshot_records: int, since_last_s: float) -> bool:
    """The writer's rule: enough written since the last snapshot, or an idle one's turn."""
    if records_since >= max(SNAPSHOT_AFTER_RECORDS_MIN, 2 * last_snapshot_records):
        return True
    return since_last_s >= SNAPSHOT_INTERVAL_S


def load_record(share: SharePartition, plog: PartitionLog, group: str, fields: dict[str, Any],
                headers: list[tuple[str, bytes | None]], record_ms: int, appended_here_ms: int = -1) -> None:
    """Apply one ``__queue_state`` record of ``share`` read while loading (in log order).

    Its times (``record_ms``, its timestamp: the group's idle clock; a message's
    ``visible_at_ms``) are the writing leader's wall clock. ``appended_here_ms``: when this
    node appended its own copy of the record's batch (-1: it holds none), by which they are
    read on this node's clock: a new leader 2 days ahead of the old one otherwise took
    every group for 2 days idler than it was, and ended nack delays early. Without a copy
    they are taken as they are, and ``ShareState.restore`` bounds a delay by what was left
    of it when written (docs/DESIGN.md, "Clocks")."""
    share.records_loaded += 1
    snapshot = header(headers, SNAPSHOT_HEADER)
    # The writer's clock when it wrote the record: a snapshot's records carry each group's
    # last use as their timestamp, and the time the snapshot was taken ends its id.
    written_ms = (snapshot_taken_ms(snapshot) if snapshot is not None else 0) or record_ms
    shift_ms = appended_here_ms - written_ms if appended_here_ms >= 0 else 0  # its clock to ours
    visible_at_ms = fields["visible_at_ms"] + shift_ms if fields["visible_at_ms"] else 0
    written_ms, record_ms = written_ms + shift_ms, record_ms + shift_ms
    state = str(fields["state"])
    if state in qp.GROUP_MARKERS:  # a tombstone or a use, not a message's state
        counts = header(headers, SNAPSHOT_COUNTS_HEADER) if snapshot is not None else None
        if counts is not None and state == qp.STATE_USED:
            dead, dropped = _counts(counts)
            share.snapshot_base(group, dead, dropped, plog, record_ms)
        else:
            share.mark(group, state, record_ms, plog, fields["offset"])
        return
    share.restore(group, fields["offset"], fields["last_offset"],
                  Change(fields["offset"], state, fields["delivery_count"], visible_at_ms, fields["reason"],
                         counted=snapshot is None, written_ms=written_ms), plog, record_ms)


def snapshot_taken_ms(snapshot_id: bytes) -> int:
    """The writer's wall clock when it took the snapshot ``snapshot_id`` names (its id ends
    with it, nodes/queue_compaction.py); 0 if it does not parse."""
    last = snapshot_id.rsplit(b".", 1)[-1]
    return int(last) if last.isdigit() and len(last) < 19 else 0


def state_headers(share: SharePartition) -> list[tuple[str, bytes | None]]:
    """What every ``__queue_state`` record a leader writes carries: its queue's incarnation
    and the leader epoch it writes at (fabric/protocol/queues.py)."""
    return [(qp.HEADER_STATE_INCARNATION, str(share.topic_config.created_ms).encode()),
            (qp.HEADER_STATE_EPOCH, str(share.epoch).encode())]


def written_epoch(headers: list[tuple[str, bytes | None]]) -> int:
    """The leader epoch a state record was written at; -1 when it does not say (written
    before records carried it, or unreadable: taken as current, as before)."""
    raw = header(headers, qp.HEADER_STATE_EPOCH)
    return int(raw) if raw is not None and raw.isdigit() and len(raw) < 19 else -1


def header(headers: list[tuple[str, bytes | None]], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


# One count of ``fabric.snapshot.finished``: ASCII decimal, below 10^18. int() alone took
# any size (and Unicode digits, "_" and spaces): a count of 2^63 or more, which only a
# hand-made record has, went into the group's totals and QUEUE_DESCRIBE then failed with
# UNKNOWN_SERVER_ERROR on every call for that group (its i64 fields cannot hold it).
_COUNT = re.compile(rb"-?[0-9]{1,18}")


def _counts(raw: bytes) -> tuple[int, int]:
    parts = raw.split(b" ")
    if len(parts) != 2 or not all(_COUNT.fullmatch(part) for part in parts):
        log.warning("unreadable snapshot counts %r: counted as 0", raw[:80])
        return 0, 0
    dead, dropped = (int(part) for part in parts)
    return max(0, dead), max(0, dropped)


# -- the trimmer's index, pure -----------------------------------------------------------------
@dataclass
class WriterStart:
    """Where one writer's state starts in a __queue_state partition."""
    floor: int  # its records below this are superseded by a complete snapshot (or none is below)
    newest_ms: int  # when its newest record was appended here (this node's clock, nodes/queue_compaction.py)
    snapshot: bytes = b""  # the snapshot being read, and its first record
    snapshot_first: int = -1


@dataclass
class StateLogIndex:
    """The writers of one ``__queue_state`` partition, read in log order from ``next_offset``."""
    epoch: int
    next_offset: int
    writers: dict[WriterKey, WriterStart] = field(default_factory=dict)
    next_trim_s: float = 0.0

    def add(self, offset: int, key: bytes, appended_ms: int, headers: list[tuple[str, bytes | None]],
            value: bytes | None) -> None:
        parts = key.split(b"\0", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return  # not a queue state record: holds nothing back
        writer = (parts[0].decode("utf-8", "replace"), int(parts[1]), header(headers, qp.HEADER_STATE_INCARNATION))
        start = self.writers.get(writer)
        if start is None:
            start = self.writers[writer] = WriterStart(offset, appended_ms)
        start.newest_ms = max(start.newest_ms, appended_ms)
        snapshot = header(headers, SNAPSHOT_HEADER)
        if snapshot is None:
            return
        if snapshot != start.snapshot:
            start.snapshot, start.snapshot_first = snapshot, offset
        if parts[2] == b"" and value is not None and _is_marker(value):
            start.floor = max(start.floor, start.snapshot_first)  # complete: what lies below is restated

    def floor(self, gone: Callable[[WriterKey, int], bool]) -> int:
        """The lowest offset still needed: no batch wholly below it holds a live writer's
        state. Gone writers are forgotten."""
        for writer in [w for w, s in self.writers.items() if gone(w, s.newest_ms)]:
            del self.writers[writer]
        return min([self.next_offset, *(s.floor for s in self.writers.values())])


def _is_marker(value: bytes) -> bool:
    try:
        return qp.decode_state_record(value)["state"] == qp.STATE_DELETED
    except errors.FabricError:
        return False


