"""Ephemeral pub/sub: at-most-once, peer to peer, never blocking the publisher.

A process publishes through one PUB socket registered under ``/fabric/publishers``;
each subscription is one SUB socket connected to every registered publisher, filtering on
the pattern's literal prefix in ZeroMQ and matching the wildcards exactly here. A client's
own publishes reach its own subscriptions in process (as a NATS connection's do), not
through its PUB socket: PUB/SUB would drop them until the subscription had found the
publisher in ZooKeeper and connected, and a client subscribing to what it publishes
expects to see it. Losses are
counted, never hidden: ``dropped`` counts messages this subscriber threw away because its
queue was full, ``gaps`` counts messages missing from a publisher's sequence for a subject
(dropped at a high-water mark on the way). Sequences are per subject, not per publisher: a
subscription sees only the subjects its pattern matches (ZeroMQ filters the rest at the
publisher), so a sequence shared by all subjects would count every message of another
subject as lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric.auth.acl import Operation
from fabric.protocol import direct as wire
from sdk.direct import _registry as registry
from sdk.direct._io import SocketReader, make_socket, send_frames
from sdk.direct._io import bind as bind_socket
from sdk.direct._secure import DirectSecurity
from sdk.direct._types import Message, count_arg, handler_arg, to_loop

log = logging.getLogger("fabric.direct")

PUB_HWM = 10_000  # messages queued per subscriber at the publisher before ZeroMQ drops
SUB_HWM = 10_000
PENDING_MAX_DEFAULT = 10_000  # messages a subscription queues for its handler
# Subjects whose sequence a publisher (and, per publisher, a subscriber) keeps; past this
# the least recently used is forgotten: its numbering restarts at 1, which a subscriber
# takes for a restart, not a gap.
SUBJECTS_TRACKED_MAX = 10_000

MessageHandler = Callable[[Message], Awaitable[None] | None]


class Publisher:
    """This process's PUB socket (one per DirectClient, bound lazily on first publish)."""

    def __init__(self, zk: KazooClient, ctx: zmq.Context[Any], *, bind: str = "tcp://127.0.0.1:*",
                 advertise: str | None = None, security: DirectSecurity | None = None,
                 publisher_id: int | None = None) -> None:
        self._zk = zk
        self._security = security
        self._ctx = ctx
        self._bind = bind
        self._advertise = advertise
        self._sock: zmq.Socket[Any] | None = None
        self._registration: registry.Registration | None = None
        self.publisher_id = random.getrandbits(32) if publisher_id is None else publisher_id
        self._sequences: dict[str, int] = {}  # subject -> last sequence, least recently used first
        self.address = ""
        self.published = 0
        self.dropped = 0  # sends refused locally (never: PUB drops silently at its HWM)

    async def start(self) -> None:
        sock = make_socket(self._ctx, zmq.PUB, hwm=PUB_HWM)
        if self._security is not None:
            self._security.bind_socket(sock)  # only registered keys may subscribe
        try:
            self.address = registry.advertised_address(bind_socket(sock, self._bind), self._zk, self._advertise)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise errors.InvalidRequestError(f"publisher cannot bind {self._bind}: {exc}") from None
        self._sock = sock
        info = registry.InstanceInfo.here(self.address, metadata={"publisher_id": self.publisher_id},
                                          curve_key=self._security.public_key if self._security is not None else "")
        registration = registry.Registration(self._zk, registry.PUBLISHERS, registry.PUBLISHER_PREFIX, info,
                                             "publisher")
        try:
            await asyncio.to_thread(registration.start)
        except Exception:
            sock.close(linger=0)
            self._sock = None
            raise
        self._registration = registration

    def publish(self, subject: str, payload: bytes, headers: dict[str, bytes] | None = None) -> int:
        """Never blocks: a PUB socket drops messages for a subscriber whose queue is full.
        Returns the message's sequence number (1, 2, 3, ... per subject)."""
        if self._sock is None:
            raise errors.ClientClosedError("publisher is closed")
        if self._security is not None:
            self._security.require(Operation.PRODUCE, subject)
        sequences = self._sequences
        sequence = (sequences.pop(subject, 0) + 1) & wire.U32_MAX
        frames = wire.publish_frames(subject, self.publisher_id, sequence, payload, headers)
        sequences[subject] = sequence  # after the checks: a refused subject is not kept
        if len(sequences) > SUBJECTS_TRACKED_MAX:
            del sequences[next(iter(sequences))]
        try:
            send_frames(self._sock, frames)
            self.published += 1
        except zmq.Again:
            self.dropped += 1
        return sequence

    async def close(self) -> None:
        if self._registration is not None:
            await asyncio.to_thread(self._registration.close)
            self._registration = None
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None


