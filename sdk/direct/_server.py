"""One service instance: a ROUTER bound on a port, a znode in the registry, a bounded set of
handler calls in flight. Runs on the caller's asyncio loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import queue
import threading
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric.auth.acl import Operation
from fabric.protocol import direct as wire
from sdk.direct import _balance as balance
from sdk.direct import _registry as registry
from sdk.direct._io import SocketReader, bind, make_socket, recv_frames_with_principal, send_frames
from sdk.direct._secure import DirectSecurity
from sdk.direct._types import Reply, Request, as_bytes, as_headers, count_arg, handler_arg

log = logging.getLogger("fabric.direct")

HandlerResult = bytes | bytearray | memoryview | str | Reply | None
Handler = Callable[[Request], HandlerResult | Awaitable[HandlerResult]]

CONCURRENCY_DEFAULT = 16
QUEUE_PER_SLOT = 64  # requests waiting per concurrency slot before SERVICE_OVERLOADED
DRAIN_TIMEOUT_MS_DEFAULT = 10_000
# After deregistering, a stopping instance that callers are talking to stays open this
# long (within drain_timeout_ms) refusing new requests with SERVICE_STOPPING. Callers
# that PING are told at once (a stop notice, below); the others learn of the
# deregistration through their ZooKeeper watch, a little later, and a request sent
# meanwhile (or crossing the notice) would otherwise meet a closed socket and be lost:
# failed as "may have run" once heartbeats go unanswered. Refused, it goes elsewhere.
STOP_HOLD_MS = 100
CALLER_RECENT_S = 1.0  # callers heard from this recently make stop() hold (none: it closes at once)
LOAD_REPORT_INTERVAL_S = 2.0
# Codes that tell a caller the handler did not run, so it may send the request elsewhere
# even when it is not idempotent. A handler that raises one of these errors itself did
# run: it is answered REMOTE_ERROR (type name kept), never with its own code.
NOT_RUN_CODES = (errors.ServiceOverloaded.code, errors.ServiceStopping.code)


def _is_async(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))  # noqa: B004


@types.coroutine
def _resume(coro: Any, yielded: Any) -> Any:
    """Continue a coroutine that already ran to its first suspension (``yielded`` is what
    it awaited), inside a Task: the same hand-over ``yield from`` does."""
    while True:
        try:
            try:
                sent = yield yielded
            except BaseException as exc:
                yielded = coro.throw(exc)
            else:
                yielded = coro.send(sent)
        except StopIteration as done:
            return done.value


class Service:
    """Serve ``name`` with ``handler`` until ``stop()``. Created by ``DirectClient.serve``."""

    def __init__(self, zk: KazooClient, ctx: zmq.Context[Any], name: str, handler: Handler, *,
                 concurrency: int = CONCURRENCY_DEFAULT, version: str = "", metadata: dict[str, Any] | None = None,
                 bind: str = "tcp://127.0.0.1:*", queue_max: int | None = None, advertise: str | None = None,
                 security: DirectSecurity | None = None) -> None:
        registry.validate_service_name(name)
        handler_arg(handler)
        count_arg("concurrency", concurrency, 1)
        if queue_max is not None:
            count_arg("queue_max", queue_max, 0)
        self.name = name
        self.concurrency = concurrency
        self.version = version
        self.metadata = dict(metadata or {})
        self.queue_max = concurrency * QUEUE_PER_SLOT if queue_max is None else queue_max
        self._zk = zk
        self._ctx = ctx
        self._bind = bind
        self._advertise = advertise
        self._handler = handler
        self._security = security
        self._async = _is_async(handler)
        # Sync handlers: threads of this instance's own (at most ``concurrency``, started as
        # needed), fed by a queue, each sending its reply itself (see _run_sync).
        self._jobs: queue.SimpleQueue[tuple[bytes, int, Request] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        # Held around every use of the ROUTER once sync-handler threads send on it too
        # (ZeroMQ allows a socket to move between threads behind a full memory barrier,
        # which the lock gives); None for async handlers, whose socket stays on the loop.
        self._sock_lock: threading.RLock | None = None if self._async else threading.RLock()
        self._tasks: set[asyncio.Task[Any]] = set()  # async handlers that suspended
        self._running = 0
        self._waiting: collections.deque[tuple[bytes, int, Request, float]] = collections.deque()
        self._idle: asyncio.Future[None] | None = None  # stop() waits on it for the drain
        self._sock: zmq.Socket[Any] | None = None
        self._reader: SocketReader | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registration: registry.Registration | None = None
        self._stopping = False
        self._stopping_as = ""  # how refusals name this instance once stop() has deregistered it
        self._reported_load = -1
        self._background: asyncio.Task[None] | None = None
        self._callers = balance.CallerLiveness()
        self._caller_heard_s = float("-inf")  # the last frame from any caller (stop() holds if recent)
        self._caller_watch: asyncio.Task[None] | None = None
        self.address = ""
        self.handled = 0
        self.failed = 0
        self.refused = 0
        self.callers_lost = 0  # callers that stopped heartbeating (dead or stalled processes)
        self.requests_dropped = 0  # their queued requests, dropped without running

    @property
    def in_flight(self) -> int:
        """Handler calls running plus requests waiting for a slot."""
        return self._running + len(self._waiting)

    @property
    def stopped(self) -> bool:
        """stop() has begun (or ended): the instance takes nothing new."""
        return self._stopping

    @property
    def callers(self) -> int:
        """Callers whose heartbeats this instance follows now."""
        return len(self._callers)

    @property
    def znode(self) -> str | None:
        return self._registration.path if self._registration is not None else None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        security = self._security
        if security is not None:
            security.require(Operation.PRODUCE, self.name)  # serving is producing the service
        sock = make_socket(self._ctx, zmq.ROUTER)
        if security is not None:
            security.bind_socket(sock)
        try:
            self.address = registry.advertised_address(bind(sock, self._bind), self._zk, self._advertise)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise errors.InvalidRequestError(f"service {self.name!r} cannot bind {self._bind}: {exc}") from None
        self._sock = sock
        if security is None:
            self._reader = SocketReader(self._loop, sock, self._on_message, lock=self._sock_lock)
        else:
            self._reader = SocketReader(self._loop, sock, self._on_secure_message, recv_frames_with_principal,
                                        lock=self._sock_lock)
        info = registry.InstanceInfo.here(self.address, version=self.version, metadata=self.metadata,
                                          curve_key=security.public_key if security is not None else "")
        registration = registry.Registration(self._zk, registry.service_path(self.name), registry.INSTANCE_PREFIX,
                                             info, f"service {self.name}")
        try:
            await asyncio.to_thread(registration.start)
        except Exception:
            self._close_socket()
            raise
        self._registration = registration
        self._background = asyncio.ensure_future(self._report_load())
        self._caller_watch = asyncio.ensure_future(self._watch_callers())

    async def _report_load(self) -> None:
        """The registry's load figure is for `fabric service list`; callers balance on their
        own counts and on PONGs, so a few seconds of staleness is fine."""
        while not self._stopping:
            await asyncio.sleep(LOAD_REPORT_INTERVAL_S)
            load = self.in_flight
            registration = self._registration
            if load == self._reported_load or registration is None:
                continue
            info = registry.InstanceInfo(**{**registration.info.__dict__, "load": load})
            try:
                await asyncio.to_thread(registration.update, info)
                self._reported_load = load
            except Exception as exc:  # ZooKeeper away: the service keeps serving
                log.debug("service %s load report failed: %s", self.name, exc)

    async def _watch_callers(self) -> None:
        """Paranoid Pirate, instance side: a caller that stopped heartbeating (killed,
        SIGSTOPped, cut off) is gone; requests of its still waiting for a handler slot are
        dropped unrun, so a dead caller's backlog never delays the living. Handlers already
        running finish (they may have side effects); their replies go nowhere."""
        interval_s = balance.HEARTBEAT_INTERVAL_MS / 1000 / 2
        while not self._stopping:
            await asyncio.sleep(interval_s)
            if self._reader is not None:
                # PINGs that arrived while this instance itself was stalled (SIGSTOP, a
                # blocked loop) count before anyone is judged silent.
                self._reader.drain()
            for caller in self._callers.expired(time.monotonic()):
                self._drop_caller(caller)

    def _drop_caller(self, caller: bytes) -> None:
        self.callers_lost += 1
        kept: collections.deque[tuple[bytes, int, Request, float]] = collections.deque()
        for item in self._waiting:
            if item[0] != caller:
                kept.append(item)
                continue
            # Answered, not just forgotten: a dead caller never reads it, but one that was
            # only slow (a blocked loop) learns that nothing ran and may send it again.
            self.requests_dropped += 1
            self._send(caller, wire.error_frames(item[1], errors.ServiceOverloaded.code, "ServiceOverloaded",
                                                 "not run: the caller stopped heartbeating while it was queued"))
        dropped = len(self._waiting) - len(kept)
        self._waiting = kept
        log.info("service %s: a caller stopped heartbeating; %d of its queued requests dropped", self.name, dropped)

    def _send(self, identity: bytes, frames: list[bytes]) -> None:
        """Send from the loop; then look for what the send may have hidden from the reader."""
        with self._sock_lock or contextlib.nullcontext():  # not while a handler thread sends
            self._send_now(identity, frames)
        if self._reader is not None:
            self._reader.kick()

    def _send_now(self, identity: bytes, frames: list[bytes]) -> None:
        """The send itself; with sync-handler threads, only under the socket lock."""
        sock = self._sock
        if sock is None:
            return
        try:
            # A ROUTER never blocks: a reply to a caller that left is dropped, which is what
            # we want (it gave up on the request).
            send_frames(sock, [identity, *frames])
        except zmq.ZMQError:
            pass

    def _on_secure_message(self, frames: list[bytes]) -> None:
        """Secure mode: ``frames[0]`` is the sender's principal (the ZAP User-Id). A REQUEST
        needs consume on the service; it is refused before the handler when denied."""
        security = self._security
        if security is not None and len(frames) >= 3:
            try:
                header: wire.DirectHeader | None = wire.decode_header(frames[2])
            except errors.FabricError:
                header = None  # _on_message answers the malformed header
            if header is not None and header.type == wire.REQUEST:
                why = security.refusal(frames[0].decode("utf-8", "replace"), Operation.CONSUME, self.name)
                if why is not None:
                    self.refused += 1
                    self._send(frames[1], wire.error_frames(header.correlation_id, errors.AuthorizationFailedError.code,
                                                            "AuthorizationFailedError", why))
                    return
        self._on_message(frames[1:])

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        identity = frames[0]
        self._callers.touch(identity)  # any frame shows a caller alive, not only its PINGs
        self._caller_heard_s = time.monotonic()
        try:
            header = wire.decode_header(frames[1])
        except errors.FabricError as exc:
            self._send(identity, wire.error_frames(0, exc.code, type(exc).__name__, exc.message))
            return
        if header.type == wire.PING:
            self._callers.heard(identity, time.monotonic(), header.aux)
            self._send(identity, wire.pong_frames(self.in_flight))
            if self._stopping:  # a caller that was not followed when stop() told the others
                self._send(identity, self._stop_notice())
            return
        if header.type != wire.REQUEST:
            return  # PONGs and strays: nothing to answer
        cid = header.correlation_id
        if len(frames) - 2 != wire.expected_frames(header):
            self._send(identity, wire.error_frames(cid, errors.MalformedRequestError.code, "MalformedRequestError",
                                                   f"REQUEST with {len(frames) - 2} body frames"))
            return
        if self._stopping:
            self.refused += 1
            self._send(identity, wire.error_frames(cid, errors.ServiceStopping.code, "ServiceStopping",
                                                   f"instance {self._stopping_as} of {self.name!r} is stopping"))
            return
        if self._running >= self.concurrency and len(self._waiting) >= self.queue_max:
            self.refused += 1
            self._send(identity, wire.error_frames(cid, errors.ServiceOverloaded.code, "ServiceOverloaded",
                                                   f"{self.in_flight} requests queued or running"))
            return
        try:
            headers = wire.decode_headers(frames[3]) if header.has_headers else {}
        except errors.FabricError as exc:
            self._send(identity, wire.error_frames(cid, exc.code, type(exc).__name__, exc.message))
            return
        request = Request(frames[2], headers, header.idempotent, header.aux, self.name)
        if self._running < self.concurrency:
            self._start(identity, cid, request)
        else:
            self._waiting.append((identity, cid, request, time.monotonic()))

    # Dispatch. At most ``concurrency`` handler calls run; the rest wait in a bounded deque
    # (``queue_max``). An async handler starts *eagerly*, inside the receive callback: a
    # handler that completes without suspending is answered with no task and no extra
    # loop turn (the request path the benchmark measures); one that suspends continues in a
    # task. Sync handlers go to this instance's threads, which send their replies
    # themselves and leave only the bookkeeping to the loop.

    def _start(self, identity: bytes, cid: int, request: Request) -> None:
        self._running += 1
        if not self._async:
            self._jobs.put((identity, cid, request))
            if len(self._threads) < self._running:  # every running call has a thread of its own
                thread = threading.Thread(target=self._run_sync, name=f"svc-{self.name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()
            return
        try:
            coro = self._handler(request)
            yielded = coro.send(None)  # type: ignore[union-attr]
        except StopIteration as done:
            self._finish(identity, cid, done.value, None)
            return
        except Exception as exc:
            self._finish(identity, cid, None, exc)
            return
        task = asyncio.ensure_future(_resume(coro, yielded))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._finish_future(identity, cid, t))

    def _finish_future(self, identity: bytes, cid: int, future: asyncio.Future[Any]) -> None:
        self._tasks.discard(future)
        if future.cancelled():
            self._finish(identity, cid, None, errors.ServiceStopping("the instance stopped before the handler finished"))
        else:
            self._finish(identity, cid, None if future.exception() else future.result(), future.exception())

    def _run_sync(self) -> None:
        """A sync-handler thread. It sends the reply on the ROUTER itself (under the socket
        lock) instead of handing it back to the loop, which would add a loop wake-up to
        every round trip: on a 2-core machine this took a sync echo's p50 from about 307 to
        267 us (an async handler's: about 205). The loop is told afterwards, for the running
        count and the next queued request; the caller is not waiting for that. Daemon
        threads, as a handler may never return; stop() ends the idle ones."""
        loop, lock = self._loop, self._sock_lock
        assert loop is not None and lock is not None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            identity, cid, request = job
            result: Any = None
            failure: BaseException | None = None
            try:
                result = self._handler(request)
            except BaseException as exc:  # the handler's own, SystemExit included: its caller gets it
                failure = exc
            frames, ok = self._reply(cid, result, failure)
            with lock:  # counted before the caller can see the reply, as on the loop
                if ok:
                    self.handled += 1
                else:
                    self.failed += 1
                self._send_now(identity, frames)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is counting
                loop.call_soon_threadsafe(self._sync_done)

    def _sync_done(self) -> None:
        self._done()
        if self._reader is not None:
            self._reader.kick()  # the thread's send may have hidden arrivals from the reader

    def _finish(self, identity: bytes, cid: int, result: Any, exc: BaseException | None) -> None:
        frames, ok = self._reply(cid, result, exc)
        if ok:
            self.handled += 1
        else:
            self.failed += 1
        self._send(identity, frames)
        self._done()

    def _reply(self, cid: int, result: Any, exc: BaseException | None) -> tuple[list[bytes], bool]:
        """The frames answering ``cid`` with the handler's result or exception; False when
        they are an ERROR. Runs on the loop or on a sync-handler thread."""
        if exc is None:
            try:
                # Every frame is bytes before the first is sent: a str payload or header
                # value would otherwise fail mid-message and leave half a reply queued on
                # the ROUTER, corrupting the next message it sends.
                if isinstance(result, Reply):
                    frames = wire.reply_frames(cid, as_bytes(result.payload, "handler result payload"),
                                               as_headers(result.headers))
                else:
                    frames = wire.reply_frames(cid, as_bytes(result, "handler result"))
                return frames, True
            except errors.FabricError as bad:
                exc = bad
            except Exception as bad:  # a Reply with headers that are not a dict of bytes or str
                exc = errors.InvalidRequestError(f"handler result: {type(bad).__name__}: {bad}")
        if isinstance(exc, errors.FabricError):
            code = exc.code if exc.code > 0 and exc.code not in NOT_RUN_CODES else errors.RemoteError.code
            message = exc.message
        else:
            code, message = errors.RemoteError.code, str(exc)
        return wire.error_frames(cid, code, type(exc).__name__, message), False

    def _done(self) -> None:
        """A handler call ended: the next queued request may start; stop() may be waiting."""
        self._running -= 1
        if self._waiting:
            self._start_waiting()
        if self._idle is not None and self._running == 0 and not self._waiting and not self._idle.done():
            self._idle.set_result(None)

    def _start_waiting(self) -> None:
        now = time.monotonic()
        while self._waiting and self._running < self.concurrency:
            identity, cid, request, received_s = self._waiting.popleft()
            if request.timeout_ms and (now - received_s) * 1000 > request.timeout_ms:
                # The caller gave up while this waited for a slot: skip the work.
                self._send(identity, wire.error_frames(cid, errors.RequestTimeout.code, "RequestTimeout",
                                                       "expired while queued at the instance"))
                continue
            self._start(identity, cid, request)

    def _stop_notice(self) -> list[bytes]:
        """SERVICE_STOPPING under correlation id 0, about the instance rather than a
        request: the caller picks it no more (gRPC's GOAWAY), whether or not its ZooKeeper
        watch has told it yet. The PONGs go on, so requests in flight are not given up."""
        return wire.error_frames(0, errors.ServiceStopping.code, "ServiceStopping",
                                 f"instance {self._stopping_as} of {self.name!r} is stopping")

    async def stop(self, *, drain_timeout_ms: int = DRAIN_TIMEOUT_MS_DEFAULT) -> None:
        """Deregister first (callers stop picking this instance), tell the callers that
        PING (a stop notice), refuse new requests with SERVICE_STOPPING (callers retry those
        elsewhere: nothing ran), let the requests in flight finish for up to
        ``drain_timeout_ms``, hold on for STOP_HOLD_MS if callers were heard from lately
        (late requests are refused, not lost), then close."""
        if self._stopping:
            return
        # Named now: deregistering forgets the znode, and every refusal from here on names it.
        znode = self.znode
        self._stopping_as = f"{znode.rpartition('/')[2]} at {self.address}" if znode else self.address
        if self._registration is not None:
            await asyncio.to_thread(self._registration.close)  # never raises: ZooKeeper may be away
        self._stopping = True
        for caller in self._callers.callers():
            self._send(caller, self._stop_notice())
        hold_until_s = time.monotonic()
        if time.monotonic() - self._caller_heard_s < CALLER_RECENT_S:
            hold_until_s += min(STOP_HOLD_MS, drain_timeout_ms) / 1000
        for task in (self._background, self._caller_watch):
            if task is not None:
                task.cancel()
        self._idle = asyncio.get_running_loop().create_future()
        if self._running == 0 and not self._waiting:
            self._idle.set_result(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._idle), drain_timeout_ms / 1000)
        except asyncio.TimeoutError:
            log.warning("service %s: %d requests still running after %d ms; cancelling", self.name,
                        self.in_flight, drain_timeout_ms)
            while self._waiting:
                identity, cid, _request, _received = self._waiting.popleft()
                self._send(identity, wire.error_frames(cid, errors.ServiceStopping.code, "ServiceStopping",
                                                       "the instance stopped before running the request"))
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)
        hold_s = hold_until_s - time.monotonic()
        if hold_s > 0:
            await asyncio.sleep(hold_s)  # late requests are refused meanwhile (_on_message)
        self._close_socket()
        for _thread in self._threads:
            self._jobs.put(None)  # idle threads end; one still in its handler ends after it

    def _close_socket(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        with self._sock_lock or contextlib.nullcontext():  # not while a handler thread sends
            if self._sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.close(linger=0)
                self._sock = None
