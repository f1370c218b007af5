"""Queue mode for workers: ``QueueConsumer`` receives messages leased to it, one worker at a time.

    from sdk import QueueConsumer

    with QueueConsumer("zk://127.0.0.1:2181", "jobs", group="workers") as worker:
        for msg in worker:                  # long-polls; each message leased for the visibility timeout
            handle(msg.value)
            worker.ack(msg)                 # or worker.nack(msg, delay_ms=5000), worker.extend(msg, 60_000)

Competing consumers in one group share the messages; separate groups each get every
message. A message not acknowledged before its lease ends (the worker died, or was too
slow) is delivered again with ``delivery_count + 1``; after the queue's ``max_deliveries``
it goes to the dead-letter queue. Delivery is at-least-once: handlers should be idempotent.
The rules and bounds are in docs/QUEUES.md; the frames in docs/PROTOCOL.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import zmq

from fabric import errors
from fabric.auth.curve import ClientSecurity
from fabric.protocol import apis
from fabric.protocol import queues as qp
from fabric.protocol.apis import ApiKey
from fabric.transport import FROM_ENV
from sdk._arguments import I32_MAX, int_arg, optional_str_arg, str_arg
from sdk._client import METADATA_TIMEOUT_MS, Bootstrap, Connections, MetadataClient, TopicMetadata

log = logging.getLogger("fabric.queue")

REQUEST_SLACK_MS: Final[int] = 5_000  # a long poll unanswered this long past its wait is abandoned
RECEIVE_RETRY_S: Final[float] = 0.1  # pause after a round in which every node refused
NO_WAIT_ANSWER_MS: Final[int] = 5_000  # receive(wait_ms=0) waits this long at most for the nodes' answers
# A partition whose leader is unreachable this long, or that has no leader in the routing
# map at all, makes the consumer read the map again, at most this often. Leaderless counts
# too: a map read while a dead leader's session has just expired names that leader with
# the node itself gone from the map's node list (for milliseconds, or as long as the
# controller takes to elect), and a consumer that only re-read the map when a send failed
# never asked again: with nothing to send to, it polled nobody for ever.
UNREACHABLE_REFRESH_S: Final[float] = 0.25
# One re-read of the routing map within a receive (or a settle) ends by this, every node
# and pass included (MetadataClient.refresh's own passes could take about 40 s when nodes
# accept connections and never answer): a receive returns within its wait plus this.
MAP_REFRESH_TIMEOUT_MS: Final[int] = METADATA_TIMEOUT_MS
ITERATION_BATCH_MESSAGES: Final[int] = 10  # what iteration (next_message) asks the nodes for at a time
BUFFER_MESSAGES_MAX: Final[int] = qp.RECEIVE_MESSAGES_MAX  # leased but not yet handed out
SETTLE_TIMEOUT_MS: Final[int] = 15_000
# A long poll waits on the sockets in slices this long, so that a close() from another
# thread ends a receive (and an iteration) within about this much, not at the end of its
# wait_ms (up to 20 s).
CLOSE_CHECK_INTERVAL_MS: Final[int] = 200


@dataclass(frozen=True)
class QueueMessage:
    """One leased message. ``deadline_ms`` is when the lease ends unless extended, by the
    wall clock of the node that granted it (which need not agree with this host's)."""

    queue: str
    partition: int
    offset: int
    delivery_count: int
    deadline_ms: int
    timestamp_ms: int
    priority: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    # The node that granted the lease: settling goes there (a lease does not move with leadership).
    granted_by: str = field(default="", repr=False, compare=False)
    # The partition's leader epoch in the consumer's routing map when the lease arrived (-1:
    # none known). The lease ends when the map moves past it to another leader; a map that
    # has not moved since then may be older than the grant, and says nothing about it.
    map_epoch_at_grant: int = field(default=-1, repr=False, compare=False)
    # When the lease ends by this process's time.monotonic(): ``deadline_ms`` read against
    # the granting node's clock as its answer left (QUEUE_RECEIVE version 1), so a host
    # whose clock is ahead of the nodes' does not take live leases as over.
    lease_ends_s: float = field(default=math.inf, repr=False, compare=False)

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


class QueueConsumer:
    """A worker of ``queue`` in ``group`` (``"default"`` unless named).

    One consumer belongs to one thread: its calls are not meant to run from several
    threads at once (ZeroMQ sockets are not thread-safe). The one exception is ``close()``,
    which may come from another thread to stop a worker: it waits for the call in
    progress on the consumer's sockets, and that thread's ``for msg in worker`` loop (or
    ``run()``) ends with no exception, within about CLOSE_CHECK_INTERVAL_MS (200 ms) when
    it was waiting for messages; a ``receive()`` or ``next_message()`` it interrupts raises
    ClientClosedError, as every call after ``close()`` does. ``run(handler,
    should_stop=...)`` stops without a second thread, and acks what it handled first.

    ``bootstrap`` comes before ``queue``, as for every client; None (``QueueConsumer(None,
    "jobs")``): ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded."""

    def __init__(self, bootstrap: str | None, queue: str, group: str = qp.DEFAULT_GROUP, *, consumer_id: str | None = None,
                 visibility_timeout_ms: int = 0, context: zmq.Context[Any] | None = None,
                 security: ClientSecurity | None = None) -> None:
        # visibility_timeout_ms: 0 takes the queue's (30 s unless it was created otherwise).
        # Everything is checked before a socket is opened; the ranges are the node's.
        str_arg("queue", queue)
        _check_name("group", str_arg("group", group))
        consumer_id = optional_str_arg("consumer_id", consumer_id)
        if consumer_id:
            _check_name("consumer_id", consumer_id)
        int_arg("visibility_timeout_ms", visibility_timeout_ms, -I32_MAX - 1, I32_MAX)
        meta_bootstrap = Bootstrap(bootstrap)
        if visibility_timeout_ms and not 0 < visibility_timeout_ms <= qp.VISIBILITY_TIMEOUT_MS_MAX:
            raise errors.InvalidVisibilityTimeoutError(
                f"visibility_timeout_ms {visibility_timeout_ms} outside 1..VISIBILITY_TIMEOUT_MS_MAX "
                f"({qp.VISIBILITY_TIMEOUT_MS_MAX} ms, 12 h)")
        self.queue = queue
        self.group = group
        self.consumer_id = consumer_id or f"{uuid.uuid4().hex[:12]}"
        self.visibility_timeout_ms = visibility_timeout_ms
        self._conns = Connections(context, security=security or FROM_ENV)
        self._meta = MetadataClient(meta_bootstrap, self._conns)
        self._buffer: deque[QueueMessage] = deque()
        # node address -> (correlation id, give-up time, when sent), time.monotonic()
        self._polls: dict[str, tuple[int, float, float]] = {}
        self._looked_s = 0.0  # when this consumer last finished reading its sockets (_take_replies)
        self._closed = False
        self._unreachable_since: dict[str, float] = {}
        self._refreshed_s = 0.0
        # Nodes that answered QUEUE_RECEIVE version 1 with UNSUPPORTED_VERSION (an older
        # node): asked with version 0, whose deadlines are read against this host's clock.
        self._receive_v0: set[str] = set()
        # Every re-read of the routing map ends by this (time.monotonic()): set by each call
        # from its own wait, so that no call waits on the map past its documented bound.
        self._refresh_by_s = math.inf
        # Held by each call while it uses the sockets, and by close(): a close() from another
        # thread (a supervisor stopping a worker's loop) closed them under the iterating
        # thread's long poll, which raised a raw ZMQError ("Socket operation on non-socket")
        # there, and libzmq may not be entered on one socket from two threads at all. Such
        # a close() sets ``_close_requested`` first, which ends that poll at its next slice
        # (CLOSE_CHECK_INTERVAL_MS) and refuses new calls, so the lock is let go soon.
        self._use_lock = threading.RLock()
        self._close_requested = False

    # -- receiving ------------------------------------------------------------------------------
    def receive(self, max_messages: int = 10, wait_ms: int = 0) -> list[QueueMessage]:
        """Up to ``max_messages`` messages leased to this consumer; waits up to ``wait_ms``
        (at most RECEIVE_WAIT_MS_MAX, 20 s) for the first one (long polling). A ``close()``
        from another thread meanwhile ends the wait with ClientClosedError."""
        int_arg("max_messages", max_messages, -I32_MAX - 1, I32_MAX)  # types; the ranges just below
        if not 1 <= max_messages <= qp.RECEIVE_MESSAGES_MAX:
            raise errors.InvalidRequestError(
                f"max_messages {max_messages} outside 1..RECEIVE_MESSAGES_MAX ({qp.RECEIVE_MESSAGES_MAX})")
        _check_wait(wait_ms)
        with self._use_lock:
            self._check_open()
            if wait_ms == 0:
                self._receive_now(max_messages)
            else:
                self._receive_within(max_messages, wait_ms)
            return self._hand_out(max_messages)

    def _refresh_map(self, *, quiet: bool = True) -> None:
        """Re-read the routing map, within MAP_REFRESH_TIMEOUT_MS and the current call's
        bound; ``quiet``: a failure is left to the next round, which asks again."""
        now = time.monotonic()
        self._refreshed_s = now
        deadline_s = min(now + MAP_REFRESH_TIMEOUT_MS / 1000.0, max(self._refresh_by_s, now + 0.001))
        try:
            self._meta.refresh([self.queue], deadline_s=deadline_s)
        except errors.FabricError:
            if not quiet:
                raise

    def _leader_of(self, partition: int) -> tuple[str | None, int]:
        """The address and leader epoch the routing map gives ``partition`` (None, -1: none)."""
        meta = self._meta.metadata
        topic = meta.topics.get(self.queue)
        if topic is None or not 0 <= partition < len(topic.partitions):
            return None, -1
        state = topic.partitions[partition]
        return meta.nodes.get(state.leader), state.leader_epoch

    def next_message(self, wait_ms: int = qp.RECEIVE_WAIT_MS_MAX) -> QueueMessage | None:
        """One message, waiting up to ``wait_ms`` (None if none came). Asks the nodes for up
        to 10 at a time, but takes each from the buffer only as it is handed out: a loop left
        early (``break``, an exception) leaves the rest buffered, and ``close()`` gives them
        back at once instead of their leases running out (what iteration uses). A ``close()``
        from another thread meanwhile ends the wait with ClientClosedError."""
        _check_wait(wait_ms)
        with self._use_lock:
            self._check_open()
            return self._next_buffered(wait_ms)

    def _next_buffered(self, wait_ms: int) -> QueueMessage | None:
        """``next_message``'s work, the lock held."""
        if not self._buffered():
            self._receive_within(ITERATION_BATCH_MESSAGES, wait_ms)
        return self._buffer.popleft() if self._buffered() else None

    def _receive_within(self, max_messages: int, wait_ms: int) -> None:
        """Long-polls until something is buffered or ``wait_ms`` has passed."""
        deadline = time.monotonic() + wait_ms / 1000.0
        self._refresh_by_s = deadline + MAP_REFRESH_TIMEOUT_MS / 1000.0
        refused_rounds = 0
        while True:
            self._raise_if_close_requested()
            self._take_replies(0)
            if self._buffered():
                break
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)  # up: never a 0 ms spin
            all_sent = self._send_polls(max_messages, max(0, remaining_ms))
            # A node not connected yet is asked again shortly, not after the whole wait; and
            # the wait is cut in slices, each ending with a look at a close() from another
            # thread (the polls sent stay out: the next slice only waits for their answers).
            slice_ms = CLOSE_CHECK_INTERVAL_MS if all_sent else min(CLOSE_CHECK_INTERVAL_MS, int(RECEIVE_RETRY_S * 1000))
            self._take_replies(min(max(0, remaining_ms), slice_ms))
            if self._buffered() or time.monotonic() >= deadline:
                break
            if all_sent and not self._polls:
                # Every node answered before the wait ended, with nothing: refusals
                # (NOT_LEADER, NODE_NOT_READY while a leader changes). Ask again at once
                # (the metadata was refreshed), then pause between rounds, not a request
                # and a metadata refresh per node in a tight loop for the whole wait.
                refused_rounds += 1
                if refused_rounds > 1:
                    time.sleep(min(RECEIVE_RETRY_S, max(0.0, deadline - time.monotonic())))

    def _receive_now(self, max_messages: int) -> None:
        """``wait_ms=0``: one round to every leader, which answers at once with what is
        visible; wait for those answers (bounded), not for new messages."""
        self._refresh_by_s = time.monotonic() + (NO_WAIT_ANSWER_MS + MAP_REFRESH_TIMEOUT_MS) / 1000.0
        self._take_replies(0)
        if not self._buffered():
            give_up = time.monotonic() + NO_WAIT_ANSWER_MS / 1000.0
            for _ in range(2):  # a second round for nodes whose connection was still being made
                all_sent = self._send_polls(max_messages, 0)
                while self._polls and not self._buffer and time.monotonic() < give_up:
                    self._raise_if_close_requested()
                    self._take_replies(min(CLOSE_CHECK_INTERVAL_MS, max(1, int((give_up - time.monotonic()) * 1000))))
                if self._buffer or all_sent:
                    break
                time.sleep(RECEIVE_RETRY_S)

    def _buffered(self) -> bool:
        """Whether messages are buffered, after dropping those whose lease ended while they
        waited there (a receive asks every leader, so more can arrive than one call takes,
        and a poll's answer can sit unread while the worker is busy): the leader gives them
        to another worker, which may have acked them already. Judged on this process's
        monotonic clock (``lease_ends_s``), not by comparing the leader's ``deadline_ms``
        with this host's wall clock: a worker whose clock ran a minute ahead of the nodes'
        dropped every message it received, which went to the dead-letter queue unseen. A
        lease also ends when its partition's leader changes (docs/QUEUES.md): messages
        granted by a node that no longer leads their partition, as far as this consumer's
        map knows, are dropped too (``_drop_granted_by`` when a node's connection drops).
        "No longer" means the map moved to another leader after the lease arrived: a map
        read before a failover still names the dead leader while the new one already
        grants, and dropping those grants took each of its answers from the buffer and
        asked again, leasing (and counting a delivery of) the partition's whole backlog
        within milliseconds, none of it seen until the visibility timeout ended."""
        now_s = time.monotonic()
        if any(self._lease_ended(m, now_s) for m in self._buffer):
            live = deque(m for m in self._buffer if not self._lease_ended(m, now_s))
            log.warning("%d received messages not handed out: their lease ended before they were (they "
                        "waited here past it, or the partition's leader changed)", len(self._buffer) - len(live))
            self._buffer = live
        return bool(self._buffer)

    def _lease_ended(self, message: QueueMessage, now_s: float) -> bool:
        if message.lease_ends_s <= now_s:
            return True
        leader, epoch = self._leader_of(message.partition)
        return leader not in (None, message.granted_by) and epoch > message.map_epoch_at_grant

    def _drop_granted_by(self, address: str) -> None:
        """The connection to ``address`` dropped (killed, restarted): the leases it granted
        end with its leadership, and another worker may get and ack those messages before
        this one would hand them out (a fault test saw 49 handled twice that way)."""
        if any(m.granted_by == address for m in self._buffer):
            live = deque(m for m in self._buffer if m.granted_by != address)
            log.warning("%d received messages not handed out: node %s, which leased them, went away",
                        len(self._buffer) - len(live), address)
            self._buffer = live

    def _hand_out(self, max_messages: int) -> list[QueueMessage]:
        self._buffered()
        return [self._buffer.popleft() for _ in range(min(max_messages, len(self._buffer)))]

    def __iter__(self) -> Iterator[QueueMessage]:
        """Messages one by one, long-polling for ever; see ``next_message``. Ends (no
        exception) once ``close()`` is called, also from another thread: the iteration
        then hands out nothing more, and what it had received goes back with the close,
        as the Consumer's iteration ends at its ``close()``."""
        while True:
            with self._use_lock:
                if self._closed or self._close_requested:
                    return
                try:
                    message = self._next_buffered(qp.RECEIVE_WAIT_MS_MAX)
                except errors.ClientClosedError:
                    if self._close_requested:
                        return  # closed from another thread while this waited
                    raise
                if message is not None and self._close_requested:
                    # Taken just as a close() came: it goes back with the others (the close
                    # waits for this lock), not to a loop that is being stopped.
                    self._buffer.appendleft(message)
                    return
            if message is not None:
                yield message

    def run(self, handler: Callable[[QueueMessage], Any], *, max_messages: int = 10,
            should_stop: Callable[[], bool] = lambda: False) -> None:
        """A worker loop: each message to ``handler``; acked when it returns (batched per
        receive, but sent before half of a lease has passed, so a batch of slow handlers
        does not outlive its leases), nacked with the exception as reason when it raises.
        A message whose lease ended before its turn is skipped (another worker may have it)
        and a settle refused because a lease ended is logged, not raised: the message is
        delivered again (or, when the request failed after it was sent, maybe settled), as
        docs/QUEUES.md says. What was handled is acked even when the
        loop is left by an exception that is not the handler's ``Exception``.

        ``should_stop`` is asked before each receive, which waits at most 1 s: the way to
        stop a worker (``should_stop=stop_event.is_set``), after acking what it handled.
        A ``close()`` from another thread ends the loop too, without the acks still due."""
        while not self._closed and not self._close_requested and not should_stop():
            try:
                batch = self.receive(max_messages, 1_000)
            except errors.ClientClosedError:
                if self._close_requested:
                    return  # close() from another thread: the loop ends, as iteration does
                raise
            received_s = time.monotonic()  # leases are judged on this clock (lease_ends_s)
            done: list[QueueMessage] = []
            try:
                for msg in batch:
                    if self._close_requested:
                        # Stopped from another thread: the rest are not handled, and what was
                        # handled cannot be acked once the close has closed the sockets: all of
                        # them are delivered again when their leases end.
                        break
                    now_s = time.monotonic()
                    if msg.lease_ends_s <= now_s:
                        log.warning("%s/%d: lease ended before the handler's turn; not handled (delivered again)",
                                    msg.partition, msg.offset)
                        continue
                    if done and now_s >= (received_s + min(m.lease_ends_s for m in done)) / 2:
                        self._settle_quietly(done, qp.ACTION_ACK, "")
                        done = []
                    try:
                        handler(msg)
                    except Exception as exc:  # the handler's failure is the message's, not the loop's
                        self._settle_quietly([msg], qp.ACTION_NACK, f"{type(exc).__name__}: {exc}")
                    else:
                        done.append(msg)
            finally:
                if done and not self._closed:
                    self._settle_quietly(done, qp.ACTION_ACK, "")

    def _settle_quietly(self, messages: list[QueueMessage], action: int, reason: str) -> None:
        """``run()``'s settles: a lease that ended is the documented redelivery, not an error;
        nor is a close() from another thread that came first (delivered again too)."""
        try:
            self._settle(messages, action, 0, reason)
        except errors.LeaseNotHeldError as exc:
            log.warning("%s", exc.message)
        except errors.ClientClosedError:
            if not self._close_requested:
                raise
            log.warning("%d handled messages not settled: the consumer was closed first (they are delivered "
                        "again once their lease ends)", len(messages))

    def _node_addresses(self) -> set[str]:
        if self.queue not in self._meta.metadata.topics:
            # The first round (or the queue was missing from the last answer): no map at
            # all is raised (no node answered, a refusal), as an unknown queue is below.
            self._refresh_map(quiet=False)
        topic = self._queue_map()
        if topic is None:
            return set()
        addresses = {self._meta.metadata.leader_address(self.queue, p.partition) for p in topic.partitions}
        now = time.monotonic()
        if (None in addresses or any(now - since > UNREACHABLE_REFRESH_S for since in self._unreachable_since.values())) \
                and now - self._refreshed_s > UNREACHABLE_REFRESH_S:
            # A leader we cannot reach may have been replaced, and a partition without one
            # in the map gets one at the next election: ask the cluster again.
            self._unreachable_since.clear()
            self._refresh_map()
            topic = self._queue_map()
            if topic is None:
                return set()
            addresses = {self._meta.metadata.leader_address(self.queue, p.partition) for p in topic.partitions}
        return {a for a in addresses if a}

    def _queue_map(self) -> TopicMetadata | None:
        """The queue's map; None while METADATA lists it with a retriable error (a queue
        just created is LEADER_NOT_AVAILABLE until the node asked has learned it,
        NODE_NOT_READY): no node to ask this round, the next asks again. Any other error
        (an unknown queue, AUTHORIZATION_FAILED) is raised."""
        try:
            return self._meta.topic(self.queue, refresh_if_missing=False)
        except errors.FabricError as exc:
            if exc.retriable:
                return None
            raise

    def _send_polls(self, max_messages: int, wait_ms: int) -> bool:
        """A RECEIVE to every node leading a partition of the queue that has none pending;
        False when some node could not be asked (its connection is still being made)."""
        all_sent = True
        room = max(1, min(max_messages, BUFFER_MESSAGES_MAX - len(self._buffer)))
        for address in sorted(self._node_addresses()):
            if address in self._polls:
                continue
            correlation_id = self._conns.next_id()
            body = {"queue": self.queue, "group": self.group, "consumer_id": self.consumer_id, "partition": -1,
                    "max_messages": room, "wait_ms": wait_ms, "visibility_timeout_ms": self.visibility_timeout_ms}
            version = 0 if address in self._receive_v0 else 1  # 1: the answer carries the node's clock
            try:
                self._conns.send(address, apis.encode_request(ApiKey.QUEUE_RECEIVE, body, correlation_id,
                                                              api_version=version), wait_connect_ms=0)
            except errors.FabricError:
                all_sent = False  # not connected (yet, or any more: the node may be gone)
                self._unreachable_since.setdefault(address, time.monotonic())
                continue
            self._unreachable_since.pop(address, None)
            sent_s = time.monotonic()
            self._polls[address] = (correlation_id, sent_s + (wait_ms + REQUEST_SLACK_MS) / 1000.0, sent_s)
        return all_sent

    def _take_replies(self, timeout_ms: int) -> None:
        # Answers already waiting may have waited since we last looked (the worker was busy
        # handling messages): their leases count from then, or from the poll if later. One
        # that comes while we wait in poll() left the node just now.
        replies, waited = self._conns.drain(), True
        polled_s = time.monotonic()  # nothing was waiting: what poll() returns left the node after this
        if not replies and timeout_ms > 0:
            replies, waited = self._conns.poll(timeout_ms), False
        read_s = time.monotonic()  # what comes from now on is read next time
        refresh = False
        fatal: errors.FabricError | None = None
        for address, frames in replies:
            try:
                message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            except errors.FabricError:
                continue
            pending = self._polls.get(address)
            if pending is None or pending[0] != message.header.correlation_id:
                continue  # an abandoned poll: its leases expire and the messages come back
            if message.header.api_key != ApiKey.QUEUE_RECEIVE:
                continue  # another API's answer with the poll's correlation id (a buggy node): not ours
            del self._polls[address]
            # When the answer left, at the earliest. One that poll() returned left after the
            # poll began, not when it was read: this process may have been stopped in that
            # poll (SIGSTOP, a stalled VM) while its leases ran out and another worker got
            # and acked those messages, which were then handed out here again.
            left_s = max(pending[2], self._looked_s) if waited else max(pending[2], polled_s)
            if message.header.error_code == errors.UnsupportedVersionError.code and message.header.api_version:
                self._receive_v0.add(address)  # an older node: ask again with version 0
                continue
            if message.header.error_code:
                error = errors.error_for_code(message.header.error_code)
                if not error.retriable and fatal is None:
                    # Refused for good (no ACL, a bad request): say so rather than poll on.
                    fatal = error(str(message.body.get("message", "")) or error.description)
                refresh = True  # NOT_LEADER and the like: ask again after a refresh
                continue
            # Each lease on our monotonic clock: version 1 says how long it had as the answer
            # left; version 0 only when it ends by the node's wall clock, read against ours.
            node_now_ms = message.body.get("now_ms")
            if node_now_ms is None:
                left_s, node_now_ms = time.monotonic(), time.time() * 1000
            for m in message.body["messages"]:
                leader, epoch = self._leader_of(m["partition"])
                if leader != address:
                    # The node leads a partition our map gives to another (a failover the
                    # map has not seen yet): keep the lease, and read the map again.
                    refresh = True
                self._buffer.append(QueueMessage(
                    self.queue, m["partition"], m["offset"], m["delivery_count"], m["deadline_ms"], m["timestamp_ms"],
                    m["priority"], m["key"], m["value"], [(h["key"], h["value"]) for h in m["headers"]], address,
                    epoch, left_s + (m["deadline_ms"] - node_now_ms) / 1000.0))
        now = time.monotonic()
        for address in self._conns.take_disconnected():
            # The node went away (killed, restarted): its long poll will not be answered,
            # and the leases it granted end with its leadership.
            if self._polls.pop(address, None) is not None:
                refresh = True
            # A node restarts when it is upgraded: one that refused version 1 may speak it
            # now, and a consumer that kept asking it with version 0 judged its leases on
            # this host's wall clock for as long as it ran (found in a rolling upgrade).
            self._receive_v0.discard(address)
            self._drop_granted_by(address)
            self._conns.drop(address)
        self._looked_s = read_s
        for address, (_cid, give_up, _sent) in list(self._polls.items()):
            if now > give_up:
                del self._polls[address]
                self._conns.drop(address)
                refresh = True
        if refresh:
            self._refresh_map()
        if fatal is not None:
            raise fatal

    # -- settling ---------------------------------------------------------------------------------
    def ack(self, messages: QueueMessage | Iterable[QueueMessage]) -> None:
        """Acknowledge (done: never delivered again). Many messages go in one request per
        node. Idempotent: a message the group already acknowledged (this consumer, or
        another after a redelivery) or purged is no error. Raises LeaseNotHeldError whose
        ``lost`` lists the messages not known to be acknowledged. Those of them also in its
        ``unknown`` failed after the request was sent (the leader moved or went away
        meanwhile): each is either acknowledged or delivered again. Of the rest, those whose
        request could not be sent (their leader unreachable) are delivered again once their
        lease ends; the others had lost their lease: delivered again. Its ``settled`` lists
        those dead-lettered or dropped before the ack came (their last lease had ended):
        not delivered again. The messages in none of them are acknowledged."""
        self._settle(_many(messages), qp.ACTION_ACK, 0, "")

    def nack(self, messages: QueueMessage | Iterable[QueueMessage], delay_ms: int = 0, reason: str = "") -> None:
        """Give back: visible again after ``delay_ms`` (or dead-lettered at max_deliveries)."""
        int_arg("delay_ms", delay_ms, -I32_MAX - 1, I32_MAX)
        str_arg("reason", reason)
        if not 0 <= delay_ms <= qp.DELAY_MS_MAX:
            raise errors.InvalidDelayError(f"delay_ms {delay_ms} outside 0..DELAY_MS_MAX ({qp.DELAY_MS_MAX} ms)")
        self._settle(_many(messages), qp.ACTION_NACK, delay_ms, reason)

    def extend(self, message: QueueMessage, ms: int) -> int:
        """Keep working: the lease now ends ``ms`` from now (SQS ChangeMessageVisibility).
        Returns the new deadline (wall-clock ms)."""
        int_arg("ms", ms, -I32_MAX - 1, I32_MAX)
        message = _many(message, single=True)[0]
        if not 0 < ms <= qp.VISIBILITY_TIMEOUT_MS_MAX:
            raise errors.InvalidVisibilityTimeoutError(
                f"extend by {ms} ms outside 1..VISIBILITY_TIMEOUT_MS_MAX ({qp.VISIBILITY_TIMEOUT_MS_MAX} ms)")
        return self._settle([message], qp.ACTION_EXTEND, ms, "")[0]

    def _settle(self, messages: list[QueueMessage], action: int, arg_ms: int, reason: str) -> list[int]:
        with self._use_lock:
            self._check_open()
            return self._settle_now(messages, action, arg_ms, reason)

    def _settle_now(self, messages: list[QueueMessage], action: int, arg_ms: int, reason: str) -> list[int]:
        """``_settle``'s work, the lock held (also close()'s, which is past the check)."""
        if not messages:
            return []
        by_node: dict[str, list[QueueMessage]] = {}
        for msg in messages:
            if msg.queue != self.queue:
                raise errors.InvalidRequestError(f"message of queue {msg.queue!r} settled on {self.queue!r}")
            address = msg.granted_by or self._meta.metadata.leader_address(self.queue, msg.partition)
            by_node.setdefault(address or "", []).append(msg)
        deadlines: dict[tuple[int, int], int] = {}
        lost: list[str] = []
        lost_messages: list[QueueMessage] = []
        unknown_messages: list[QueueMessage] = []
        settled_messages: list[QueueMessage] = []  # finished in the group before: never delivered again
        unsent_count = 0  # of lost: their request never left, so their lease is still live
        for address, group in by_node.items():
            for start in range(0, len(group), qp.SETTLE_ENTRIES_MAX):
                chunk = group[start:start + qp.SETTLE_ENTRIES_MAX]
                entries = [{"partition": m.partition, "offset": m.offset, "action": action, "arg_ms": arg_ms,
                            "reason": reason[:1000]} for m in chunk]
                body = {"queue": self.queue, "group": self.group, "consumer_id": self.consumer_id, "entries": entries}
                try:
                    if not address:
                        raise errors.LeaderNotAvailableError("no leader known")
                    reply = self._conns.request(address, ApiKey.QUEUE_SETTLE, body, timeout_ms=SETTLE_TIMEOUT_MS).body
                except errors.FabricError as exc:
                    # The lease cannot be settled where it was granted: it ends on its own.
                    # Unless the request never left (no leader, sent=False) that is not known:
                    # the leader may have written the settle to __queue_state before failing
                    # (its leadership moved while that write replicated: it answers NOT_LEADER,
                    # yet the follower that becomes the leader holds the write; found by
                    # scripts/upgrade_check.py).
                    lost.extend(f"{m.partition}/{m.offset} ({exc.name})" for m in chunk)
                    lost_messages.extend(chunk)
                    if address and exc.fields.get("sent", True):
                        unknown_messages.extend(chunk)
                    else:
                        unsent_count += len(chunk)
                    self._refresh_by_s = time.monotonic() + MAP_REFRESH_TIMEOUT_MS / 1000.0
                    self._refresh_map()
                    continue
                # Each message of the chunk by its position: a result for a position not
                # asked about (a buggy or version-skewed node) raised a bare KeyError, and a
                # message the answer left out counted as settled. It is not known to be.
                results = {(r["partition"], r["offset"]): r for r in reply["results"]}
                for m in chunk:
                    r = results.get((m.partition, m.offset))
                    code = r["error"] if r is not None else -1
                    if code == errors.AlreadySettledError.code:
                        # Done in the group before this call (an ack of an acknowledged or
                        # purged message is answered 0: idempotent): not delivered again.
                        settled_messages.append(m)
                    elif code:
                        # LEASE_NOT_HELD: the lease ended, the message is delivered again.
                        # Anything else (left out of the answer, a leader still reading its
                        # state after a failover) does not say whether it was settled before.
                        lost.append(f"{m.partition}/{m.offset} "
                                    f"({errors.error_for_code(code).name if r is not None else 'left out of the answer'})")
                        lost_messages.append(m)
                        if code != errors.LeaseNotHeldError.code:
                            unknown_messages.append(m)
                    if r is not None:
                        deadlines[(m.partition, m.offset)] = r["deadline_ms"]
        if lost or settled_messages:
            raise _not_settled(len(messages), action, lost, lost_messages, unknown_messages, unsent_count,
                               settled_messages)
        return [deadlines.get((m.partition, m.offset), 0) for m in messages]

    # -- lifecycle --------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or self._close_requested:
            # As every other client of the SDK (and the asyncio QueueConsumer): not a
            # request the nodes refused, the caller's own use after close().
            raise errors.ClientClosedError("this QueueConsumer is closed")

    def _raise_if_close_requested(self) -> None:
        """Between two slices of a wait: a close() from another thread ends this call."""
        if self._close_requested:
            raise errors.ClientClosedError("this QueueConsumer was closed (from another thread) during the receive")

    def close(self) -> None:
        """Give back what was received but not handed out, then close. Idempotent. From
        another thread it first stops the call in progress (see the class docstring) and
        waits for it: about CLOSE_CHECK_INTERVAL_MS for a receive waiting for messages, up
        to MAP_REFRESH_TIMEOUT_MS for one re-reading the routing map, and an ack, nack or
        extend under way until it ends (SETTLE_TIMEOUT_MS a request)."""
        self._close_requested = True  # first: a receive in another thread stops at its next slice
        with self._use_lock:
            if self._closed:
                return
            if self._buffer:
                try:
                    self._settle_now(list(self._buffer), qp.ACTION_RELEASE, 0, "consumer closed")
                except errors.FabricError:
                    pass  # their leases end on their own
                self._buffer.clear()
            self._closed = True
            self._conns.close()

    def __enter__(self) -> QueueConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _not_settled(total: int, action: int, lost: list[str], lost_messages: list[QueueMessage],
                 unknown_messages: list[QueueMessage], unsent_count: int,
                 settled_messages: list[QueueMessage]) -> errors.LeaseNotHeldError:
    """The error of a settle some of whose messages were not settled by it. ``lost``: the
    messages not known to be settled; ``unknown``: those of them whose request failed after
    it was sent (or the answer left out, or a leader still reading its state answered),
    each either settled or delivered again. Of the rest of ``lost``, those the leader
    refused had lost their lease; those whose request never left (no leader known, or no
    connection to it: down, or paused with its lease still live) come back only when their
    lease ends: saying it had ended told the caller they were delivered again at once.
    ``settled``: the group had finished them before this call (for an ack: dead-lettered or
    dropped; for a nack, extend or release: acknowledged, purged, dead-lettered or
    dropped): never delivered to the group again, so never said to be."""
    refused_count = len(lost) - len(unknown_messages) - unsent_count
    outcomes = []
    if refused_count:
        outcomes.append(f"{refused_count} had lost their lease (they are delivered again)")
    if unsent_count:
        outcomes.append(f"{unsent_count} were not sent, their leader could not be reached (they are "
                        "delivered again once their lease ends: at its visibility timeout, or sooner if "
                        "that leader fails over)")
    if unknown_messages:
        outcomes.append(f"for {len(unknown_messages)} the outcome is not known: the request failed after "
                        "it was sent, the answer left them out, or their leader was still reading its state "
                        "after a failover (each is either settled or delivered again)")
    if settled_messages:
        how = ("dead-lettered or dropped before this ack (their last lease had ended)" if action == qp.ACTION_ACK
               else "acknowledged, purged, dead-lettered or dropped")
        outcomes.append(f"{len(settled_messages)} were already {how}: they are not delivered again")
    names = [*lost, *(f"{m.partition}/{m.offset} (ALREADY_SETTLED)" for m in settled_messages)]
    # Every refused message finished before: AlreadySettledError (a LeaseNotHeldError), as
    # the wire's 77, so a caller can tell "nothing comes back" apart without reading lists.
    cls = errors.AlreadySettledError if settled_messages and not lost else errors.LeaseNotHeldError
    return cls(
        f"{len(names)} of {total} messages were not "
        f"{'known to be settled' if unknown_messages else 'settled'} by this call: {'; '.join(outcomes)}: "
        f"{', '.join(names[:10])}{' ...' if len(names) > 10 else ''}", lost=lost_messages,
        unknown=unknown_messages, settled=settled_messages)


