"""Compaction of ``__queue_state``: a snapshot per queue partition, then trimming behind the oldest.

Every lease, ack and nack of a queue is a record in ``__queue_state``; without this the topic
grew for ever and a new leader read all of it. Two halves, usually on different nodes (what
a snapshot holds and how it is read back: ``nodes/queue_snapshot.py``):

* **The writer**, the leader of a queue partition (``_snapshot_if_due``), restates its
  groups when the rule says so, and only when its memory is exactly what ``__queue_state``
  holds: no write in flight, nothing decided and unwritten, every group caught up with its
  log. The snapshot holds the partition's one write slot for all its writes, so no decision
  falls between them; decisions made meanwhile are written after it and win (the newest
  record per offset wins). A write that fails abandons it: what it wrote restates what was
  there, so nothing is lost and nothing needs reloading.
* **The trimmer**, the leader of the ``__queue_state`` partition (``_trim_state_logs``),
  reads its partition's committed records as they come and deletes the batches below the
  oldest place any live writer's state starts (``StateLogIndex``). A writer is gone (holds
  nothing back) when its queue was deleted and made again (a newer incarnation), or no
  longer exists and its newest record is WRITER_GONE_GRACE_MS old (a topic just made may
  not be in this node's routing map yet). A new trimmer reads its partition from the start.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Final

from fabric import errors
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from nodes.log import PartitionLog
from nodes.queue_durable import ACTIVE, STATE_RECORDS_PER_WRITE, Slot, state_partition, wall_ms
from nodes.queue_groups import QueueGroups
from nodes.queue_share import COUNTING, appended_ms
from nodes.queue_snapshot import (
    SNAPSHOT_AFTER_RECORDS_MIN,
    SNAPSHOT_MESSAGES_MAX,
    StateLogIndex,
    WriterKey,
    messages_held,
    snapshot_due,
    snapshot_records,
    split_writes,
    state_headers,
)
from nodes.state import TopicPartition

log = logging.getLogger("fabric.queues")

STATE_SCAN_BYTES_MAX: Final[int] = 1024 * 1024  # __queue_state read per trimmer step
STATE_SCAN_TURN_S: Final[float] = 0.02  # one trimmer step reads at most this long, then yields the loop
STATE_TRIM_INTERVAL_S: Final[float] = 1.0
WRITER_GONE_GRACE_MS: Final[int] = 10 * 60 * 1000


@dataclass
class SnapshotClock:
    """A queue partition's snapshots while this node leads it."""
    slot: Slot
    written_at: int = 0  # ``slot.written`` when the last snapshot began
    loaded_at: int = 0  # ``share.records_loaded`` then
    last_records: int = 0  # how many records the last snapshot wrote
    last_s: float = field(default_factory=time.monotonic)
    sequence: int = 0
    warned_size: bool = False


