"""Queue groups coming and going: QUEUE_DELETE_GROUP and the expiry of idle groups.

A group's share state lives as long as its records in ``__queue_state`` say it does, so
removing one is a record too: a tombstone (state ``deleted``, docs/PROTOCOL.md 5.16)
after which a new leader replaying the records forgets everything written for the group
before it. Without it an abandoned group kept its room among QUEUE_GROUPS_MAX and held
back the queue's deletion (the trim waits for every group) for ever.

Expiry is Kafka's offsets retention for queue groups: a group with no receive, no settle
and no live lease for ``queue_group_retention_ms`` is deleted the same way by the
partition's leader, a few groups per check. Its idle clock is the newest of its last use
on this leader and its newest ``__queue_state`` record (by the record's timestamp), and
a group in use writes a ``used`` record whenever what ``__queue_state`` holds is a
quarter of the retention old, so a new leader's clock is at most that far behind.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import queues as qp
from nodes.log import PartitionLog
from nodes.queue_durable import ACTIVE, QueueDurability, Slot, wall_ms
from nodes.queue_share import Group, SharePartition
from nodes.state import Envelope, TopicPartition

log = logging.getLogger("fabric.queues")

GROUPS_EXPIRED_PER_CHECK_MAX: Final[int] = 4  # per partition and check: bounded writes per turn
# A group in use writes a ``used`` record once what __queue_state holds of it is this
# fraction of its retention old: a failover so loses at most that much of its idle clock.
USED_RECORD_FRACTION: Final[int] = 4
REASON_DELETED: Final[str] = "deleted"
REASON_EXPIRED: Final[str] = "expired"


def retention_ms(share: SharePartition, configs: dict[str, Any]) -> int:
    """The group retention in force (an ALTER_TOPIC_CONFIGS applies without a new leader)."""
    config = configs.get(share.topic) or share.topic_config
    return int(config.queue_group_retention_ms)


class QueueGroups(QueueDurability):
    def _group_record(self, slot: Slot, group: str, state: str, offset: int, reason: str) -> None:
        """Queue a group-wide record (a tombstone or a use) behind what is already queued,
        so a replay meets it in the order it was decided."""
        value = qp.encode_state_record(offset, state, 0, 0, reason)
        slot.pending.append((qp.state_key(slot.share.topic, slot.share.partition, group), value))
        slot.queued += 1

    def _touch(self, slot: Slot, group: str, g: Group, now_ms: int) -> None:
        """A receive or a settle used ``group``: its idle clock restarts, and __queue_state
        learns it when what it holds is USED_RECORD_FRACTION of the retention old."""
        slot.share.used(g, now_ms)
        if now_ms - g.used_written_ms >= retention_ms(slot.share, self.node.configs) // USED_RECORD_FRACTION:
            slot.share.used(g, now_ms, written=True)
            self._group_record(slot, group, qp.STATE_USED, g.state.start_offset, "")

    def _delete_group(self, envelope: Envelope, request: apis.Message,
                      led: list[tuple[TopicPartition, PartitionLog, SharePartition]], busy: set[str]) -> None:
        """QUEUE_DELETE_GROUP on the partitions of the queue this node leads. Every one is
        checked before any is changed: a group busy on one of them (a live lease, a receive
        waiting here) is deleted on none, and the answer comes once the tombstones are durable."""
        group = request.body["group"]
        now_ms = wall_ms()
        slots = self._active_slots(request, led)
        results: list[dict[str, Any]] = []
        for slot in slots:
            g = slot.share.groups.get(group)
            if g is None:
                results.append({"partition": slot.share.partition, "error": errors.GroupIdNotFoundError.code})
            elif group in busy or g.state.live_leases(now_ms):
                raise errors.GroupNotEmptyError(
                    f"group {group!r} holds {g.state.live_leases(now_ms)} live leases"
                    f"{' and a waiting receive' if group in busy else ''} on queue {slot.share.topic!r} partition "
                    f"{slot.share.partition}: stop its workers (or let the leases end) first")
            else:
                results.append({"partition": slot.share.partition, "error": 0})
        touched = [slot for slot, r in zip(slots, results, strict=True) if not r["error"]]
        for slot in touched:
            self._tombstone(slot, group, now_ms, REASON_DELETED)
        self._answer_when_durable(envelope, request, touched, results)

    def _active_slots(self, request: apis.Message,
                      led: list[tuple[TopicPartition, PartitionLog, SharePartition]]) -> list[Slot]:
        """The slots of ``led``, all serving: a group-wide change (delete, purge) is refused,
        retriably, while any of them still loads its state."""
        slots = [self._slots[tp] for tp, _plog, _share in led]
        if any(slot.mode != ACTIVE for slot in slots):
            raise errors.CoordinatorLoadInProgressError(
                f"queue {request.body['queue']!r} is loading its state on node {self.node.node_id}; retry")
        return slots

    def _answer_when_durable(self, envelope: Envelope, request: apis.Message, slots: list[Slot],
                             results: list[dict[str, Any]]) -> None:
        """Answer ``results`` per partition once what was decided on ``slots`` is written
        (QUEUE_DELETE_GROUP, QUEUE_PURGE); the write's error instead if it failed."""
        header = request.header

        def answer(code: int, text: str) -> None:
            if code:
                self.node.send_error(envelope, header, errors.error_for_code(code)(text or "queue state write failed"))
            else:
                self.node.send_response(envelope, header, {"error": 0, "message": "", "partitions": results})
        self._after_durable(slots, answer)

    def _tombstone(self, slot: Slot, group: str, now_ms: int, reason: str) -> None:
        share = slot.share
        start = share.groups[group].state.start_offset
        share.delete_group(group, now_ms)
        self._group_record(slot, group, qp.STATE_DELETED, start, reason)
        log.info("queue %s/%d: group %r %s", share.topic, share.partition, group, reason)

    def _expire_groups(self, slot: Slot, now_ms: int, busy: set[str]) -> None:
        """Delete the groups idle past the queue's ``queue_group_retention_ms`` (a few per
        check); the next flush writes their tombstones."""
        share = slot.share
        for name in share.idle_groups(now_ms, retention_ms(share, self.node.configs), busy,
                                      GROUPS_EXPIRED_PER_CHECK_MAX):
            self._tombstone(slot, name, now_ms, REASON_EXPIRED)
