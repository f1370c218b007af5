"""The blocking API: the asyncio core on one background loop thread per client (requests
themselves run on the calling thread: sdk.direct._blocking).

Every call hands a coroutine to that loop and waits for it with a bound (the call's own
timeout plus a margin), so a wedged loop surfaces as an error, not a hang. ``close()``
stops services (deregister, drain), subscriptions and the loop, and joins the thread. A
client nobody closed is closed when it is garbage-collected (once none of its services or
subscriptions is referenced either), its services draining for UNCLOSED_DRAIN_MS; one
still open when the interpreter exits ends with the process, as a killed one does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from fabric import errors
from sdk.direct._blocking import BlockingCaller
from sdk.direct._client import TIMEOUT_MS_DEFAULT, TIMEOUT_MS_MAX, DirectClient
from sdk.direct._pubsub import PENDING_MAX_DEFAULT, Subscription
from sdk.direct._server import CONCURRENCY_DEFAULT, DRAIN_TIMEOUT_MS_DEFAULT, Service
from sdk.direct._types import GatherResult, Message, Reply, ms_arg

T = TypeVar("T")
CALL_MARGIN_S = 10.0  # on top of a call's own timeout: ZooKeeper reads, loop scheduling
# A call waits for the loop in slices of at most this, and a slice counts for no more than
# it asked: time this process did not run (SIGSTOP, a stalled VM) is not the loop's delay.
WAIT_SLICE_S = 1.0
STOP_JOIN_S = 30.0
# A client garbage-collected without close(): its services drain this long, and the
# collection waits at most UNCLOSED_CLOSE_S for the close. Unclosed, each such client kept
# its loop thread, kazoo's threads and its ZooKeeper session for good: a loop making
# sdk.Client(...) without closing it held 50 sessions after 50 turns, and ZooKeeper
# refuses a host's 61st connection (maxClientCnxns), the nodes' included.
UNCLOSED_DRAIN_MS = 1_000
UNCLOSED_CLOSE_S = UNCLOSED_DRAIN_MS / 1000 + CALL_MARGIN_S
log = logging.getLogger("fabric.direct")


class LoopThread:
    """An asyncio loop running on its own daemon thread."""

    def __init__(self, name: str = "fabric-direct") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # The worker threads of asyncio.to_thread (ZooKeeper calls) end with the loop.
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking Fabric call from inside the client's own loop (use the asyncio API there)")
        if self.loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise errors.ClientClosedError("direct client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        # The bound is on the loop, not on this process: a wait that came back later than it
        # asked (the whole process was stopped meanwhile) counts only what it asked, as the
        # heartbeats excuse a stall (PeerHealth.excuse). Counted whole, a SIGSTOP longer than
        # the bound failed the call in flight with RequestTimeout as the process resumed,
        # before the loop thread had a turn: sub.next(200) and gather() raised it (fault hunt).
        left_s = timeout_s
        while True:
            wait_s = min(left_s, WAIT_SLICE_S)
            began_s = time.monotonic()
            try:
                return future.result(wait_s)
            except TimeoutError:
                left_s -= min(time.monotonic() - began_s, wait_s)
                if left_s <= 0:
                    future.cancel()
                    raise errors.RequestTimeout(
                        f"the client's loop did not finish the call within {timeout_s:.1f} s") from None

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call_soon(self, fn: Callable[[], Any]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        if self.loop.is_closed() or not self._thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(STOP_JOIN_S)


class SyncService:
    """A running service, for the blocking API."""

    def __init__(self, loop: LoopThread, service: Service, owner: SyncDirect | None = None) -> None:
        self._loop = loop
        self.service = service
        self._owner = owner  # the client serves it: not collected (and closed) while this is held

    @property
    def address(self) -> str:
        return self.service.address

    @property
    def znode(self) -> str | None:
        return self.service.znode

    def stop(self, *, drain_timeout_ms: int = DRAIN_TIMEOUT_MS_DEFAULT) -> None:
        if self.service.stopped:
            return  # stopped already (also by the client's close): nothing to wait for
        self._loop.run(self.service.stop(drain_timeout_ms=drain_timeout_ms), drain_timeout_ms / 1000 + CALL_MARGIN_S)

    def __getattr__(self, name: str) -> Any:
        """The Service's counters and settings (``handled``, ``failed``, ``refused``,
        ``in_flight``, ``callers``, ``callers_lost``, ``requests_dropped``, ``name``, ...)."""
        if name == "service":
            raise AttributeError(name)
        return getattr(self.service, name)


class SyncSubscription:
    """A subscription, for the blocking API: ``next(timeout_ms)`` or a handler."""

    def __init__(self, loop: LoopThread, subscription: Subscription, owner: SyncDirect | None = None) -> None:
        self._loop = loop
        self.subscription = subscription
        self._owner = owner  # as SyncService's

    def next(self, timeout_ms: int | None = 1_000) -> Message | None:
        """The next message, or None after ``timeout_ms`` (None: wait until one comes or
        the subscription closes) or once closed."""
        if self.subscription.closed:  # nothing arrives any more (and the loop may be gone)
            return self.subscription.next_nowait()
        if timeout_ms is None:
            while True:  # in bounded slices, so a wedged loop still surfaces as an error
                message = self._loop.run(self.subscription.next(1_000), 1.0 + CALL_MARGIN_S)
                if message is not None or self.subscription.closed:
                    return message
        if timeout_ms != 0:  # 0: only what is queued already
            ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        return self._loop.run(self.subscription.next(timeout_ms), timeout_ms / 1000 + CALL_MARGIN_S)

    def __iter__(self) -> Iterator[Message]:
        """Messages until the subscription closes (the blocking twin of ``async for``)."""
        while True:
            message = self.next(None)
            if message is None:
                return
            yield message

    @property
    def pattern(self) -> str:
        return self.subscription.pattern

    @property
    def publishers(self) -> int:
        return self.subscription.publishers

    @property
    def refused(self) -> int:
        return self.subscription.refused

    @property
    def handler_errors(self) -> int:
        return self.subscription.handler_errors

    @property
    def received(self) -> int:
        return self.subscription.received

    @property
    def dropped(self) -> int:
        return self.subscription.dropped

    @property
    def gaps(self) -> int:
        return self.subscription.gaps

    @property
    def lost(self) -> int:
        return self.subscription.lost

    def close(self) -> None:
        if not self.subscription.closed:
            self._loop.run(self.subscription.close(), CALL_MARGIN_S)


class SyncDirect:
    """The direct plane with blocking calls (``sdk.Client`` exposes these)."""

    def __init__(self, zk_hosts: str, **options: Any) -> None:
        self._loop = LoopThread()
        try:
            self.direct: DirectClient = self._loop.run(DirectClient.connect(zk_hosts, **options), 30.0)
        except BaseException:
            self._loop.stop()
            raise
        self._blocking = BlockingCaller(self.direct, self._loop.run, self._loop.on_thread)
        self._closed = False
        # Holds what the close needs, never this handle. Not at interpreter exit: by then
        # asyncio.to_thread, which the close uses for ZooKeeper, refuses new work.
        self._finalizer = weakref.finalize(self, _close_unattended, self._loop, self.direct, self._blocking)
        self._finalizer.atexit = False

    def request(self, name: str, payload: bytes | str, *, timeout_ms: int = TIMEOUT_MS_DEFAULT,
                headers: dict[str, bytes | str] | None = None, idempotent: bool = False,
                attempts_max: int = 3) -> Reply:
        # On the calling thread, not the loop's (sdk.direct._blocking says why).
        ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        return self._blocking.request(name, payload, timeout_ms=timeout_ms, headers=headers, idempotent=idempotent,
                                      attempts_max=attempts_max, margin_s=timeout_ms / 1000 + CALL_MARGIN_S)

    def gather(self, name: str, payload: bytes | str, *, timeout_ms: int = TIMEOUT_MS_DEFAULT,
               headers: dict[str, bytes | str] | None = None, min_replies: int | None = None) -> GatherResult:
        ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        return self._loop.run(self.direct.gather(name, payload, timeout_ms=timeout_ms, headers=headers,
                                                 min_replies=min_replies), timeout_ms / 1000 + CALL_MARGIN_S)

    def serve(self, name: str, handler: Callable[..., Any], *, concurrency: int = CONCURRENCY_DEFAULT,
              version: str = "", metadata: dict[str, Any] | None = None, bind: str = "tcp://127.0.0.1:*",
              queue_max: int | None = None, advertise: str | None = None) -> SyncService:
        service = self._loop.run(self.direct.serve(name, handler, concurrency=concurrency, version=version,
                                                   metadata=metadata, bind=bind, queue_max=queue_max,
                                                   advertise=advertise), CALL_MARGIN_S)
        return SyncService(self._loop, service, self)

    def publish(self, subject: str, payload: bytes | str, *, headers: dict[str, bytes | str] | None = None) -> None:
        self._loop.run(self.direct.publish(subject, payload, headers=headers), CALL_MARGIN_S)

    def start_publisher(self) -> None:
        self._loop.run(self.direct.start_publisher(), CALL_MARGIN_S)

    def subscribe(self, pattern: str, handler: Callable[[Message], Any] | None = None, *,
                  pending_max: int = PENDING_MAX_DEFAULT) -> SyncSubscription:
        subscription = self._loop.run(self.direct.subscribe(pattern, handler, pending_max=pending_max), CALL_MARGIN_S)
        return SyncSubscription(self._loop, subscription, self)

    def services(self) -> dict[str, Any]:
        return self._loop.run(self.direct.services(), CALL_MARGIN_S)

    def close(self, *, drain_timeout_ms: int = DRAIN_TIMEOUT_MS_DEFAULT) -> None:
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _close(self._loop, self.direct, self._blocking, drain_timeout_ms)


def _close(loop: LoopThread, direct: DirectClient, blocking: BlockingCaller, drain_timeout_ms: int) -> None:
    blocking.close()
    try:
        loop.run(direct.close(drain_timeout_ms=drain_timeout_ms), drain_timeout_ms / 1000 + CALL_MARGIN_S)
    finally:
        loop.stop()


def _close_unattended(loop: LoopThread, direct: DirectClient, blocking: BlockingCaller) -> None:
    """What a SyncDirect that nobody closed does when it is collected. The close runs on a
    thread of its own: a collection may happen on any thread, the client's loop thread
    included (which the close needs free); it is waited for at most UNCLOSED_CLOSE_S, and
    not at all on the loop thread, where waiting would block it."""
    def close() -> None:
        try:
            _close(loop, direct, blocking, UNCLOSED_DRAIN_MS)
        except Exception as exc:  # nobody to raise to: say it
            log.warning("closing a direct client nobody closed failed: %r", exc)

    closer = threading.Thread(target=close, name="fabric-direct-close", daemon=True)
    closer.start()
    if not loop.on_thread():
        closer.join(UNCLOSED_CLOSE_S)