class QueueCompaction(QueueGroups):
    _snapshots: dict[TopicPartition, SnapshotClock]
    _state_logs: dict[int, StateLogIndex]

    def _snapshot_if_due(self, tp: TopicPartition, plog: PartitionLog, slot: Slot, now: float) -> None:
        """Start a snapshot of ``slot`` when the rule says so and memory is the log."""
        clock = self._snapshots.get(tp)
        if clock is None or clock.slot is not slot:
            clock = self._snapshots[tp] = SnapshotClock(slot)
        share = slot.share
        since = slot.written - clock.written_at + share.records_loaded - clock.loaded_at
        if not (since or clock.sequence) or not snapshot_due(since, clock.last_records, now - clock.last_s):
            return  # nothing of it in __queue_state, or not its turn
        if slot.mode != ACTIVE or slot.flushing or slot.pending or slot.dead or slot.retry_until_s:
            return  # memory is ahead of the log (or a write is failing): not now
        for g in share.groups.values():
            if g.state.next_offset < plog.high_watermark:
                return  # still replaying: records read at the load are not all applied yet
            if g.restore:  # what is left names offsets replayed without it (skipped): never applied
                g.restore = {o: c for o, c in g.restore.items() if o >= g.state.next_offset}
                if g.restore:
                    return
        route = self.node.routing.topic(qp.STATE_TOPIC)
        held = messages_held(share)
        if route is None or held > SNAPSHOT_MESSAGES_MAX:
            if route is not None and not clock.warned_size:
                clock.warned_size = True
                log.warning("queue %s/%d: %d messages held by its groups, more than SNAPSHOT_MESSAGES_MAX (%d): "
                            "its __queue_state is not compacted until fewer are", tp[0], tp[1], held,
                            SNAPSHOT_MESSAGES_MAX)
            return
        clock.warned_size = False
        clock.sequence += 1
        clock.written_at, clock.loaded_at, clock.last_s = slot.written, share.records_loaded, now
        now_ms = wall_ms()  # ends the id too: what a loader reads its records' times against (queue_snapshot.py)
        snapshot_id = f"{self.node.node_id}.{share.epoch}.{clock.sequence}.{now_ms}".encode()
        records = snapshot_records(share, plog.log_start_offset, snapshot_id, now_ms)
        clock.last_records = len(records)
        tags = state_headers(share)
        writes = split_writes([(t, k, v, [*h, *tags]) for t, k, v, h in records], STATE_RECORDS_PER_WRITE)
        k = state_partition(share.topic, share.partition, route.config.partitions)
        slot.flushing = True  # the partition's one write slot, for every write of the snapshot

        def written(index: int, code: int, text: str) -> None:
            if code or index + 1 == len(writes) or self._slots.get(tp) is not slot:
                slot.flushing = False
                if code:  # abandoned: what it wrote restates what was there, nothing is lost
                    log.warning("queue %s/%d: snapshot failed (%s); the next one is due after %d more records",
                                tp[0], tp[1], text or code, SNAPSHOT_AFTER_RECORDS_MIN)
                else:
                    log.info("queue %s/%d: snapshot of %d groups written to %s/%d (%d records)", tp[0], tp[1],
                             sum(1 for name in share.groups if name != COUNTING), qp.STATE_TOPIC, k, len(records))
                if self._slots.get(tp) is slot:
                    self._flush(slot)  # what was decided meanwhile, and its answers
                return
            self._produce(qp.STATE_TOPIC, k, writes[index + 1], lambda c, t: written(index + 1, c, t))

        self._produce(qp.STATE_TOPIC, k, writes[0], lambda c, t: written(0, c, t))

    def _trim_state_logs(self, now: float) -> None:
        """On the leader of a __queue_state partition: read what was written since the last
        step, then delete the batches below every live writer's state."""
        for k in [k for k, index in self._state_logs.items()
                  if self.node.leaders.get((qp.STATE_TOPIC, k)) is None
                  or self.node.leaders[(qp.STATE_TOPIC, k)].epoch != index.epoch]:
            del self._state_logs[k]  # no longer led: a new leader reads it from its start
        route = self.node.routing.topic(qp.STATE_TOPIC)
        for k in range(route.config.partitions if route is not None else 0):
            tp = (qp.STATE_TOPIC, k)
            leader, plog = self.node.leaders.get(tp), self.node.logs.get(tp)
            if leader is None or plog is None:
                continue
            index = self._state_logs.get(k)
            if index is None:
                index = self._state_logs[tp[1]] = StateLogIndex(leader.epoch, plog.log_start_offset)
            if now < index.next_trim_s:
                continue
            if not self._scan(plog, index):
                continue  # more to read: the next turn goes on
            index.next_trim_s = now + STATE_TRIM_INTERVAL_S
            floor = index.floor(self._writer_gone)
            if floor > plog.log_start_offset:
                deleted = self.node.delete_below(tp, floor)
                if deleted:
                    log.info("compacted %s/%d: %d records below %d deleted; %d writers, log starts at %d",
                             tp[0], tp[1], deleted, floor, len(index.writers), plog.log_start_offset)

    @staticmethod
    def _scan(plog: PartitionLog, index: StateLogIndex) -> bool:
        """Read committed records into ``index`` for at most STATE_SCAN_TURN_S; True when all are read."""
        index.next_offset = max(index.next_offset, plog.log_start_offset)
        deadline_s = time.monotonic() + STATE_SCAN_TURN_S
        while index.next_offset < plog.high_watermark:
            try:
                batches = plog.read(index.next_offset, STATE_SCAN_BYTES_MAX, plog.high_watermark)
            except errors.OffsetOutOfRangeError:
                return False
            if not batches:
                return True
            for buf in batches:
                decoded = batch_format.decode_batch(buf, check_crc=False)  # checked when it was appended
                base = decoded.header.base_offset
                # A writer's newest record by our own clock, which _writer_gone reads it
                # against: its timestamp is the writer's, and a writer 10 min behind us had a
                # queue just made (not in our map yet) taken as gone at once.
                appended = appended_ms(plog, base)
                for i, key in enumerate(decoded.keys):
                    if base + i >= index.next_offset and key is not None:
                        index.add(base + i, key, appended if appended >= 0 else decoded.timestamps[i], decoded.headers[i],
                                  decoded.values[i])
                index.next_offset = max(index.next_offset, decoded.header.next_offset)
            if time.monotonic() > deadline_s:
                return index.next_offset >= plog.high_watermark
        return True

    def _writer_gone(self, writer: WriterKey, newest_ms: int) -> bool:
        """A writer whose records no longer hold the log back: its queue was made again
        since (they are a deleted queue's), or it is gone from the routing map and quiet."""
        queue, _partition, incarnation = writer
        route = self.node.routing.topic(queue)
        if route is None:
            return wall_ms() - newest_ms > WRITER_GONE_GRACE_MS
        return incarnation is not None and incarnation.isdigit() and int(incarnation) < route.config.created_ms
