"""The durable half of queue mode: writing what the share states decided, and reading it back.

``nodes/queue_coordinator.py`` serves the requests; this base class owns what outlives a
leader. Every decision that must survive (an acquisition, so the delivery count is kept;
an ack; a nack's new visibility; a dead letter or a drop) becomes a record in the
replicated ``__queue_state`` topic, written acks=all, before the answer that depends on it.
Writes are group-committed: one in flight per queue partition, the next carrying
everything decided meanwhile. A dead letter is produced (acks=all) to the dead-letter
topic before the record saying it left the queue, so a crash between the two re-dead-letters
(a duplicate in the DLQ), never loses it. A new leader reads its partition's records first
(``_load_step``), then replays the log as receives come (``nodes/queue_share.py``). It is a
client of the cluster (PRODUCE and FETCH, maybe to itself): the tested replication path.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import zmq

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from fabric.transport import Connections
from nodes.queue_dead_letters import (
    DEAD_LETTERS_PER_WRITE,
    Letter,
    as_dropped,
    dead_letter,
    encode_letters,
    log_dropped,
    next_dead_letter_write,
    unfit_letters,
)
from nodes.queue_share import COUNTING, Group, SharePartition, copy_appended_ms
from nodes.queue_snapshot import header, load_record, state_headers, written_epoch
from nodes.queue_state import DEAD, Change, Finished
from nodes.state import NodeState, TopicPartition

log = logging.getLogger("fabric.queues")

STATE_TOPIC_PARTITIONS: Final[int] = 16
WRITE_TIMEOUT_MS: Final[int] = 10_000  # acks=all wait for one state or dead-letter write
REQUEST_TIMEOUT_S: Final[float] = 15.0  # a request to a node unanswered this long is abandoned
LOAD_FETCH_BYTES_MAX: Final[int] = 512 * 1024  # state read per load step: small, so a step never stalls the loop
OUTBOX_MAX: Final[int] = 10_000  # requests waiting for a connection to their node
# One write's bounds, well inside a topic's default message_bytes_max (8 MiB): state records
# are ~90 bytes; dead letters' bounds are in nodes/queue_dead_letters.py.
STATE_RECORDS_PER_WRITE: Final[int] = 20_000
WRITE_RETRY_S: Final[float] = 20.0  # a failing state write is retried this long (a failover), then reloads
CONNECT_WAIT_S: Final[float] = 1.0  # a request whose node cannot be connected to this long fails
RETRY_INTERVAL_S: Final[float] = 0.2  # a failed load step or topic creation is retried after this
LOADING: Final[str] = "loading"
ACTIVE: Final[str] = "active"

Done = Callable[[int, str], None]  # (error code, message); 0 when durable


@dataclass
class Slot:
    """One queue partition this node leads: its share states and their durability."""

    share: SharePartition
    mode: str = LOADING
    load_offset: int = 0
    load_in_flight: bool = False
    next_load_s: float = 0.0
    load_epoch_max: int = -1  # the highest leader epoch among the state records read so far
    pending: list[tuple[bytes, bytes]] = field(default_factory=list)  # state records to write next
    dead: list[tuple[str, Finished]] = field(default_factory=list)  # (group, ...) to dead-letter before those records
    # Answers waiting for their decisions to be written: (records queued before them, answer).
    waiters: list[tuple[int, Done]] = field(default_factory=list)
    retry_until_s: float = 0.0  # a failed write is retried until then (0: no failure pending)
    next_flush_s: float = 0.0  # not before (after a failure)
    queued: int = 0  # state records ever queued on this slot
    written: int = 0  # ... and written
    flushing: bool = False
    # Each group's start offset (everything below it done) as of the last write that took
    # every decision made before it (``written_starts``).
    durable_starts: dict[str, int] = field(default_factory=dict)
    next_trim_s: float = 0.0

    def written_starts(self) -> dict[str, int]:
        """Each group's start offset as far as __queue_state holds it: the log may be
        trimmed below the lowest (nodes/queue_coordinator.py ``_trim``)."""
        if self.flushing or self.pending or self.dead:
            return self.durable_starts
        return _starts(self.share)  # nothing decided is unwritten


def state_partition(queue: str, partition: int, partitions: int) -> int:
    return zlib.crc32(f"{queue}\0{partition}".encode()) % partitions


def _range_record(run: list[Change]) -> bytes:
    first = run[0]
    return qp.encode_state_record(first.offset, first.state, first.delivery_count, first.visible_at_ms, first.reason,
                                  last_offset=run[-1].offset)


def _starts(share: SharePartition) -> dict[str, int]:
    return {name: g.state.start_offset for name, g in share.groups.items() if name != COUNTING}


def wall_ms() -> int:
    return int(time.time() * 1000)


class QueueDurability:
    def __init__(self, node: NodeState) -> None:
        self.node = node
        security = node.authz.client if node.authz is not None else None  # the node's own key
        self._conns = Connections(zmq.Context.instance(), poller=node.sockets.poller, security=security)
        self._slots: dict[TopicPartition, Slot] = {}
        self._requests: dict[int, tuple[float, str, Callable[[apis.Message | None], None]]] = {}
        self._creating_topic_until = 0.0
        self._wake = False  # something a parked receive waits for may have changed
        self._outbox: list[tuple[str, list[Any], int]] = []  # requests waiting for their connection
        self._held: list[apis.Message] = []  # replies read while in doubt (``_take_replies``)

    # -- durability --------------------------------------------------------------------------------
    def _collect(self, slot: Slot, group: str, g: Group, finished: list[Finished]) -> None:
        """Queue what the state machine decided for the next write."""
        share = slot.share
        if group == COUNTING:
            g.state.drain_changes()  # only counts: nothing it decides is a group's to keep
            return
        dead = [f for f in finished if f.state == DEAD]
        dropped = {f.offset for f in self._unfit_dead_letters(share, dead)} if dead else set()
        for offset in dropped:  # decided before the changes are written: __queue_state says dropped
            g.state.drop_dead_letter(offset)
        key = qp.state_key(share.topic, share.partition, group)
        # Consecutive offsets with the same decision (a receive or an ack of a run of
        # messages) become one record; order is kept, so the newest per offset still wins.
        run: list[Change] = []
        for change in as_dropped(g.state.drain_changes(), dropped):
            if run and change.offset == run[-1].offset + 1 and len(run) < qp.STATE_RANGE_MAX and (
                    change.state, change.delivery_count, change.visible_at_ms, change.reason) == (
                    run[0].state, run[0].delivery_count, run[0].visible_at_ms, run[0].reason):
                run.append(change)
                continue
            if run:
                slot.pending.append((key, _range_record(run)))
                slot.queued += 1
            run = [change]
        if run:
            slot.pending.append((key, _range_record(run)))
            slot.queued += 1
        slot.dead.extend((group, f) for f in dead if f.offset not in dropped)

    def _unfit_dead_letters(self, share: SharePartition, dead: list[Finished]) -> list[Finished]:
        """Those of ``dead`` the dead-letter topic can never take (``unfit_letters``): dropped
        instead, so they do not hold the partition's writes for ever."""
        plog = self.node.logs.get((share.topic, share.partition))
        route = self.node.routing.topic(share.config.dead_letter)
        if plog is None or route is None:
            return []  # the write says why
        found = share.records(plog, [f.offset for f in dead])
        return unfit_letters(share.topic, share.partition, dead, found, share.config.dead_letter,
                             route.config.message_bytes_max)

    def _after_durable(self, slots: list[Slot], done: Done) -> None:
        """Call ``done`` once everything decided so far on ``slots`` is written (now if nothing)."""
        if not slots:
            done(0, "")
            return
        left = [len(slots)]
        first_error: list[tuple[int, str]] = []

        def one(code: int, text: str) -> None:
            if code and not first_error:
                first_error.append((code, text))
            left[0] -= 1
            if left[0] == 0:
                done(*(first_error[0] if first_error else (0, "")))
        for slot in slots:
            slot.waiters.append((slot.queued, one))
            self._flush(slot)

    def _flush(self, slot: Slot) -> None:
        if slot.flushing or time.monotonic() < slot.next_flush_s:
            return  # the next flush starts when this one ends (or its retry is due)
        records, dead = slot.pending[:STATE_RECORDS_PER_WRITE], slot.dead
        slot.pending, slot.dead = slot.pending[STATE_RECORDS_PER_WRITE:], []
        share = slot.share
        if not records and not dead:
            self._release(slot)
            return
        slot.flushing = True
        # A write taking everything decided so far makes the present start offsets durable.
        starts = None if slot.pending else _starts(share)

        def finished(code: int, text: str) -> None:
            slot.flushing = False
            now = time.monotonic()
            if code and self._slots.get((share.topic, share.partition)) is slot and \
                    (not slot.retry_until_s or now < slot.retry_until_s):
                # A dead-letter or state leader failing over: write the same records again
                # shortly (idempotent: the newest per offset wins), answers still waiting, and
                # the dead letters unless written. Reloading would drop every lease, replay the log.
                slot.retry_until_s = slot.retry_until_s or now + WRITE_RETRY_S
                slot.next_flush_s = now + RETRY_INTERVAL_S
                slot.pending[:0] = records
                slot.dead[:0] = dead
                log.warning("queue %s/%d: state write failed (%s); retrying", share.topic, share.partition,
                            text or code)
                return
            slot.retry_until_s = 0.0
            if code:
                waiters, slot.waiters = slot.waiters, []
                for _need, waiter in waiters:
                    waiter(code, text)
                if self._slots.get((share.topic, share.partition)) is slot:
                    self._reload(slot, f"queue state write failed: {text or code}")  # memory is ahead of the log
                return
            slot.written += len(records)
            if starts is not None:
                slot.durable_starts = starts
            self._release(slot)
            if self._slots.get((share.topic, share.partition)) is slot:
                self._flush(slot)

        def write_state(code: int, text: str) -> None:
            if not code:  # dead letters written (acks=all): a retried state write no longer
                dead.clear()  # writes them again (it added a copy per retry, with no crash)
            if code or not records:
                finished(code, text)
                return
            route = self.node.routing.topic(qp.STATE_TOPIC)
            if route is None:
                finished(errors.CoordinatorNotAvailableError.code, f"{qp.STATE_TOPIC} is missing")
                return
            k = state_partition(share.topic, share.partition, route.config.partitions)
            now_ms, tags = wall_ms(), state_headers(share)
            self._produce(qp.STATE_TOPIC, k, [(now_ms, key, value, tags) for key, value in records], finished)

        if dead:
            self._dead_letter(slot, dead, write_state)
        else:
            write_state(0, "")

    @staticmethod
    def _release(slot: Slot) -> None:
        """Answer those whose decisions are all written (in the order they came)."""
        ready = [w for w in slot.waiters if w[0] <= slot.written]
        if ready:
            slot.waiters = [w for w in slot.waiters if w[0] > slot.written]
            for _need, waiter in ready:
                waiter(0, "")

    def _dead_letter(self, slot: Slot, dead: list[tuple[str, Finished]], done: Done) -> None:
        """Produce the dead letters (acks=all) in bounded batches, one after another; ``done``
        after the last, so no record saying they left the queue is written before them. Each
        batch fits the dead-letter topic's message_bytes_max as it is now (it is alterable)."""
        share = slot.share
        plog = self.node.logs.get((share.topic, share.partition))
        dlq = share.config.dead_letter
        route = self.node.routing.topic(dlq)
        if plog is None or route is None:
            done(errors.UnknownTopicOrPartitionError.code, f"dead-letter topic {dlq!r} does not exist")
            return
        limit_bytes = route.config.message_bytes_max
        candidates = dead[:DEAD_LETTERS_PER_WRITE]
        found = share.records(plog, [f.offset for _group, f in candidates])  # one lookup for the chunk
        letters = [dead_letter(share.topic, share.partition, f, found[f.offset]) if f.offset in found else None
                   for _group, f in candidates]
        taken, written, unfit = next_dead_letter_write(letters, limit_bytes)
        for i in unfit:  # the topic's limit lowered since ``_collect``: __queue_state says dead-lettered
            group, f = candidates[i]
            if (g := share.groups.get(group)) is not None and g.state.dead_total > 0:
                g.state.drop_dead_letter(f.offset)
        if unfit:
            log_dropped(share.topic, share.partition, [candidates[i][1] for i in unfit], dlq, limit_bytes)
        chunk = [letter for i in written if (letter := letters[i]) is not None]
        rest = dead[taken:]

        def after(code: int, text: str) -> None:
            if code or not rest:
                done(code, text)
            else:
                self._dead_letter(slot, rest, done)

        if not chunk:
            after(0, "")
            return
        self._produce(dlq, share.partition % route.config.partitions, chunk, after, frame_bytes_max=limit_bytes)

    def _produce(self, topic: str, partition: int, records: list[Letter], done: Done, *,
                 frame_bytes_max: int = 0) -> None:
        """``frame_bytes_max``: the topic's message_bytes_max (``encode_letters``); 0: none."""
        address = self._leader_address(topic, partition)
        if address is None:
            done(errors.LeaderNotAvailableError.code, f"{topic}/{partition} has no leader")
            return
        frame = encode_letters(records, frame_bytes_max)
        body = {"acks": -1, "timeout_ms": WRITE_TIMEOUT_MS, "entries": [{"topic": topic, "partition": partition}]}

        def on_reply(message: apis.Message | None) -> None:
            if message is None:
                done(errors.RequestTimedOutError.code, f"write to {topic}/{partition} timed out")
            elif message.header.error_code:
                done(message.header.error_code, str(message.body.get("message", "")))
            else:
                result = message.body["results"][0]
                done(result["error"], result["message"])
        # The node's version: it may write __queue_state (apis.INTERNAL_VERSION).
        self._request(address, ApiKey.PRODUCE, body, on_reply, batches=[frame], api_version=apis.INTERNAL_VERSION)

    def _drop(self, slot: Slot, why: str) -> None:
        tp = (slot.share.topic, slot.share.partition)
        if self._slots.get(tp) is slot:
            del self._slots[tp]
        log.info("queue %s/%d: stopped serving (%s)", tp[0], tp[1], why)
        self._wake = True  # its parked receives are answered with where to go
        waiters, slot.waiters = slot.waiters, []
        for _need, waiter in waiters:
            waiter(errors.NotLeaderError.code, f"queue {tp[0]}/{tp[1]}: {why}")

    def _reload(self, slot: Slot, why: str) -> None:
        log.warning("queue %s/%d: reloading (%s)", slot.share.topic, slot.share.partition, why)
        self._drop(slot, why)
        share = slot.share
        fresh = Slot(SharePartition(share.topic, share.partition, share.epoch, share.topic_config),
                      next_load_s=time.monotonic() + RETRY_INTERVAL_S)
        self._slots[(share.topic, share.partition)] = fresh

    def _load_step(self, slot: Slot) -> None:
        share = slot.share
        route = self.node.routing.topic(qp.STATE_TOPIC)
        if route is None:
            self._create_state_topic()
            slot.next_load_s = time.monotonic() + RETRY_INTERVAL_S
            return
        k = state_partition(share.topic, share.partition, route.config.partitions)
        address = self._leader_address(qp.STATE_TOPIC, k)
        if address is None:
            slot.next_load_s = time.monotonic() + RETRY_INTERVAL_S
            return
        prefix = qp.state_key(share.topic, share.partition, "")
        incarnation = str(share.topic_config.created_ms).encode()
        body = {"replica_id": apis.CONSUMER_REPLICA_ID, "max_wait_ms": 0, "min_bytes": 0,
                "max_bytes": LOAD_FETCH_BYTES_MAX,
                "partitions": [{"topic": qp.STATE_TOPIC, "partition": k, "fetch_offset": slot.load_offset,
                                "partition_bytes_max": LOAD_FETCH_BYTES_MAX,
                                "current_leader_epoch": apis.ANY_LEADER_EPOCH}]}
        slot.load_in_flight = True

        def on_reply(message: apis.Message | None) -> None:
            slot.load_in_flight = False
            plog = self.node.logs.get((share.topic, share.partition))
            if self._slots.get((share.topic, share.partition)) is not slot or plog is None:
                return
            result = message.body["partitions"][0] if message is not None and not message.header.error_code else None
            if result is not None and result["error"] == errors.OffsetOutOfRangeError.code \
                    and slot.load_offset < result["log_start_offset"]:
                if share.records_loaded:
                    # Compacted under us (nodes/queue_compaction.py): what we applied may miss
                    # a later record of the part deleted, which the snapshot need not restate.
                    self._reload(slot, f"{qp.STATE_TOPIC}/{k} was compacted while it was read")
                else:
                    slot.load_offset = result["log_start_offset"]
                return
            if result is None or result["error"]:
                slot.next_load_s = time.monotonic() + RETRY_INTERVAL_S
                return
            state_log = self.node.logs.get((qp.STATE_TOPIC, k))  # our copy, if we hold one
            for buf in message.batches:  # type: ignore[union-attr]
                decoded = batch_format.decode_batch(buf)
                base = decoded.header.base_offset
                appended_here_ms = copy_appended_ms(state_log, decoded.header)  # to read its times on our clock
                for i, (key, value, headers) in enumerate(zip(decoded.keys, decoded.values, decoded.headers,
                                                              strict=True)):
                    if base + i < slot.load_offset or key is None or value is None or not key.startswith(prefix):
                        continue
                    if header(headers, qp.HEADER_STATE_INCARNATION) not in (None, incarnation):
                        continue  # a deleted queue's of the same name: not this queue's state
                    if (epoch := written_epoch(headers)) < slot.load_epoch_max and epoch >= 0:
                        continue  # a deposed leader's write that landed after its successor's
                    slot.load_epoch_max = max(slot.load_epoch_max, epoch)
                    try:
                        fields = qp.decode_state_record(value)
                    except errors.FabricError as exc:
                        log.warning("skipping an unreadable queue state record: %s", exc)
                        continue
                    # Its timestamp, when the leader wrote it, is the group's idle clock.
                    load_record(share, plog, key[len(prefix):].decode("utf-8", "replace"), fields, headers,
                                decoded.timestamps[i], appended_here_ms)
                slot.load_offset = max(slot.load_offset, decoded.header.next_offset)
            # Done when everything is read and everything read is committed.
            if slot.load_offset >= result["log_end_offset"] and result["high_watermark"] >= result["log_end_offset"]:
                slot.mode = ACTIVE
                share.loaded()
                self._wake = True
                log.info("queue %s/%d: serving %d groups (state read to %s/%d offset %d)", share.topic,
                         share.partition, len(share.groups), qp.STATE_TOPIC, k, slot.load_offset)
            elif not message.batches:  # type: ignore[union-attr]
                slot.next_load_s = time.monotonic() + 0.02  # waiting for the high watermark

        self._request(address, ApiKey.FETCH, body, on_reply)

    def _create_state_topic(self) -> None:
        now = time.monotonic()
        if now < self._creating_topic_until:
            return
        self._creating_topic_until = now + 1.0
        replicas = max(1, min(apis.INTERNAL_REPLICATION_FACTOR, len(self.node.routing.nodes())))
        body = {"name": qp.STATE_TOPIC, "partitions": STATE_TOPIC_PARTITIONS, "replication_factor": replicas,
                "configs": [{"key": "retention_ms", "value": "-1"},
                            {"key": "min_insync", "value": str(min(2, replicas))}]}
        self._request(self.node.address, ApiKey.CREATE_TOPIC, body, lambda _message: None,
                      api_version=apis.INTERNAL_VERSION)

    def _leader_address(self, topic: str, partition: int) -> str | None:
        route = self.node.routing.topic(topic)
        state = route.partitions.get(partition) if route is not None else None
        info = self.node.routing.nodes().get(state.leader) if state is not None else None
        return info.address if info is not None else None

    def _request(self, address: str, api_key: int, body: dict[str, Any],
                 callback: Callable[[apis.Message | None], None], *, batches: list[bytes] | None = None,
                 api_version: int = 0) -> None:
        correlation_id = self._conns.next_id()
        frames = apis.encode_request(api_key, body, correlation_id, api_version=api_version, batches=batches)
        self._requests[correlation_id] = (time.monotonic(), address, callback)
        if not self._try_send(address, frames):
            # A connection still being made (the socket refuses to queue until it is):
            # sent by a later turn, never by blocking the node's loop here.
            if len(self._outbox) >= OUTBOX_MAX:
                del self._requests[correlation_id]
                callback(None)
                return
            self._outbox.append((address, frames, correlation_id))

    def _try_send(self, address: str, frames: list[Any]) -> bool:
        try:
            self._conns.send(address, frames, wait_connect_ms=0)
            return True
        except errors.FabricError:
            return False

    def _send_outbox(self, now: float) -> None:
        waiting, self._outbox = self._outbox, []
        for address, frames, correlation_id in waiting:
            entry = self._requests.get(correlation_id)
            if entry is None or self._try_send(address, frames):
                continue
            if now - entry[0] > CONNECT_WAIT_S:
                # Not reachable (a dead node the routing map still names): fail now, so the
                # caller retries with a fresher map instead of waiting REQUEST_TIMEOUT_S.
                del self._requests[correlation_id]
                self._conns.drop(address)
                entry[2](None)
            else:
                self._outbox.append((address, frames, correlation_id))

    def _take_replies(self, now: float, *, act: bool = True) -> None:
        """Read the replies; act on them (and on drops and timeouts) only when ``act``: in
        doubt of its session a node holds them (one per request) until it knows it leads."""
        for _address, frames in self._conns.drain():
            try:
                self._held.append(apis.decode_response([f.bytes if i < 2 else f.buffer
                                                        for i, f in enumerate(frames)]))
            except errors.FabricError as exc:
                log.warning("undecodable reply to the queue coordinator: %s", exc)
        if not act:
            return
        if self._outbox:
            self._send_outbox(now)
        held, self._held = self._held, []
        for i, message in enumerate(held):  # before the drops: an answer that came before its connection went counts
            if not self.node.unfenced_leader_allowed():  # stopped while answering: the rest wait for ZooKeeper's word
                self._held = held[i:]
                return
            entry = self._requests.pop(message.header.correlation_id, None)
            if entry is not None:
                entry[2](message)
        for gone in self._conns.take_disconnected():
            # The peer went away: what we asked it will not be answered.
            for correlation_id, (_sent, address, callback) in list(self._requests.items()):
                if address == gone:
                    del self._requests[correlation_id]
                    callback(None)
            self._conns.drop(gone)
        for correlation_id, (sent, address, callback) in list(self._requests.items()):
            if now - sent > REQUEST_TIMEOUT_S:
                del self._requests[correlation_id]
                self._conns.drop(address)
                callback(None)

    def close(self) -> None:
        for slot in list(self._slots.values()):
            self._drop(slot, "node stopping")
        self._conns.close()
