"""A coordinator's partition of ``__consumer_offsets``: what it holds (``Partition``), how
its records replay into group state, and how it is compacted by restating that state.

Pure: no sockets, no storage; ``nodes/group_coordinator.py`` reads and writes the log.

Records are last-writer-wins per key (a group record per group, an offset record per group
and partition; a record without a value deletes its key), as in Kafka's compacted
``__consumer_offsets``. Kafka's log cleaner keeps that topic small by copying the newest
record of each key into new segments. Here the coordinator does the equivalent with
ordinary writes (``restatement``): when none of its writes is in flight (its memory is then
exactly what the log says), it writes every live key's record again, all in one go so that
no other write falls between them, and once they are all committed it deletes the batches
below the first of them (``NodeState.delete_below``; followers follow the log start). Every
key alive below that offset is restated above it, and a key deleted below it is absent, as
it would be after a replay. A new coordinator so replays the live state and what came
after it, not every commit and heartbeat the group ever made.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Final

from fabric import errors
from fabric.protocol import groups as gp
from nodes.group_state import GroupState

log = logging.getLogger("fabric.groups")

# Restate once at least this many records were written since the last restatement, and at
# least twice the live records: the restatements then add at most half of the partition's
# writes, and its log holds at most about three times its live state plus this many records.
RESTATE_AFTER_RECORDS_MIN: Final[int] = 10_000
# One restating PRODUCE's records (__consumer_offsets takes the default message_bytes_max).
RESTATE_BATCH_BYTES_MAX: Final[int] = 256 * 1024
# How far before the restatement a restated group record's timestamp may lie (20 days:
# a batch's record timestamps are i32 ms deltas from its first, at most about 24.8 days).
RESTATE_TIMESTAMP_SPREAD_MS: Final[int] = 20 * 24 * 3600 * 1000

LOADING: Final[str] = "loading"
ACTIVE: Final[str] = "active"

Record = tuple[bytes, bytes | None]
TimedRecord = tuple[bytes, bytes | None, int]  # and its timestamp (ms)


@dataclass
class Write:
    """One write in flight, and what waits for it."""
    on_done: list[Callable[[int, str], None]] = field(default_factory=list)


@dataclass
class Partition:
    """A partition this node coordinates: its groups, loading progress, writes in flight."""
    partition: int
    leader_epoch: int
    mode: str = LOADING
    groups: dict[str, GroupState] = field(default_factory=dict)
    load_offset: int = 0
    load_in_flight: bool = False
    next_load_s: float = 0.0
    writes: deque[Write] = field(default_factory=deque)  # in flight, in log order
    log_end: int = 0  # past our last committed write: we are the partition's only writer
    written: int = 0  # records loaded or written since the last restatement
    restate_at: int = RESTATE_AFTER_RECORDS_MIN  # look again when ``written`` reaches this
    topics_swept: int = -1  # the TopicsSeen.epoch whose deleted topics' offsets are gone (group_cleanup)


def apply(groups: MutableMapping[str, GroupState], key: bytes, value: bytes | None, now_ms: int,
          record_ms: int = 0) -> None:
    """Replay one record into ``groups``. An unreadable record is skipped with a warning:
    the log is replayed on every leader change, and one bad record must cost only itself.
    ``record_ms``: the record's timestamp, when a group record says the group was last
    active (its members then, or when it became empty; ``restatement_timed`` keeps it)."""
    try:
        decoded = gp.decode_record(key, value)
    except errors.FabricError as exc:
        log.warning("skipping an unreadable group record: %s", exc)
        return
    if decoded is None:
        return
    kind, fields = decoded
    if kind == "offset":
        group_id, topic, partition, offset_value = fields
        group = groups.setdefault(group_id, GroupState(group_id))
        if offset_value is None:
            group.offsets.pop((topic, partition), None)
        else:
            group.offsets[(topic, partition)] = (offset_value["offset"], offset_value["metadata"],
                                                 offset_value["commit_ms"])
    else:
        group_id, group_value = fields
        group = groups.setdefault(group_id, GroupState(group_id))
        group.load_record(group_value, now_ms)
        group.active_ms = max(group.active_ms, record_ms)
        if group_value is None and not group.offsets:
            del groups[group_id]


def live_count(groups: MutableMapping[str, GroupState]) -> int:
    """How many records a restatement of ``groups`` writes."""
    return sum(1 + len(group.offsets) for group in groups.values())


def restatement(groups: MutableMapping[str, GroupState]) -> list[list[Record]]:
    """Every live key's current record, in writes of at most RESTATE_BATCH_BYTES_MAX bytes.
    Replaying them gives ``groups`` back (``apply``); an empty list when nothing is live."""
    return [[(key, value) for key, value, _ in write] for write in restatement_timed(groups, 0)]


def restatement_timed(groups: MutableMapping[str, GroupState], now_ms: int) -> list[list[TimedRecord]]:
    """``restatement`` with each record's timestamp: ``now_ms``, but a group's own record
    keeps when the group was last active, so a restatement does not restart an empty
    group's retention (nodes/group_retention.py). Never more than
    RESTATE_TIMESTAMP_SPREAD_MS before ``now_ms``: a batch's timestamps are i32 deltas."""
    writes: list[list[TimedRecord]] = []
    current: list[TimedRecord] = []
    size = 0
    for group_id, group in groups.items():
        active_ms = now_ms if group.members else max(group.active_ms, now_ms - RESTATE_TIMESTAMP_SPREAD_MS)
        records: list[TimedRecord] = [(gp.group_key(group_id), group.to_record(), min(active_ms, now_ms))]
        records += [(gp.offset_key(group_id, topic, partition), gp.encode_offset_value(*committed), now_ms)
                    for (topic, partition), committed in group.offsets.items()]
        for key, value, timestamp_ms in records:
            record_bytes = len(key) + len(value or b"") + 32  # and its lengths and header share
            if current and size + record_bytes > RESTATE_BATCH_BYTES_MAX:
                writes.append(current)
                current, size = [], 0
            current.append((key, value, timestamp_ms))
            size += record_bytes
    if current:
        writes.append(current)
    return writes