def _check_name(what: str, name: str) -> None:
    """The node's bounds on group and consumer ids (fabric/protocol/queues.py NAME_BYTES_MAX),
    checked here so a bad one fails at construction, not at the first receive."""
    if not name or len(name.encode()) > qp.NAME_BYTES_MAX:
        raise errors.InvalidRequestError(f"{what} must be 1..{qp.NAME_BYTES_MAX} bytes, got {name!r:.60}")


def _check_wait(value: object) -> None:
    wait_ms = int_arg("wait_ms", value, -I32_MAX - 1, I32_MAX)  # the type; the range just below
    if not 0 <= wait_ms <= qp.RECEIVE_WAIT_MS_MAX:
        raise errors.InvalidReceiveWaitError(
            f"wait_ms {wait_ms} outside 0..RECEIVE_WAIT_MS_MAX ({qp.RECEIVE_WAIT_MS_MAX} ms)")


def _many(messages: object, *, single: bool = False) -> list[QueueMessage]:
    """The messages to settle, each checked to be a QueueMessage (what ``receive`` returned):
    anything else is refused before a request goes out."""
    if isinstance(messages, QueueMessage):
        return [messages]
    what = "a QueueMessage" if single else "a QueueMessage or a list of them"
    if single or isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise TypeError(f"expected {what} (as receive() returns), got {type(messages).__name__} {messages!r:.60}")
    out = list(messages)
    for m in out:
        if not isinstance(m, QueueMessage):
            raise TypeError(f"expected {what} (as receive() returns), found {type(m).__name__} {m!r:.60} in the list")
    return out
