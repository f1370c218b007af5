"""Queue mode on a storage node: the leader of a queue partition hands out its messages.

Per (queue partition, group) a share state (``nodes/queue_state.py``) decides who holds what;
``nodes/queue_share.py`` feeds it the partition's committed records; ``nodes/queue_durable.py``
writes what it decided to ``__queue_state`` before any answer depends on it and reads it back
after a leadership change. This module serves QUEUE_RECEIVE (long-polled), QUEUE_SETTLE (ack,
nack, extend, batched) and QUEUE_DESCRIBE, follows leadership and runs the timers
(QUEUE_DELETE_GROUP and group expiry: ``nodes/queue_groups.py``; QUEUE_PURGE:
``nodes/queue_purge.py``). A new leader keeps acknowledged messages done and delivery
counts; leases in flight at a failure are not kept (their messages are delivered again:
at-least-once). Everything runs on the node's loop thread.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Final

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from nodes.log import PartitionLog
from nodes.queue_durable import ACTIVE, LOADING, STATE_TOPIC_PARTITIONS, Slot, wall_ms
from nodes.queue_leases import QueueLeases
from nodes.queue_purge import QueuePurge
from nodes.queue_share import COUNTING, SharePartition, appended_ms
from nodes.queue_state import Finished, check_receive_wait_ms, check_visibility_ms
from nodes.state import Envelope, NodeState, TopicPartition

log = logging.getLogger("fabric.queues")

QUEUE_APIS: Final[frozenset[int]] = frozenset(key for key, _ in qp.SCHEMAS)
PARKED_RECEIVES_MAX: Final[int] = 10_000  # long polls waiting on this node; past it, answered empty
LOAD_WAIT_S: Final[float] = 2.0  # even a receive with wait_ms 0 waits this long for a loading partition
# A new leader loads its queue partitions within this of its election, unasked (adopt).
ADOPT_INTERVAL_S: Final[float] = 5.0
TRIM_INTERVAL_S: Final[float] = 1.0  # how often a queue partition's leader deletes what every group is done with


@dataclass
class _Parked:
    envelope: Envelope
    request: apis.Message
    deadline_s: float
    arrived_s: float = 0.0


class QueueCoordinator(QueueLeases, QueuePurge):
    def __init__(self, node: NodeState) -> None:
        super().__init__(node)
        self._snapshots, self._state_logs = {}, {}  # nodes/queue_compaction.py
        self._parked: list[_Parked] = []
        # Long polls are retried only when something they wait for may have changed (new
        # committed data, a delay or lease ending, a nack, a load finishing, leadership
        # moving) or their wait ends, not on every turn of a busy loop.
        node.change_listeners.append(self._on_change)
        self._turn = 0
        self._catching_up = False  # a group is still replaying its partition's backlog

    # -- requests ---------------------------------------------------------------------------
    def handle(self, envelope: Envelope, request: apis.Message) -> None:
        api = request.header.api_key
        body = request.body
        if api not in (ApiKey.QUEUE_DESCRIBE, ApiKey.QUEUE_PURGE) or body["group"]:  # "": every group
            _check_name("group", body["group"])
        if api == ApiKey.QUEUE_RECEIVE:
            self._receive(envelope, request)
        elif api == ApiKey.QUEUE_SETTLE:
            self._settle(envelope, request)
        elif api == ApiKey.QUEUE_DESCRIBE:
            self.node.send_response(envelope, request.header, self._describe(body["queue"], body["group"]))
        elif api == ApiKey.QUEUE_DELETE_GROUP:
            self._delete_group(envelope, request, self._led(body["queue"], -1), self._waiting(body["queue"]))
        elif api == ApiKey.QUEUE_PURGE:
            self._purge(envelope, request, self._led(body["queue"], -1))
        else:
            raise errors.UnknownApiError(f"api {api} is not a queue api")

    def _receive(self, envelope: Envelope, request: apis.Message) -> None:
        body = request.body
        _check_name("consumer_id", body["consumer_id"])
        if not 1 <= body["max_messages"] <= qp.RECEIVE_MESSAGES_MAX:
            raise errors.InvalidRequestError(
                f"max_messages {body['max_messages']} outside 1..RECEIVE_MESSAGES_MAX ({qp.RECEIVE_MESSAGES_MAX})")
        check_receive_wait_ms(body["wait_ms"])
        if body["visibility_timeout_ms"]:
            check_visibility_ms(body["visibility_timeout_ms"])
        self._led(body["queue"], body["partition"])  # refuse now if we lead none of it
        now = time.monotonic()
        parked = _Parked(envelope, request, now + body["wait_ms"] / 1000.0, now)
        if self._try_receive(parked, final=body["wait_ms"] == 0):
            return
        if len(self._parked) >= PARKED_RECEIVES_MAX:  # no room to wait, for a loading partition either
            self._try_receive(parked, final=True, may_wait=False)
        else:
            self._parked.append(parked)

    def _led(self, queue: str, partition: int) -> list[tuple[TopicPartition, PartitionLog, SharePartition]]:
        """The partitions of ``queue`` the request names that this node leads, each with its
        share (made and loading on first use); raises the error that sends the client on."""
        node = self.node
        node.check_write_allowed(1)  # answers steer workers: only within our lease
        if partition < -1:
            raise errors.InvalidRequestError(f"partition {partition}: a partition number, or -1 for every one led here")
        if partition >= 0:
            tps = [(queue, partition)]
        else:
            tps = sorted(tp for tp in node.leaders if tp[0] == queue)
            if not tps:
                if node.routing.topic(queue) is None:
                    raise errors.UnknownTopicOrPartitionError(f"unknown queue {queue!r}")
                raise errors.NotLeaderError(f"node {node.node_id} leads no partition of queue {queue!r}")
        out = []
        for tp in tps:
            plog, slot = self._slot(tp)
            out.append((tp, plog, slot.share))
        return out

    def adopt(self, tps: list[TopicPartition]) -> None:
        """Load the queue partitions led but not served since the election, as Kafka's group
        coordinator loads its groups when elected: their snapshots run (one never loaded held
        back its __queue_state partition's compaction for good), their first receive is ready."""
        for tp in tps:
            if tp not in self._slots:
                with contextlib.suppress(errors.FabricError):  # not ready to lead it yet: the next look
                    self._slot(tp)

    def _slot(self, tp: TopicPartition) -> tuple[PartitionLog, Slot]:
        plog, leader, config = self.node.leader_log(*tp)
        slot = self._slots.get(tp)
        if slot is not None and slot.share.epoch != leader.epoch:
            self._drop(slot, "leadership moved")  # its waiting answers are told, not stranded
            slot = None
        if slot is None:
            slot = Slot(SharePartition(tp[0], tp[1], leader.epoch, config))
            self._slots[tp] = slot
            log.info("queue %s/%d (epoch %d): loading its state", tp[0], tp[1], leader.epoch)
        return plog, slot

    def _try_receive(self, parked: _Parked, *, final: bool, may_wait: bool = True) -> bool:
        """Lease what is visible and answer once that is durable; False to keep waiting
        (never with ``may_wait`` False: then it answers, empty if need be)."""
        body = parked.request.body
        try:
            led = self._led(body["queue"], body["partition"])
        except errors.FabricError as exc:
            self.node.send_error(parked.envelope, parked.request.header, exc)
            return True
        if final and may_wait and any(self._slots[tp].mode != ACTIVE for tp, _plog, _share in led) \
                and time.monotonic() < parked.arrived_s + LOAD_WAIT_S:
            final = False  # a partition is still reading its state (first use, new leader): wait for it
        now_ms = wall_ms()
        self._turn += 1
        remaining = body["max_messages"]
        answer_bytes = 0
        messages: list[dict[str, Any]] = []
        touched: list[Slot] = []
        try:  # before any lease is taken: a refusal must not strand the leases of other partitions
            for _tp, _plog, share in led:
                share.check_group_room(body["group"])
        except errors.GroupMaxSizeReachedError as exc:
            self.node.send_error(parked.envelope, parked.request.header, exc)
            return True
        for i in range(len(led)):
            tp, plog, share = led[(self._turn + i) % len(led)]  # rotate: no partition starves
            slot = self._slots[tp]
            if slot.mode != ACTIVE or remaining <= 0:
                continue
            g = share.group(body["group"], plog)
            share.ingest(g, plog, now_ms)
            if answer_bytes >= qp.RECEIVE_BYTES_MAX:
                break
            leases, finished = g.state.acquire(body["consumer_id"], remaining, now_ms, body["visibility_timeout_ms"],
                                               bytes_max=qp.RECEIVE_BYTES_MAX - answer_bytes, unanswered=True)
            self._collect(slot, body["group"], g, finished)
            self._touch(slot, body["group"], g, now_ms)
            touched.append(slot)
            if not leases:
                continue
            remaining -= len(leases)
            records = share.records(plog, [lease.offset for lease in leases])
            answer_bytes += sum(len(r[2] or b"") for r in records.values())
            for lease in leases:
                ts, key, value, headers = records.get(lease.offset, (0, None, None, []))
                entry = g.state.entry(lease.offset)
                messages.append({
                    "partition": tp[1], "offset": lease.offset, "delivery_count": lease.delivery_count,
                    "deadline_ms": lease.deadline_ms, "timestamp_ms": ts,
                    "priority": entry.priority if entry is not None else qp.PRIORITY_DEFAULT,
                    "key": key, "value": value, "headers": [{"key": k, "value": v} for k, v in headers]})
        if not messages and not final:
            for slot in touched:
                self._flush(slot)
            return False
        header, envelope = parked.request.header, parked.envelope

        def answer(code: int, text: str) -> None:
            if code:
                self.node.send_error(envelope, header, errors.error_for_code(code)(text or "queue state write failed"))
                self._unlease(body, messages)  # never handed out: back now, not counted
                return
            now_ms, handed = self._hand_over(body, messages)  # lease clocks start now (queue_leases.py)
            if not self.node.send_response(envelope, header, {"error": 0, "message": "", "messages": handed,
                                                              "now_ms": now_ms}):
                self._unlease(body, handed)
        self._after_durable(touched if messages else [], answer)
        return True

    def _settle(self, envelope: Envelope, request: apis.Message) -> None:
        body = request.body
        _check_name("consumer_id", body["consumer_id"])
        if len(body["entries"]) > qp.SETTLE_ENTRIES_MAX:
            raise errors.InvalidRequestError(
                f"{len(body['entries'])} entries exceed SETTLE_ENTRIES_MAX ({qp.SETTLE_ENTRIES_MAX})")
        now_ms = wall_ms()
        self._wake = True  # a nack may make a message visible now
        results: list[dict[str, Any]] = []
        touched: dict[int, Slot] = {}
        for entry in body["entries"]:
            result = {"partition": entry["partition"], "offset": entry["offset"], "error": 0, "deadline_ms": 0}
            try:
                result["deadline_ms"] = self._settle_one(body, entry, now_ms, touched)
            except errors.FabricError as exc:
                result["error"] = exc.code
            results.append(result)

        def answer(code: int, text: str) -> None:
            if code:
                self.node.send_error(envelope, request.header, errors.error_for_code(code)(text or "queue state write failed"))
            else:
                self.node.send_response(envelope, request.header, {"error": 0, "message": "", "results": results})
        self._after_durable(list(touched.values()), answer)

    def _settle_one(self, body: dict[str, Any], entry: dict[str, Any], now_ms: int, touched: dict[int, Slot]) -> int:
        queue, group, consumer = body["queue"], body["group"], body["consumer_id"]
        tp = (queue, entry["partition"])
        _plog, slot = self._slot(tp)  # loading starts here if it had not
        g = slot.share.groups.get(group)
        if slot.mode != ACTIVE:  # the lease ended with the leader that granted it; settled before? not read yet
            raise errors.CoordinatorLoadInProgressError(f"queue {tp[0]}/{tp[1]} is loading its state")
        if g is None:
            raise errors.LeaseNotHeldError(f"offset {entry['offset']} is not leased to {consumer!r}")
        # What is due first: a lease that ended at its last delivery is dead-lettered now (ALREADY_SETTLED).
        self._collect(slot, group, g, g.state.tick(now_ms))
        touched[id(slot)] = slot  # and its answer waits for that to be written
        action, offset = entry["action"], entry["offset"]
        deadline = 0
        finished: list[Finished] = []
        if action == qp.ACTION_ACK:
            g.state.ack(consumer, offset, now_ms)
        elif action == qp.ACTION_NACK:
            if entry["arg_ms"] < 0:
                raise errors.InvalidDelayError("a nack's delay must be >= 0")
            done = g.state.nack(consumer, offset, now_ms, entry["arg_ms"], entry["reason"] or "nack")
            finished = [done] if done is not None else []
        elif action == qp.ACTION_EXTEND:
            deadline = g.state.extend(consumer, offset, now_ms, entry["arg_ms"])
        elif action == qp.ACTION_RELEASE:  # visible at once, the delivery not counted (as ``_unlease``)
            if not g.state.unlease(consumer, offset, now_ms):
                raise g.state.not_held(consumer, offset)
        else:
            raise errors.InvalidRequestError(
                f"unknown settle action {action}; known: ack 0, nack 1, extend 2, release 3")
        self._collect(slot, group, g, finished)
        self._touch(slot, group, g, now_ms)
        touched[id(slot)] = slot
        return deadline

    def _describe(self, queue: str, group: str) -> dict[str, Any]:
        """Counts per partition this node leads, for ``group`` ("" : every group it knows;
        a queue nobody consumes yet shows as group "")."""
        now_ms = wall_ms()
        out = []
        for tp, plog, share in self._led(queue, -1):
            slot = self._slots[tp]
            if slot.mode != ACTIVE:
                raise errors.CoordinatorLoadInProgressError(f"queue {tp[0]}/{tp[1]} is loading its state; retry")
            names = [group] if group else [name for name in share.groups if name != COUNTING] or [COUNTING]
            for name in names:
                g = share.view(name, plog)
                if share.groups.get(name) is not g:  # a throwaway view: counted from the log's start
                    while not share.ingest(g, plog, now_ms):
                        pass
                elif not share.ingest(g, plog, now_ms):
                    raise errors.CoordinatorLoadInProgressError(
                        f"queue {tp[0]}/{tp[1]} is still replaying its log after a leadership change; retry")
                finished = g.state.tick(now_ms)
                if share.groups.get(name) is g:  # a stored state: what the tick decided must be written
                    self._collect(slot, name, g, finished)
                counts = g.state.counts()
                age = -1
                if counts["oldest_offset"] >= 0:  # since we appended it: a producer's clock is not ours
                    appended = appended_ms(plog, counts["oldest_offset"])
                    age = max(0, now_ms - appended) if appended >= 0 else -1
                out.append({"partition": tp[1], "group": name,
                            "visible": counts["visible"], "in_flight": counts["in_flight"],
                            "delayed": counts["delayed"], "dead_lettered": counts["dead_lettered"],
                            "dropped": counts["dropped"], "deduplicated": counts["deduplicated"],
                            "oldest_age_ms": age})
            self._flush(slot)
        return {"error": 0, "message": "", "partitions": out}

    # -- produce's size check ---------------------------------------------------------------------
    def check_room(self, tp: TopicPartition, records: int, value_bytes: int) -> None:
        """QUEUE_FULL when ``records`` messages of ``value_bytes`` in all would take a queue
        past max_messages or max_bytes."""
        plog, slot = self._slot(tp)
        if slot.mode == ACTIVE:
            slot.share.check_room(plog, records, value_bytes, wall_ms())
        # While loading, the counts are not known yet: the send is let through.

    # -- leadership and loading --------------------------------------------------------------------
    def _follow_leadership(self) -> None:
        """Drop the state of partitions no longer led at its epoch. A session merely in doubt
        (a stalled loop being verified, ZooKeeper briefly out of reach) keeps it: requests
        are refused meanwhile (``_led``) and nothing is decided (``tick``); if the session
        is really lost, the leaderships go and the state with them."""
        node = self.node
        for tp, slot in list(self._slots.items()):
            leader = node.leaders.get(tp)
            if node.session_lost or leader is None or leader.epoch != slot.share.epoch:
                self._drop(slot, "ZooKeeper session lost" if node.session_lost else "leadership moved")

    # -- the loop's turn ---------------------------------------------------------------------------
    def tick(self) -> None:
        now = time.monotonic()
        self._catching_up = False
        if not self.node.unfenced_leader_allowed():
            # In doubt (a stall being verified, ZooKeeper out of reach past our lease): decide
            # nothing, due long polls are told; replies are held, as acting on them is a deposed
            # leader's late write (it took acks back to leases: docs/DESIGN.md, "Queue mode").
            self._take_replies(now, act=False)
            self._follow_leadership()
            self._retry_parked(now, overdue_only=True)
            return
        self._take_replies(now)
        self._follow_leadership()
        now_ms = wall_ms()
        for tp, slot in list(self._slots.items()):
            if slot.mode == LOADING:
                if not slot.load_in_flight and now >= slot.next_load_s:
                    self._load_step(slot)
                continue
            plog = self.node.logs.get(tp)
            if plog is not None:
                slot.share.count_unconsumed(plog)  # its depth series, from the first turn it is loaded
            for name, g in slot.share.groups.items():
                # Keep up with the log here too, a step per turn: a new leader replays its
                # backlog without a receive to drive it and without stalling the loop.
                before = g.state.next_offset
                if plog is not None and not slot.share.ingest(g, plog, now_ms):
                    self._catching_up = True
                if g.state.next_offset != before:
                    self._wake = True
                due = g.state.next_wakeup_ms()
                if due and due <= now_ms:
                    self._collect(slot, name, g, g.state.tick(now_ms))
                    self._wake = True
            self._flush(slot)
            if plog is not None:
                self._snapshot_if_due(tp, plog, slot, now)
            if plog is not None and now >= slot.next_trim_s:
                slot.next_trim_s = now + TRIM_INTERVAL_S
                self._expire_groups(slot, now_ms, self._waiting(tp[0]))  # before the trim: what it held back goes now
                self._trim(tp, plog, slot, now_ms)
        self._trim_state_logs(now)
        self._retry_parked(now, overdue_only=False)

    def _trim(self, tp: TopicPartition, plog: PartitionLog, slot: Slot, now_ms: int) -> None:
        """Delete the leading batches every group is done with (acknowledged, dead-lettered,
        expired, as written to ``__queue_state``) once the dedup window has passed them, as
        SQS deletes an acknowledged message: a queue keeps its log until consumed
        (retention -1), which otherwise meant for ever. Only on a topic made a queue
        (``queue = true``); followers follow the leader's log start (FETCH and REPLICA_ACK
        answers carry it)."""
        config = self.node.configs.get(tp[0])
        if config is None or not config.queue:
            return  # a plain topic read in queue mode: its log is for its other readers too
        groups = [name for name in slot.share.groups if name != COUNTING]
        starts = slot.written_starts()
        if all(name.startswith("__") for name in groups) or any(name not in starts for name in groups):
            # Nobody consumes yet (a redrive, group "__redrive", reads a dead-letter queue
            # without consuming it: its workers still see what was redriven), or a new
            # group's position is not written yet.
            return
        # Every group __queue_state still holds: one deleted while its tombstone is being
        # written holds back the trim until it is durable (a failure then brings it back).
        count = slot.share.trim_batches(plog, min(starts.values()), now_ms)
        if count:
            deleted = plog.delete_before(count)
            log.debug("queue %s/%d: %d consumed records deleted; log starts at %d", tp[0], tp[1], deleted,
                      plog.log_start_offset)

    def _retry_parked(self, now: float, *, overdue_only: bool) -> None:
        """Try the parked long polls again: all of them after a wake (new messages, a state
        change), or with ``overdue_only`` just those whose wait is over (in doubt: they are
        answered, and go elsewhere, rather than held)."""
        woken = self._wake and not overdue_only
        if not self._parked or not (woken or any(now >= p.deadline_s for p in self._parked)):
            return
        if woken:
            self._wake = False
        waiting = self._parked
        self._parked = []
        for parked in waiting:
            due = now >= parked.deadline_s
            if (overdue_only and not due) or not self._try_receive(parked, final=due):
                self._parked.append(parked)

    def _waiting(self, queue: str) -> set[str]:
        """The groups with a receive of ``queue`` parked here: in use, though maybe idle."""
        return {p.request.body["group"] for p in self._parked if p.request.body["queue"] == queue}

    def _on_change(self, _node: NodeState, touched: set[TopicPartition]) -> None:
        """A change listener: partitions whose high watermark moved or took data."""
        if self._parked and any(tp in self._slots for tp in touched):
            self._wake = True

    def next_deadline_s(self) -> float | None:
        """When the loop must run us again: a long poll's end, a lease expiring, a delay ending."""
        now, now_ms = time.monotonic(), wall_ms()
        if self._catching_up:
            return now  # replaying a backlog: the next step at once
        times = [p.deadline_s for p in self._parked]
        if self._outbox:
            times.append(now + 0.005)  # a connection being made: try again soon
        for slot in self._slots.values():
            if slot.mode == LOADING:
                times.append(slot.next_load_s)
                continue
            for g in slot.share.groups.values():
                due = g.state.next_wakeup_ms()
                if due:
                    times.append(now + max(0, due - now_ms) / 1000.0)
        return min(times) if times else None

    def counts(self) -> list[tuple[str, int, str, dict[str, int]]]:
        """(queue, partition, group, counts) of every share state served here, for metrics;
        a partition no group reads yet as group COUNTING ("")."""
        return [(slot.share.topic, slot.share.partition, name, g.state.counts())
                for slot in self._slots.values() if slot.mode == ACTIVE for name, g in slot.share.groups.items()]


def _check_name(what: str, name: str) -> None:
    if not name or len(name.encode()) > qp.NAME_BYTES_MAX:
        raise errors.InvalidRequestError(f"{what} must be 1..{qp.NAME_BYTES_MAX} bytes")


# -- the node's hooks (nodes/server.py) ----------------------------------------------------------
def for_node(node: NodeState) -> QueueCoordinator:
    made: QueueCoordinator | None = node.queues
    if made is None:
        made = QueueCoordinator(node)
        node.queues = made
    return made


def handle(node: NodeState, envelope: Envelope, request: apis.Message) -> None:
    for_node(node).handle(envelope, request)


def tick(node: NodeState, now: float) -> None:
    if now >= node.queues_adopt_next_s:
        node.queues_adopt_next_s = now + ADOPT_INTERVAL_S
        led = [tp for tp in node.leaders if (config := node.configs.get(tp[0])) is not None and config.queue]
        if led:
            for_node(node).adopt(led)
    # A node that leads a __queue_state partition compacts it, queue requests or not.
    if node.queues is not None or any((qp.STATE_TOPIC, k) in node.leaders for k in range(STATE_TOPIC_PARTITIONS)):
        for_node(node).tick()


def next_deadline(node: NodeState) -> float | None:
    return node.queues.next_deadline_s() if node.queues is not None else None


def check_room(node: NodeState, tp: TopicPartition, record_count: int, records: bytes) -> None:
    """QUEUE_FULL when a produced batch (its uncompressed records section) would take a queue
    past its limits. ``max_bytes`` counts value bytes, as the queue's own counts do, not the
    batch frame: a frame's header and per-record overhead would make a small limit refuse
    every send, even into an empty queue, and a compressed frame would undercount."""
    for_node(node).check_room(tp, record_count, value_bytes(records, record_count))


def value_bytes(records: bytes, record_count: int) -> int:
    """The sum of a records section's value lengths (a null value, -1, counts 0): the third
    i32 column of docs/PROTOCOL.md's record layout, already checked by the produce path."""
    lengths = struct.unpack_from(f"<{record_count}i", records, 2 * 4 * record_count)
    return sum(lengths) + lengths.count(-1)


def close(node: NodeState) -> None:
    if node.queues is not None:
        node.queues.close()
        node.queues = None
