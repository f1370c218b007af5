"""One (queue partition, group) share state, and the one place that decides it.

Pure: no sockets, no storage, the clock passed in (``now_ms``). The queue coordinator feeds
it appended records and consumer requests, persists what changed, and only then answers.

Shaped after Kafka share groups (KIP-932), SQS and NATS JetStream work queues. Every message
from the share-partition start offset on is in one state:

    available --acquire--> leased --ack--> acked (done)
        ^  ^                  |  \\--nack(delay)--> delayed --visible_at--> available
        |  \\------expiry------+
        |                     \\--expiry or nack at max_deliveries--> dead (to the DLQ)
    delayed (deliver_at in the future) --visible_at--> available
    any not-leased message past its TTL --> dead if the queue has a dead letter, else dropped

``delivery_count`` counts acquisitions (KIP-932's rule): a message acquired
``max_deliveries`` times whose lease then ends without an ack is dead. Among visible
messages a higher priority goes first, then the lower offset. The start offset moves past
every message that is done (acked, dead, dropped), which is what bounds the state.
"""

from __future__ import annotations

import heapq
from typing import Final

from fabric import errors

# The bounds live with the wire format (fabric/protocol/queues.py) so the SDK and the CLI
# quote the same numbers; re-exported here for the state machine's readers, as are its
# data types (nodes/queue_entries.py).
from fabric.protocol.queues import (
    DEDUP_IDS_MAX,
    DEDUP_WINDOW_MS_DEFAULT,
    DELAY_MS_MAX,
    MAX_DELIVERIES_DEFAULT,
    MAX_DELIVERIES_MAX,
    PRIORITY_DEFAULT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RECEIVE_MESSAGES_MAX,
    RECEIVE_WAIT_MS_MAX,
    VISIBILITY_TIMEOUT_MS_DEFAULT,
    VISIBILITY_TIMEOUT_MS_MAX,
)
from nodes.queue_bounds import (
    check_priority,
    check_receive_wait_ms,
    check_visibility_ms,
    deliver_at,
)
from nodes.queue_dedup import DedupWindow
from nodes.queue_entries import (
    _DONE,
    ACKED,
    AVAILABLE,
    DEAD,
    DELAYED,
    DROPPED,
    LEASED,
    REASON_EXPIRED,
    REASON_NACK,
    REASON_TTL,
    Change,
    Entry,
    Finished,
    Lease,
    QueueConfig,
)

__all__ = ["ACKED", "AVAILABLE", "DEAD", "DELAYED", "DROPPED", "LEASED", "REASON_EXPIRED", "REASON_NACK",
           "REASON_TTL", "Change", "Entry", "Finished", "Lease", "QueueConfig",
           "DEDUP_IDS_MAX", "DedupWindow", "DEDUP_WINDOW_MS_DEFAULT", "DELAY_MS_MAX", "MAX_DELIVERIES_DEFAULT",
           "check_priority", "check_receive_wait_ms", "check_visibility_ms", "deliver_at",
           "MAX_DELIVERIES_MAX", "PRIORITY_DEFAULT", "PRIORITY_MAX", "PRIORITY_MIN", "RECEIVE_MESSAGES_MAX",
           "RECEIVE_WAIT_MS_MAX", "VISIBILITY_TIMEOUT_MS_DEFAULT", "VISIBILITY_TIMEOUT_MS_MAX"]

# Messages the start offset passed that were dead-lettered or dropped, remembered (newest
# first kept) so a late ack of one is told so rather than taken as acknowledged. Bounded:
# ~100 bytes each; older ones, and those a snapshot restated, read as acknowledged.
GIVEN_UP_REMEMBERED_MAX: Final[int] = 10_000
REASON_PURGED: Final[str] = "purged"


