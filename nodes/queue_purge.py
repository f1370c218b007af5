"""QUEUE_PURGE: settle every message of a queue below its log's end, as SQS's PurgeQueue.

For one group, or for every group (group "" in the request), those the partition holds and
those that start later: each purged group's messages below the end of the log when the
purge came (appended, committed or not) become settled as an ack settles them: not
dead-lettered, not counted as dropped, not delivered again; its leases are dropped (a late
ack of one succeeds, a nack or extend is ALREADY_SETTLED: docs/QUEUES.md). Messages sent
after it are delivered as usual.

Durable as the other decisions: one ``purged`` record per group in ``__queue_state``
(offset: that end; the group-less name "" for the floor of groups that start later),
written before the answer, replayed by a new leader (``SharePartition.mark``) and restated
by snapshots. Idempotent: a repeated purge settles what was sent since, nothing else.
"""

from __future__ import annotations

import logging
from typing import Any

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import queues as qp
from nodes.log import PartitionLog
from nodes.queue_durable import wall_ms
from nodes.queue_groups import QueueGroups
from nodes.queue_share import COUNTING, SharePartition
from nodes.state import Envelope, TopicPartition

log = logging.getLogger("fabric.queues")


class QueuePurge(QueueGroups):
    def _purge(self, envelope: Envelope, request: apis.Message,
               led: list[tuple[TopicPartition, PartitionLog, SharePartition]]) -> None:
        """QUEUE_PURGE on the partitions of the queue this node leads. Everything is checked
        before anything changes (a partition loading or replaying, no room for the group):
        then the node refuses, retriably or not, and nothing is purged here."""
        group = request.body["group"]
        now_ms = wall_ms()
        slots = self._active_slots(request, led)
        for _tp, plog, share in led:
            if group:
                share.check_group_room(group)
            for name in [group] if group else list(share.groups):
                # Every record up to the high watermark read first, so the count is of
                # messages; one a new leader is still replaying is purged on the retry.
                if name in share.groups and not share.ingest(share.groups[name], plog, now_ms):
                    raise errors.CoordinatorLoadInProgressError(
                        f"queue {share.topic}/{share.partition} is still replaying its log; retry")
        results: list[dict[str, Any]] = []
        for (_tp, plog, share), slot in zip(led, slots, strict=True):
            end = plog.log_end_offset
            floor_before = max(share.purge_floor, plog.log_start_offset)  # what an earlier purge of all settled
            names = [group] if group else list(share.groups)
            for name in names:
                g = share.group(name, plog)  # one group's purge makes its state, as a receive would
                self._collect(slot, name, g, g.state.tick(now_ms))  # what was decided before, first
                # Appended but not read yet (not committed, or not replayed): settled as they join.
                # Not below what an earlier purge settled: a group that starts now starts past it.
                unread = max(0, end - max(g.state.next_offset, g.state.purged_below))
                purged = share.purge(g, end) + unread
                if name != COUNTING:
                    self._group_record(slot, name, qp.STATE_PURGED, end, "")
                results.append({"partition": share.partition, "group": name, "end_offset": end, "purged": purged})
            if not group:
                share.purge_floor = max(share.purge_floor, end)  # and groups that start later
                self._group_record(slot, COUNTING, qp.STATE_PURGED, end, "")
                if COUNTING not in names:  # a queue nobody consumes (nor described: no count kept) counts its log
                    unread = max(0, end - floor_before) if not names else 0
                    results.append({"partition": share.partition, "group": COUNTING, "end_offset": end,
                                    "purged": unread})
            log.info("queue %s/%d: purged below offset %d for %s", share.topic, share.partition, end,
                     f"group {group!r}" if group else "every group")
        self._answer_when_durable(envelope, request, slots, results)