class Subscription:
    """Messages matching ``pattern`` from every registered publisher. Either give a handler
    (called one message at a time, sync handlers on a worker thread) or iterate with
    ``async for``; not both."""

    def __init__(self, zk: KazooClient, ctx: zmq.Context[Any], pattern: str,
                 handler: MessageHandler | None = None, *, pending_max: int = PENDING_MAX_DEFAULT,
                 security: DirectSecurity | None = None, own_publisher_id: int | None = None) -> None:
        self.pattern = pattern
        self._security = security
        self._tokens = wire.validate_pattern(pattern)
        handler_arg(handler, optional=True)
        count_arg("pending_max", pending_max, 1)
        self.pending_max = pending_max
        self._zk = zk
        self._ctx = ctx
        self._handler = handler
        # The owning client's publisher: delivered in process (deliver_local), never connected to.
        self._own_publisher_id = own_publisher_id
        self._queue: deque[Message] = deque()
        self._ready = asyncio.Event()
        self._sock: zmq.Socket[Any] | None = None
        self._reader: SocketReader | None = None
        self._watch: registry.RegistryWatch | None = None
        self._connected: dict[str, str] = {}  # znode -> address
        self._unusable: set[str] = set()  # registered publishers ZeroMQ cannot dial: warned about once
        # Secure mode: one SUB per publisher, so each message is known to come from that
        # publisher's (pinned) key and is dropped unless its principal may produce the subject.
        self._links: dict[str, tuple[zmq.Socket[Any], SocketReader]] = {}
        self.refused = 0  # secure mode: messages dropped because their publisher may not produce the subject
        # (publisher id, subject) -> last sequence seen, least recently used first
        self._last_sequence: dict[tuple[int, str], int] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.received = 0
        self.dropped = 0
        self.gaps = 0
        self.handler_errors = 0

    @property
    def lost(self) -> int:
        """Every message this subscriber knows it missed: its own drops plus sequence gaps."""
        return self.dropped + self.gaps

    @property
    def publishers(self) -> int:
        return len(self._connected)

    @property
    def closed(self) -> bool:
        return self._closed

    def next_nowait(self) -> Message | None:
        """A message already queued, or None."""
        return self._queue.popleft() if self._queue else None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._security is not None:
            self._security.require(Operation.CONSUME, self.pattern)
        sock = make_socket(self._ctx, zmq.SUB, hwm=SUB_HWM)
        sock.setsockopt(zmq.SUBSCRIBE, wire.pattern_prefix(self.pattern))
        self._sock = sock
        self._reader = SocketReader(self._loop, sock, self._on_message)
        loop = self._loop
        self._watch = registry.RegistryWatch(
            self._zk, registry.PUBLISHERS, lambda found: to_loop(loop, self._publishers_changed, found))
        try:
            await asyncio.to_thread(self._watch.start)
        except BaseException:
            await self.close()  # the SUB socket is not left open behind a failed start
            raise
        if self._handler is not None:
            if not (inspect.iscoroutinefunction(self._handler)):
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fabric-sub")
            self._dispatcher = asyncio.ensure_future(self._dispatch())

    def _publishers_changed(self, found: dict[str, registry.InstanceInfo]) -> None:
        if self._sock is None:
            return
        if self._own_publisher_id is not None:
            found = {z: info for z, info in found.items()
                     if info.metadata.get("publisher_id") != self._own_publisher_id}
        if self._unusable:
            self._unusable.intersection_update(found)
        if self._security is not None:
            self._secure_publishers_changed(found)
            return
        for znode in set(self._connected) - set(found):
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disconnect(self._connected.pop(znode))
        for znode, info in found.items():
            if znode not in self._connected and znode not in self._unusable:
                try:
                    self._sock.connect(info.address)
                except zmq.ZMQError as exc:
                    self._skip(znode, info, exc)
                    continue
                self._connected[znode] = info.address

    def _skip(self, znode: str, info: registry.InstanceInfo, exc: Exception) -> None:
        """One publisher ZeroMQ cannot dial must not cost the others: skipped, said once."""
        self._unusable.add(znode)
        log.warning("publisher %s ignored: cannot connect to %r: %s", znode, info.address, exc)

    def _secure_publishers_changed(self, found: dict[str, registry.InstanceInfo]) -> None:
        security, loop = self._security, self._loop
        assert security is not None and loop is not None
        for znode in set(self._links) - set(found):
            sock, reader = self._links.pop(znode)
            self._connected.pop(znode, None)
            reader.close()
            sock.close(linger=0)
        for znode, info in found.items():
            if znode in self._links or znode in self._unusable:
                continue
            principal = security.principal_for_key(info.curve_key) if info.curve_key else None
            if principal is None:
                log.warning("publisher %s ignored: its key is not a registered principal", znode)
                continue
            sock = make_socket(self._ctx, zmq.SUB, hwm=SUB_HWM)
            sock.setsockopt(zmq.SUBSCRIBE, wire.pattern_prefix(self.pattern))
            try:
                security.connect_socket(sock, info.curve_key)
                sock.connect(info.address)
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                self._skip(znode, info, exc)
                continue

            def on_message(frames: list[bytes], curve_key: str = info.curve_key) -> None:
                self._on_message(frames, curve_key)

            self._links[znode] = (sock, SocketReader(loop, sock, on_message))
            self._connected[znode] = info.address

    def _on_message(self, frames: list[bytes], publisher_key: str | None = None) -> None:
        """``publisher_key``: the registered key this SUB is pinned to (secure mode). The
        publisher is checked by key on every message, so one whose principal was removed or
        rotated to another key since the SUB connected is refused, as on the nodes."""
        try:
            message = wire.decode_message(frames, published=True)
        except errors.FabricError:
            return  # not ours or damaged: at-most-once means we skip it
        subject, header = message.subject, message.header
        if not wire.subject_matches(self._tokens, subject):
            return
        if publisher_key is not None and self._security is not None \
                and not self._security.trusted_server(publisher_key, subject):
            self.refused += 1  # a registered publisher without produce on this subject
            return
        self._accept(Message(subject, message.payload, message.headers, header.aux, header.correlation_id))

    def deliver_local(self, message: Message) -> None:
        """A message the owning client published (its publisher checked the subject)."""
        if not self._closed and wire.subject_matches(self._tokens, message.subject):
            self._accept(message)

    def _accept(self, message: Message) -> None:
        key = (message.publisher_id, message.subject)
        last_sequence = self._last_sequence
        last = last_sequence.pop(key, None)
        if last is not None:
            missing = (message.sequence - last - 1) & wire.U32_MAX
            if missing < 0x80000000:  # a restarted publisher (smaller number) is not a gap
                self.gaps += missing
        last_sequence[key] = message.sequence
        if len(last_sequence) > SUBJECTS_TRACKED_MAX:
            del last_sequence[next(iter(last_sequence))]
        self.received += 1
        if len(self._queue) >= self.pending_max:
            self.dropped += 1  # the slow subscriber loses; the publisher never waits
            return
        self._queue.append(message)
        self._ready.set()

    async def next(self, timeout_ms: int | None = None) -> Message | None:
        """The next message, or None after ``timeout_ms`` (None waits until closed)."""
        while not self._queue:
            if self._closed:
                return None
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), None if timeout_ms is None else timeout_ms / 1000)
            except asyncio.TimeoutError:
                return None
        return self._queue.popleft()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        while True:
            message = await self.next()
            if message is None:
                return
            yield message

    async def _dispatch(self) -> None:
        handler = self._handler
        assert handler is not None and self._loop is not None
        while not self._closed:
            message = await self.next()
            if message is None:
                return
            try:
                if self._executor is None:
                    await handler(message)  # type: ignore[misc]
                else:
                    await self._loop.run_in_executor(self._executor, handler, message)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.handler_errors += 1
                log.exception("subscriber handler for %r failed", self.pattern)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._ready.set()
        if self._watch is not None:
            self._watch.close()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._dispatcher
        if self._reader is not None:
            self._reader.close()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        for sock, reader in self._links.values():
            reader.close()
            sock.close(linger=0)
        self._links.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
