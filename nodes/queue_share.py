"""One queue partition as its leader holds it: the share states of its groups, fed from
the local log.

The state machine (``nodes/queue_state.py``) decides; this module gives it its input.
Records join a group's share state only once they are below the partition's high
watermark (committed), so a message is never handed out and then lost to a truncation.
Their queue fields come from their headers, and every time in them (when a delay ends,
when a TTL passes, which sends were duplicates) counts from when this node appended the
record's batch, by this node's own clock (``appended_ms``): never from the record's
timestamp, which is the producer's clock (or any time it chose), so a producer a day
ahead or behind neither delays its messages a day nor expires them at once. Every
replica appends a committed batch within milliseconds of the leader (it is committed
once the in-sync replicas have it) and keeps its own append time, so a new leader
replaying the same log reaches the same decisions in real time whatever its clock's
offset from the old leader's (docs/DESIGN.md, "Clocks").

Persisted changes (``__queue_state`` records) are applied as the offsets they name are
replayed, newest per offset winning.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from fabric import errors
from fabric import zk as zkl
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from nodes.log import PartitionLog
from nodes.queue_state import ACKED, DEAD, DROPPED, Change, DedupWindow, QueueConfig, ShareState

log = logging.getLogger("fabric.queues")

INGEST_BYTES_MAX: Final[int] = 256 * 1024  # log bytes read per ingestion step
INGEST_TURN_S: Final[float] = 0.02  # one ingest call replays at most this long, then yields the loop
BATCH_CACHE_MAX: Final[int] = 64  # decoded batches kept for answering receives
COUNTING: Final[str] = ""  # the share state that counts a queue nobody consumes yet
# A consumed batch is kept this much past the dedup window (counted from its append; the
# window itself if shorter): a follower appended it a little later than the leader, so
# as a new leader it must still find the original when it replays the log to rebuild
# the window.
TRIM_CLOCK_SLACK_MS: Final[int] = 60_000

Record = tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]  # timestamp, key, value, headers


def appended_ms(plog: PartitionLog, offset: int) -> int:
    """When this node appended the batch holding ``offset``, by its own wall clock (-1: not
    in the log): what a queue counts delays, TTLs and dedup windows from."""
    index = bisect.bisect_right(plog.bases, offset) - 1
    if index < 0 or plog.entries[index].next_offset <= offset:
        return -1
    return plog.entries[index].append_ms


def copy_appended_ms(local: PartitionLog | None, header: batch_format.BatchHeader) -> int:
    """When this node appended its own copy of the batch ``header`` heads, by its clock (-1:
    it holds none, or not that batch): how a wall time another node wrote in the batch is
    read on this node's clock (``nodes/queue_snapshot.py`` ``load_record``)."""
    if local is None:
        return -1
    index = bisect.bisect_right(local.bases, header.base_offset) - 1
    entry = local.entries[index] if index >= 0 else None
    if entry is None or entry.base_offset != header.base_offset or entry.max_timestamp != header.max_timestamp:
        return -1  # not replicated here yet, or not the same batch
    return entry.append_ms


def _taken_in_before(change: Change | None) -> bool:
    """Whether a change read back from ``__queue_state`` shows that the leader that wrote it
    took its message in rather than dropping it as a repeat (it leased, nacked, dead-lettered
    or dropped it). Our copy's append times are not the old leader's: a copy made late (by a
    replica catching up) can place a repeat inside the dedup window that the old leader
    found outside it, and dropping it here lost a message the old leader had delivered. A
    range acknowledged with no delivery (a snapshot's restatement, repeats included) shows
    nothing."""
    return change is not None and (change.state != ACKED or change.delivery_count > 0)


def queue_config(config: zkl.TopicConfig, topic: str = "") -> QueueConfig:
    dead_letter = config.dead_letter
    if apis.is_internal_topic(dead_letter):
        # Refused at creation (fabric/zk.py); a config written before that was: the node
        # writes dead letters with its own rights, and the producers' key, value and
        # headers in __queue_state or __consumer_offsets would forge state. Dropped instead.
        log.warning("queue %s: dead_letter %r is an internal topic; its poison and expired messages are "
                    "dropped (counted), not written there", topic, dead_letter)
        dead_letter = ""
    return QueueConfig(
        visibility_timeout_ms=config.visibility_timeout_ms, max_deliveries=config.max_deliveries,
        dead_letter=dead_letter, message_ttl_ms=config.message_ttl_ms,
        max_messages=config.max_messages, max_bytes=config.max_bytes)