class ShareState:
    """The share state of one queue partition for one group."""

    def __init__(self, config: QueueConfig, start_offset: int = 0) -> None:
        self.config = config
        self.start_offset = start_offset
        self.next_offset = start_offset  # one past the last appended record
        self._entries: dict[int, Entry] = {}
        self._visible: list[tuple[int, int]] = []  # (-priority, offset); lazy deletion
        self._delayed: list[tuple[int, int]] = []  # (visible_at_ms, offset); lazy deletion
        self._leases: list[tuple[int, int]] = []  # (deadline_ms, offset); lazy deletion
        self._ttl: list[tuple[int, int]] = []  # (expires_at_ms, offset)
        self._bytes = 0
        self._open = 0  # messages not done (acked, dead, dropped), and their bytes
        self._open_bytes = 0
        # Messages per undone state, kept as they move, so counts() is O(1) on a long backlog
        # (metrics and describe ask often).
        self._in_state: dict[str, int] = {AVAILABLE: 0, LEASED: 0, DELAYED: 0}
        self.dropped_total = 0
        self.dead_total = 0
        self.deduplicated_total = 0
        # A purge settled every message below this (nodes/queue_purge.py), ingested or not.
        self.purged_below = 0
        self._given_up: dict[int, str] = {}  # offset -> DEAD or DROPPED, below the start offset
        # Drained by the coordinator after every call; never longer than one call's changes.
        self._changes: list[Change] = []

    # ----- input: records appended to the partition -----
    def check_room(self, size_bytes: int, records: int = 1, pending: int = 0) -> None:
        """Raise QueueFullError (retriable) when ``records`` more messages of ``size_bytes``
        would take the unfinished messages (plus ``pending`` not yet appended) past a limit.
        O(1): the counts are kept as messages come and finish."""
        c = self.config
        if c.max_messages and self._open + pending + records > c.max_messages:
            raise errors.QueueFullError(
                f"queue holds {self._open + pending} messages, max_messages is {c.max_messages}; retry later")
        if c.max_bytes and self._open_bytes + size_bytes > c.max_bytes:
            raise errors.QueueFullError(
                f"queue holds {self._open_bytes} bytes, max_bytes is {c.max_bytes}; retry later")

    def append(
        self,
        offset: int,
        now_ms: int,
        *,
        size_bytes: int = 0,
        priority: int = PRIORITY_DEFAULT,
        visible_at_ms: int = 0,
        ttl_ms: int = 0,
    ) -> None:
        """A record at ``offset`` is in the log; it joins the queue."""
        if offset < self.next_offset:
            return  # already known (replayed after a rebuild)
        if offset < self.purged_below:
            self.skip(offset)  # sent before a purge that reached the log's end past it
            return
        check_priority(priority)
        ttl = ttl_ms or self.config.message_ttl_ms
        if ttl_ms and self.config.message_ttl_ms:
            ttl = min(ttl_ms, self.config.message_ttl_ms)
        e = Entry(offset, size_bytes, priority, visible_at_ms, now_ms + ttl if ttl else 0)
        self._entries[offset] = e
        self._in_state[e.state] += 1
        self._bytes += size_bytes
        self._open += 1
        self._open_bytes += size_bytes
        self.next_offset = offset + 1
        self._make_available(e, now_ms)
        if e.expires_at_ms:
            heapq.heappush(self._ttl, (e.expires_at_ms, offset))
        if self.start_offset < offset:
            self._advance()  # past offsets that never joined (a gap in the log)

    def skip(self, offset: int, *, duplicate: bool = False) -> None:
        """A record at ``offset`` that never joins the queue (a duplicate within the dedup
        window, a control batch, a record retention removed): the start offset may pass it."""
        if offset < self.next_offset:
            return
        self.next_offset = offset + 1
        if duplicate:
            self.deduplicated_total += 1
        self._advance()

    # ----- consumer requests -----
    def acquire(self, consumer: str, max_messages: int, now_ms: int, visibility_ms: int = 0,
                bytes_max: int = 0, unanswered: bool = False) -> tuple[list[Lease], list[Finished]]:
        """Lease up to ``max_messages`` visible messages to ``consumer``, best priority first,
        and (``bytes_max`` > 0) no more value bytes than that, but always at least one.
        ``unanswered``: handed out later, by ``answered`` (the coordinator's answer waits
        for the leases to be durable)."""
        vis = visibility_ms or self.config.visibility_timeout_ms
        check_visibility_ms(vis)
        finished = self.tick(now_ms)
        leases: list[Lease] = []
        taken_bytes = 0
        while self._visible and len(leases) < max_messages:
            if bytes_max and leases and taken_bytes + self._peek_size() > bytes_max:
                break
            _, off = heapq.heappop(self._visible)
            e = self._entries.get(off)
            if e is None or e.state != AVAILABLE or e.visible_at_ms > now_ms:
                continue
            self._move(e, LEASED)
            e.consumer, e.deadline_ms, e.unanswered = consumer, now_ms + vis, unanswered
            e.delivery_count += 1
            taken_bytes += e.size_bytes
            heapq.heappush(self._leases, (e.deadline_ms, off))
            self._record(e)
            leases.append(Lease(off, e.delivery_count, e.deadline_ms))
        return leases, finished

    def _peek_size(self) -> int:
        """The size of the next visible message (0 if the heap's top is stale)."""
        e = self._entries.get(self._visible[0][1])
        return e.size_bytes if e is not None else 0

    def finished(self, offset: int) -> str:
        """How the message at ``offset`` left this group, if it did: ACKED (acknowledged by any
        consumer, or purged), DEAD or DROPPED (given up on), "" while it is still queued.
        Below the start offset the state is forgotten: ACKED unless remembered as given up."""
        if offset < self.start_offset:
            return self._given_up.get(offset, ACKED)
        e = self._entries.get(offset)
        if e is not None:
            return e.state if e.state in _DONE else ""
        return ACKED if offset < self.purged_below else ""

    def not_held(self, consumer: str, offset: int) -> errors.FabricError:
        """Why ``consumer`` cannot settle ``offset``: the group is done with it
        (ALREADY_SETTLED: it is not delivered again), or its lease is gone (LEASE_NOT_HELD:
        it is, or will be, delivered again)."""
        finished = self.finished(offset)
        if finished:
            how = "acknowledged or purged" if finished == ACKED else f"given up on ({finished})"
            return errors.AlreadySettledError(f"offset {offset} was already {how}: not delivered again")
        return errors.LeaseNotHeldError(f"offset {offset} is not leased to {consumer!r}")

    def _held(self, consumer: str, offset: int, now_ms: int) -> Entry:
        e = self._entries.get(offset)
        if e is None or e.state != LEASED or e.consumer != consumer or e.deadline_ms <= now_ms:
            raise self.not_held(consumer, offset)
        return e

    def ack(self, consumer: str, offset: int, now_ms: int) -> bool:
        """True: acknowledged now. False: the group had acknowledged (or purged) it already,
        by this consumer or another after a redelivery: an ack is idempotent, as SQS's
        DeleteMessage, since what it asks for holds. Raises ``not_held``'s error otherwise."""
        e = self._entries.get(offset)
        if (e is None or e.state != LEASED) and self.finished(offset) == ACKED:
            return False
        e = self._held(consumer, offset, now_ms)
        self._move(e, ACKED)
        self._closed(e)
        self._record(e)
        self._advance()
        return True

    def purge(self, end_offset: int) -> int:
        """Settle every message below ``end_offset`` (the log's end when the purge came),
        ingested or not: held leases are dropped, delayed messages go too; not dead-lettered,
        not counted as dropped. Returns how many queued messages it settled. One restating
        record is the caller's to persist (``purged_below``), not a change per message."""
        count = 0
        for e in [e for e in self._entries.values() if e.offset < end_offset and e.state not in _DONE]:
            self._move(e, ACKED)
            e.last_reason = REASON_PURGED
            self._closed(e)
            count += 1
        self.purged_below = max(self.purged_below, end_offset)
        self._advance()
        return count

    def nack(self, consumer: str, offset: int, now_ms: int, delay_ms: int = 0, reason: str = REASON_NACK) -> Finished | None:
        """Give a message back; visible again after ``delay_ms``, or dead at max_deliveries."""
        e = self._held(consumer, offset, now_ms)
        e.last_reason = reason
        if e.delivery_count >= self.config.max_deliveries:
            return self._finish(e, reason)
        e.visible_at_ms = deliver_at(now_ms, delay_ms)
        self._make_available(e, now_ms)
        self._record(e)
        return None

    def unlease(self, consumer: str, offset: int, now_ms: int) -> bool:
        """Undo a lease whose message never reached the application (the answer never left
        the node, or the consumer gave back what it had buffered): visible again now and the
        delivery not counted, as if it had not been handed out. False if not held."""
        e = self._entries.get(offset)
        if e is None or e.state != LEASED or e.consumer != consumer or e.deadline_ms <= now_ms:
            return False
        self._undo_lease(e, now_ms)
        return True

    def answered(self, consumer: str, offset: int, now_ms: int, visibility_ms: int = 0) -> int:
        """The answer carrying ``consumer``'s lease of ``offset`` leaves now: the lease's
        clock starts now (its deadline, returned), not when it was taken, since a state write
        that took longer than the visibility timeout would hand out leases already over.
        0 if the lease is no longer there (it ended meanwhile and was undone): leave it out."""
        e = self._entries.get(offset)
        if e is None or e.state != LEASED or e.consumer != consumer or not e.unanswered:
            return 0
        e.unanswered = False
        e.deadline_ms = now_ms + (visibility_ms or self.config.visibility_timeout_ms)
        heapq.heappush(self._leases, (e.deadline_ms, offset))
        return e.deadline_ms

    def _undo_lease(self, e: Entry, now_ms: int) -> None:
        e.delivery_count -= 1
        e.unanswered = False
        e.visible_at_ms = now_ms
        self._make_available(e, now_ms)
        self._record(e)

    def extend(self, consumer: str, offset: int, now_ms: int, ms: int) -> int:
        """Move the lease deadline to ``now_ms + ms`` (SQS ChangeMessageVisibility); returns it."""
        check_visibility_ms(ms)
        e = self._held(consumer, offset, now_ms)
        e.deadline_ms = now_ms + ms
        heapq.heappush(self._leases, (e.deadline_ms, offset))
        return e.deadline_ms

    def release_consumer(self, consumer: str, now_ms: int) -> list[Finished]:
        """A consumer left cleanly: its leases end now (counted as deliveries, like expiry)."""
        for e in self._entries.values():
            if e.state == LEASED and e.consumer == consumer:
                e.deadline_ms = now_ms
                heapq.heappush(self._leases, (now_ms, e.offset))
        return self.tick(now_ms)

    # ----- time -----
    def tick(self, now_ms: int) -> list[Finished]:
        """Apply what ``now_ms`` implies: leases expire, delays end, TTLs pass."""
        out: list[Finished] = []
        while self._leases and self._leases[0][0] <= now_ms:
            deadline, off = heapq.heappop(self._leases)
            e = self._entries.get(off)
            if e is None or e.state != LEASED or e.deadline_ms != deadline:
                continue  # acked, extended or nacked since
            if e.unanswered:  # never handed out (its answer still waits for a write): not a delivery
                self._undo_lease(e, now_ms)
                continue
            e.last_reason = REASON_EXPIRED
            if e.delivery_count >= self.config.max_deliveries:
                out.append(self._finish(e, REASON_EXPIRED))
            else:
                self._make_available(e, now_ms)
                self._record(e)
        while self._delayed and self._delayed[0][0] <= now_ms:
            at, off = heapq.heappop(self._delayed)
            e = self._entries.get(off)
            if e is not None and e.state == DELAYED and e.visible_at_ms == at:
                self._make_available(e, now_ms)
        while self._ttl and self._ttl[0][0] <= now_ms:
            _, off = heapq.heappop(self._ttl)
            e = self._entries.get(off)
            # A leased message is left to its worker; TTL applies when it comes back.
            if e is not None and e.state in (AVAILABLE, DELAYED):
                out.append(self._finish(e, REASON_TTL))
            elif e is not None and e.state == LEASED:
                heapq.heappush(self._ttl, (e.deadline_ms, off))
        return out

    def next_wakeup_ms(self) -> int:
        """The earliest time at which ``tick`` would change something (0: none pending)."""
        times = [h[0][0] for h in (self._leases, self._delayed, self._ttl) if h]
        return min(times) if times else 0

    # ----- durability -----
    def drain_changes(self) -> list[Change]:
        """The changes since the last drain, oldest first; the caller persists them."""
        out, self._changes = self._changes, []
        return out

    def restore(self, change: Change, now_ms: int) -> None:
        """Apply a persisted change while rebuilding (after the data log is replayed).

        A lease does not survive a new leader: it is restored as a lease held by nobody that
        ends now, so the next ``tick`` treats it as any lease that ended without an ack:
        visible again with its delivery count kept (at-least-once; the worker's ack would be
        refused anyway), or dead-lettered if that was its last allowed delivery.
        """
        e = self._entries.get(change.offset)
        if e is None or e.state in _DONE:
            return  # before the start offset, or already done
        e.delivery_count, e.last_reason = change.delivery_count, change.reason
        if change.state in _DONE:
            self._move(e, change.state)
            self._closed(e)
            if change.counted:
                self.dead_total += change.state == DEAD
                self.dropped_total += change.state == DROPPED
            self._advance()
        elif change.state == LEASED:
            self._move(e, LEASED)
            e.consumer, e.deadline_ms = "", now_ms
            heapq.heappush(self._leases, (now_ms, e.offset))
        else:
            # ``visible_at_ms`` is the old leader's clock: from a leader 3 h behind ours it
            # hid a nacked message (or one given back) for 3 h. Never more than the delay
            # it had left when written, from now (docs/DESIGN.md, "Clocks").
            left_ms = max(0, change.visible_at_ms - change.written_ms)
            e.visible_at_ms = min(change.visible_at_ms, now_ms + left_ms) if change.written_ms else change.visible_at_ms
            self._make_available(e, now_ms)

    def restatement(self) -> list[Change]:
        """What a new leader needs, besides the data log, to rebuild this state: a change for
        every message from the start offset on that is not as the log alone says (delivered,
        nacked or done), oldest first. A message never delivered (or whose one delivery was
        undone) is left out: its replayed record is its state. O(messages held)."""
        return [Change(e.offset, e.state, e.delivery_count, e.visible_at_ms, e.last_reason, counted=False)
                for e in sorted(self._entries.values(), key=lambda e: e.offset)
                if e.delivery_count or e.state not in (AVAILABLE, DELAYED)]

    def drop_dead_letter(self, offset: int) -> None:
        """Dropped, not dead-lettered: its dead letter fits no batch the dead-letter topic takes."""
        self.dead_total, self.dropped_total = self.dead_total - 1, self.dropped_total + 1
        if (e := self._entries.get(offset)) is not None and e.state == DEAD:
            self._move(e, DROPPED)

    def _record(self, e: Entry) -> None:
        self._changes.append(Change(e.offset, e.state, e.delivery_count, e.visible_at_ms, e.last_reason))

    # ----- reading -----
    def live_leases(self, now_ms: int) -> int:
        """Leases not ended at ``now_ms`` (one past its deadline but not ticked yet is over)."""
        if not self._in_state[LEASED]:
            return 0  # O(1) for the usual idle group; O(entries) only when something is leased
        return sum(1 for e in self._entries.values() if e.state == LEASED and e.deadline_ms > now_ms)

    def entry(self, offset: int) -> Entry | None:
        return self._entries.get(offset)

    def counts(self) -> dict[str, int]:
        # _advance keeps the start offset on the first message not done (or at next_offset).
        oldest = self.start_offset if self.start_offset in self._entries else -1
        return {
            "visible": self._in_state[AVAILABLE],
            "in_flight": self._in_state[LEASED],
            "delayed": self._in_state[DELAYED],
            "dead_lettered": self.dead_total,
            "dropped": self.dropped_total,
            "deduplicated": self.deduplicated_total,
            "bytes": self._bytes,
            "start_offset": self.start_offset,
            "oldest_offset": oldest,
        }

    # ----- internals -----
    def _make_available(self, e: Entry, now_ms: int) -> None:
        e.consumer, e.deadline_ms = "", 0
        if e.expires_at_ms and e.expires_at_ms <= now_ms:
            # Its TTL passed while it was leased (left to its worker until then); a lease
            # that ends by a nack or a release would otherwise make it visible at once, and
            # the next receive would deliver an expired message. Due now: the next tick
            # (every receive and describe ticks first) expires it.
            heapq.heappush(self._ttl, (now_ms, e.offset))
        if e.visible_at_ms > now_ms:
            # Only tick() passing visible_at moves it on: a message is never visible early.
            self._move(e, DELAYED)
            heapq.heappush(self._delayed, (e.visible_at_ms, e.offset))
        else:
            self._move(e, AVAILABLE)
            heapq.heappush(self._visible, (-e.priority, e.offset))

    def _move(self, e: Entry, state: str) -> None:
        """The one place an entry changes state, so the per-state counts stay true."""
        counts = self._in_state
        if e.state in counts:
            counts[e.state] -= 1
        e.state = state
        if state in counts:
            counts[state] += 1

    def _closed(self, e: Entry) -> None:
        """``e`` just became done: it no longer counts against the size limits."""
        self._open -= 1
        self._open_bytes -= e.size_bytes

    def _finish(self, e: Entry, reason: str) -> Finished:
        e.last_reason = reason
        self._closed(e)
        if self.config.dead_letter:
            self._move(e, DEAD)
            self.dead_total += 1
        else:
            self._move(e, DROPPED)
            self.dropped_total += 1
        done = Finished(e.offset, e.state, e.delivery_count, reason)
        self._record(e)
        self._advance()
        return done

    def _advance(self) -> None:
        """Move the start offset past done messages and forget them."""
        while self.start_offset < self.next_offset:
            e = self._entries.get(self.start_offset)
            if e is not None and e.state not in _DONE:
                break
            if e is not None:
                if e.state != ACKED:
                    self._given_up[e.offset] = e.state
                    if len(self._given_up) > GIVEN_UP_REMEMBERED_MAX:
                        del self._given_up[next(iter(self._given_up))]
                self._bytes -= e.size_bytes
                del self._entries[self.start_offset]
            self.start_offset += 1