@dataclass
class Group:
    state: ShareState
    dedup: DedupWindow
    restore: dict[int, Change] = field(default_factory=dict)  # persisted changes not yet replayed
    # Dead letters and drops read while loading whose messages are no longer in the log:
    # counted once loading ends (by offset: a retried write may repeat a record).
    gone: dict[int, str] = field(default_factory=dict)
    # The idle clock of queue_group_retention_ms, wall-clock ms: the group's last receive
    # or settle here, or the newest ``__queue_state`` record of it (so it survives a
    # failover); 0 unknown (the expiry check starts it then). ``used_written_ms``: the
    # newest such time ``__queue_state`` holds.
    used_ms: int = 0
    used_written_ms: int = 0
    # The dead letters and drops a snapshot counted (nodes/queue_compaction.py), added to
    # what the records after it count once loading ends.
    dead_base: int = 0
    dropped_base: int = 0


class SharePartition:
    """The groups of one queue partition on its leader (``epoch``)."""

    def __init__(self, topic: str, partition: int, epoch: int, config: zkl.TopicConfig) -> None:
        self.topic = topic
        self.partition = partition
        self.epoch = epoch
        self.topic_config = config
        self.config = queue_config(config, topic)
        self.groups: dict[str, Group] = {}
        self.records_loaded = 0  # __queue_state records read for it while loading (its compaction's clock)
        self.purge_floor = 0  # a purge of every group settled the log below this, for groups to come too
        self._batches: OrderedDict[int, batch_format.DecodedBatch] = OrderedDict()

    # -- groups ------------------------------------------------------------------------
    def group(self, name: str, plog: PartitionLog) -> Group:
        """The group's share state, made on first use from the start of the log."""
        found = self.groups.get(name)
        if found is None:
            found = self._new_group(plog)
            self.groups[name] = found
            if name != COUNTING:
                self.groups.pop(COUNTING, None)  # a real group counts from now on
        return found

    def count_unconsumed(self, plog: PartitionLog) -> None:
        """A queue partition no group reads yet is counted anyway, by the COUNTING state, so
        its leader reports its depth (a dead-letter queue's alarm, nodes/metrics.py) without
        a describe first. Only a topic made a queue: a plain topic read in queue mode keeps
        its whole log (retention), which COUNTING would hold a state per message of."""
        if not self.groups and self.topic_config.queue:
            self.group(COUNTING, plog)

    def check_group_room(self, name: str) -> None:
        """Refuse a group this partition does not hold yet once it holds QUEUE_GROUPS_MAX."""
        if name in self.groups or name == COUNTING:
            return
        if sum(1 for n in self.groups if n != COUNTING) >= qp.QUEUE_GROUPS_MAX:
            raise errors.GroupMaxSizeReachedError(
                f"queue {self.topic!r} partition {self.partition} already has QUEUE_GROUPS_MAX={qp.QUEUE_GROUPS_MAX} "
                f"groups (each keeps every message's state): receive with one of them, not group {name!r}")

    def view(self, name: str, plog: PartitionLog) -> Group:
        """The group to describe: the group itself; a queue nobody consumes yet counts with
        its stored COUNTING state; a group that does not exist while others do gets a
        throwaway state (what it would see if it started now), never stored."""
        found = self.groups.get(name)
        if found is not None:
            return found
        if not any(n != COUNTING for n in self.groups):
            return self.group(COUNTING, plog)
        return self._new_group(plog)

    def _new_group(self, plog: PartitionLog) -> Group:
        """A group that starts now: at what is left of the log, past what a purge of every
        group settled."""
        g = Group(ShareState(self.config, plog.log_start_offset),
                  DedupWindow(self.topic_config.dedup_window_ms, qp.DEDUP_IDS_MAX))
        if self.purge_floor:
            g.state.purge(self.purge_floor)
        return g

    def purge(self, g: Group, end_offset: int, *, loading: bool = False) -> int:
        """Settle ``g``'s messages below ``end_offset`` (nodes/queue_purge.py); how many of
        those it had read were queued. Changes read back for them no longer apply, but the
        dead letters and drops among them still count."""
        for offset in [o for o in g.restore if o < end_offset]:
            change = g.restore.pop(offset)
            if change.counted and change.state in (DEAD, DROPPED):
                if loading:
                    g.gone[offset] = change.state  # counted once loading ends (``loaded``)
                elif change.state == DEAD:
                    g.state.dead_total += 1
                else:
                    g.state.dropped_total += 1
        return g.state.purge(end_offset)

    def delete_group(self, name: str, now_ms: int) -> None:
        """Forget a group (an admin's delete or its expiry): it no longer counts toward
        QUEUE_GROUPS_MAX nor holds back the trim. Refused while it holds a live lease (as
        Kafka refuses to delete a group with members). The caller writes the tombstone."""
        g = self.groups.get(name)
        if g is None or name == COUNTING:
            raise errors.GroupIdNotFoundError(f"queue {self.topic!r} partition {self.partition} has no group {name!r}")
        leased = g.state.live_leases(now_ms)
        if leased:
            raise errors.GroupNotEmptyError(
                f"group {name!r} holds {leased} live leases on queue {self.topic!r} partition {self.partition}: "
                "stop its workers (or let the leases end) first")
        del self.groups[name]

    def idle_groups(self, now_ms: int, retention_ms: int, busy: set[str], count_max: int) -> list[str]:
        """Up to ``count_max`` groups with no use for ``retention_ms``, no live lease and no
        receive waiting (``busy``): what queue_group_retention_ms expires. A group whose
        last use is unknown starts its clock now. O(groups), at most QUEUE_GROUPS_MAX."""
        out: list[str] = []
        for name, g in self.groups.items():
            if not g.used_ms:
                g.used_ms = now_ms
            if name == COUNTING or name in busy or now_ms - g.used_ms < retention_ms or g.state.live_leases(now_ms):
                continue
            out.append(name)
            if len(out) >= count_max:
                break
        return out

    def mark(self, group: str, state: str, written_ms: int, plog: PartitionLog, offset: int = 0) -> None:
        """A group-wide ``__queue_state`` record read while loading: a tombstone forgets
        every earlier record of the group (a later one starts it afresh, at what is left
        of the log); a use sets its idle clock; a purge settles what is below ``offset``
        (of group "": for every group that starts later)."""
        if state == qp.STATE_DELETED:
            self.groups.pop(group, None)
        elif state == qp.STATE_PURGED and group == COUNTING:
            self.purge_floor = max(self.purge_floor, offset)
        elif state == qp.STATE_PURGED:  # not a use: its idle clock goes on
            self.purge(self.group(group, plog), offset, loading=True)
        else:
            self.used(self.group(group, plog), written_ms, written=True)

    @staticmethod
    def used(g: Group, at_ms: int, *, written: bool = False) -> None:
        g.used_ms = max(g.used_ms, at_ms)
        if written:
            g.used_written_ms = max(g.used_written_ms, at_ms)

    def restore(self, group: str, first: int, last: int, change: Change, plog: PartitionLog,
                written_ms: int = 0) -> None:
        """A persisted change of offsets ``first..last`` read while loading; applied when its
        offsets are replayed. Offsets below the log's start are gone (trimmed once every
        group was done with them, or removed by retention): nothing to keep for them, but
        the group exists from its first record on, so it holds back the next trim."""
        g = self.group(group, plog)
        self.used(g, written_ms, written=True)
        start = plog.log_start_offset
        if change.state in (DEAD, DROPPED) and change.counted:
            for offset in range(first, min(last + 1, start)):
                g.gone[offset] = change.state
        for offset in range(max(first, start), last + 1):
            g.restore[offset] = dataclasses.replace(change, offset=offset)

    def snapshot_base(self, group: str, dead: int, dropped: int, plog: PartitionLog, written_ms: int) -> None:
        """A group's snapshot begins (nodes/queue_compaction.py): it restates the group's
        state and counts every dead letter and drop so far, so none read before it counts
        again (each group's records are read in the order they were written)."""
        g = self.group(group, plog)
        self.used(g, written_ms, written=True)
        g.gone.clear()
        g.restore = {offset: dataclasses.replace(change, counted=False) for offset, change in g.restore.items()}
        g.dead_base, g.dropped_base = dead, dropped

    def loaded(self) -> None:
        """Loading ended: a group's dead letters and drops still count when their messages
        have left the log since (``describe_queue``, the finished counters)."""
        for g in self.groups.values():
            g.state.dead_total += g.dead_base
            g.state.dropped_total += g.dropped_base
            for state in g.gone.values():
                if state == DEAD:
                    g.state.dead_total += 1
                else:
                    g.state.dropped_total += 1
            g.gone.clear()

    def trim_batches(self, plog: PartitionLog, floor: int, now_ms: int) -> int:
        """How many leading batches of the log every group is done with: wholly below
        ``floor`` (the lowest offset some group has not finished, as written to
        ``__queue_state``) and older than the dedup window, so a new leader replaying what
        is left rebuilds the same window. O(batches trimmed)."""
        window_ms = self.topic_config.dedup_window_ms
        horizon_ms = now_ms - window_ms - min(TRIM_CLOCK_SLACK_MS, window_ms)
        count = 0
        for entry in plog.entries:
            # Not by the records' timestamps: the window does not count from them, and a
            # producer a day ahead kept every batch it sent a day past being consumed.
            if entry.next_offset > floor or entry.append_ms >= horizon_ms:
                break
            count += 1
        return count

    # -- ingestion -------------------------------------------------------------------------
    def ingest(self, g: Group, plog: PartitionLog, now_ms: int) -> bool:
        """Feed the group the committed records it has not seen, for at most INGEST_TURN_S;
        True when it has seen them all. A new leader replaying a long backlog so gives the
        loop back between steps: one call replaying it all stalled the node past its
        ZooKeeper lease, which dropped the queue's state, which replayed it again."""
        state = g.state
        if state.next_offset < plog.log_start_offset:
            # Retention removed records this group never finished: they are gone (a queue
            # made by `fabric queue create` keeps its log until its groups are done).
            log.warning("%s/%d: records %d..%d removed by retention before being consumed",
                        self.topic, self.partition, state.next_offset, plog.log_start_offset - 1)
            for offset in range(state.next_offset, plog.log_start_offset):
                state.skip(offset)
        deadline_s = time.monotonic() + INGEST_TURN_S
        # Counting alone nothing is handed out: no batch is kept for receives (every queue
        # partition nobody reads would hold BATCH_CACHE_MAX decoded batches).
        keep = COUNTING not in self.groups
        while state.next_offset < plog.high_watermark:
            batches = plog.read(state.next_offset, INGEST_BYTES_MAX, plog.high_watermark)
            if not batches:
                return True
            for buf in batches:
                decoded = self._decode(buf, keep=keep)
                appended = appended_ms(plog, decoded.header.base_offset)
                self._ingest_batch(g, decoded, now_ms, appended if appended >= 0 else now_ms)
                if time.monotonic() > deadline_s:
                    return state.next_offset >= plog.high_watermark
        return True

    def _ingest_batch(self, g: Group, decoded: batch_format.DecodedBatch, now_ms: int, batch_appended_ms: int) -> None:
        """``batch_appended_ms``: when this node appended the batch (its clock), which every
        time of its records counts from, as SQS counts from when it received a message."""
        state = g.state
        base = decoded.header.base_offset
        control = bool(decoded.header.attributes & batch_format.ATTRIBUTE_CONTROL)
        for i in range(len(decoded.timestamps)):
            offset = base + i
            if offset < state.next_offset:
                continue
            if control:
                state.skip(offset)
                continue
            headers = decoded.headers[i]
            try:
                fields = qp.read_headers(headers) if headers else None
            except errors.FabricError as exc:  # a hand-made bad header: deliver it plainly
                log.warning("%s/%d offset %d: %s; delivered without queue options", self.topic, self.partition,
                            offset, exc)
                fields = None
            if fields is not None and fields["dedup_id"] and not g.dedup.admit(fields["dedup_id"], batch_appended_ms) \
                    and not _taken_in_before(g.restore.get(offset)):
                state.skip(offset, duplicate=True)
                continue
            value = decoded.values[i]
            priority = qp.PRIORITY_DEFAULT
            visible_at = 0
            ttl_ms = 0
            if fields is not None:
                if fields["priority"] is not None and qp.PRIORITY_MIN <= fields["priority"] <= qp.PRIORITY_MAX:
                    priority = fields["priority"]
                # deliver_at_ms is a wall-clock time the producer chose: judged by ours.
                visible_at = fields["deliver_at_ms"] or (batch_appended_ms + fields["delay_ms"] if fields["delay_ms"] else 0)
                ttl_ms = max(0, fields["ttl_ms"])
            state.append(offset, batch_appended_ms, size_bytes=len(value) if value else 0, priority=priority,
                         visible_at_ms=visible_at, ttl_ms=ttl_ms)
            change = g.restore.pop(offset, None)
            if change is not None:
                state.restore(change, now_ms)
        state.next_offset = max(state.next_offset, decoded.header.next_offset)

    # -- reading records back ----------------------------------------------------------------
    def records(self, plog: PartitionLog, offsets: list[int]) -> dict[int, Record]:
        """The records at ``offsets`` (committed, so present unless retention took them)."""
        out: dict[int, Record] = {}
        decoded: batch_format.DecodedBatch | None = None
        for offset in sorted(offsets):  # one batch lookup per batch, not per offset
            if decoded is None or not decoded.header.base_offset <= offset < decoded.header.next_offset:
                decoded = self._batch_holding(plog, offset)
                if decoded is None or not decoded.header.base_offset <= offset < decoded.header.next_offset:
                    decoded = None
                    continue
            i = offset - decoded.header.base_offset
            out[offset] = (decoded.timestamps[i], decoded.keys[i], decoded.values[i], decoded.headers[i])
        return out

    def _batch_holding(self, plog: PartitionLog, offset: int) -> batch_format.DecodedBatch | None:
        for decoded in self._batches.values():
            if decoded.header.base_offset <= offset < decoded.header.next_offset:
                return decoded
        try:
            bufs = plog.read(offset, 1, plog.high_watermark)
        except errors.OffsetOutOfRangeError:
            return None
        return self._decode(bufs[0]) if bufs else None

    def _decode(self, buf: bytes, *, keep: bool = True) -> batch_format.DecodedBatch:
        decoded = batch_format.decode_batch(buf, check_crc=False)  # checked when it was appended
        if not keep:
            return decoded
        self._batches[decoded.header.base_offset] = decoded
        while len(self._batches) > BATCH_CACHE_MAX:
            self._batches.popitem(last=False)
        return decoded

    # -- size limits -------------------------------------------------------------------------
    def check_room(self, plog: PartitionLog, records: int, value_bytes: int, now_ms: int) -> None:
        """QUEUE_FULL when a batch would take the slowest group past the queue's limits,
        counting records appended but not yet committed; with no group yet, every message
        in the log counts. O(new records) per call, not O(backlog)."""
        c = self.config
        if not (c.max_messages or c.max_bytes):
            return
        uncommitted = plog.log_end_offset - plog.high_watermark
        for g in list(self.groups.values()) or [self.group(COUNTING, plog)]:
            # No tick here: what a tick decides (a TTL dead letter) must go through the
            # coordinator's write path; an expiry not yet ticked counts until it is.
            self.ingest(g, plog, now_ms)
            try:
                g.state.check_room(value_bytes, records, uncommitted)
            except errors.QueueFullError as exc:
                raise errors.QueueFullError(f"queue {self.topic}/{self.partition}: {exc.message}") from None
