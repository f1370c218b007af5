"""The blocking API's request path: the calling thread sends and waits itself.

Handing each blocking request to the loop thread and back (``run_coroutine_threadsafe``, a
wake-up of the loop, a wake-up of the caller) cost about 150 us per call on a 2-core
machine, more than the round trip itself. So a blocking ``request`` talks to the instance
over DEALER sockets of its own thread (one per instance it called, created on first use)
and waits on them with a blocking receive bounded by a receive timeout. What is shared
stays on the loop: discovery, the instances' health (heartbeats), and the ready list it
picks from; this path only reads them, plus the per-instance count of blocking requests
in flight that least-outstanding selection adds to the loop's own, and the time it last
heard each instance on its own sockets (``PeerHealth.thread_heard_s``), which the loop's
health state machine counts as that instance's answer, as it counts frames on its own
DEALER. Without that, an instance answering blocking calls while the loop's PONG was late
turned suspect and then dead in the shared view, and the calls waiting on it gave up.

While it waits, the thread PINGs its instance every heartbeat interval, so the instance
follows it as a caller (and drops its queued requests if this process stalls).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import zmq

from fabric import errors
from fabric.protocol import direct as wire
from sdk.direct import _balance as balance
from sdk.direct._client import TIMEOUT_MS_MAX, DirectClient
from sdk.direct._io import make_socket, recv_frames_within, send_frames
from sdk.direct._peers import Response, _Peer, _ServiceView
from sdk.direct._types import Reply, as_bytes, as_headers, count_arg, ms_arg

RunOnLoop = Callable[[Coroutine[Any, Any, Any], float], Any]
SWEEP_MIN = 64  # sockets of all threads before those of ended threads are looked for
CLOSE_WAIT_S = 5.0  # close() waits this long for blocking requests to notice and return


class BlockingCaller:
    """Request-reply for threads outside the loop. Created by ``SyncDirect``."""

    def __init__(self, direct: DirectClient, run_on_loop: RunOnLoop, loop_thread: Callable[[], bool]) -> None:
        self._direct = direct
        self._run_on_loop = run_on_loop
        self._on_loop_thread = loop_thread
        self._local = threading.local()
        self._lock = threading.Lock()  # the socket list, the shared counters and the budget
        self._sockets: list[tuple[threading.Thread, zmq.Socket[Any]]] = []  # every thread's, with its owner
        self._sweep_at = SWEEP_MIN
        self._budget = balance.RetryBudget(ratio=direct.retry_budget.ratio,
                                           min_retries_per_s=direct.retry_budget.min_retries_per_s, now=time.monotonic())
        self._closed = False
        self._active = 0  # threads inside request(): their sockets are theirs until they return
        self._ping = wire.ping_frames(direct.heartbeat_interval_ms)
        self._interval_s = direct.heartbeat_interval_ms / 1000

    def request(self, name: str, payload: bytes | str, *, timeout_ms: int, headers: dict[str, bytes | str] | None,
                idempotent: bool, attempts_max: int, margin_s: float) -> Reply:
        """The rules of ``DirectClient.request``, blocking the calling thread."""
        if self._on_loop_thread():
            raise RuntimeError("a blocking Fabric call from inside the client's own loop (use the asyncio API there)")
        ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        count_arg("attempts_max", attempts_max, 1)
        body = as_bytes(payload, "payload")
        wire_headers = as_headers(headers)
        with self._lock:
            if self._closed:
                raise errors.ClientClosedError("direct client is closed")
            self._active += 1
        try:
            return self._request(name, body, timeout_ms, wire_headers, idempotent, attempts_max, margin_s)
        finally:
            with self._lock:
                self._active -= 1

    def _request(self, name: str, body: bytes, timeout_ms: int, wire_headers: dict[str, bytes] | None,
                 idempotent: bool, attempts_max: int, margin_s: float) -> Reply:
        direct = self._direct
        started_s = time.monotonic()  # timeout_ms bounds the whole call, a first registry read included
        view = direct._views.get(name)
        if view is None or not view.known.is_set():
            view = self._run_on_loop(direct._view(name, timeout_ms), margin_s)
        with self._lock:
            attempts = balance.Attempts(timeout_ms=timeout_ms, idempotent=idempotent, attempts_max=attempts_max,
                                        budget=self._budget, now=started_s)
        tried: list[str] = []
        while True:
            peer = view.pick(tried, direct._rng) or self._pick_waiting(view, tried, attempts.deadline_s, margin_s)
            tried.append(peer.znode)
            cid = next(direct._ids) & wire.U32_MAX
            attempt_s = attempts.begin(time.monotonic())
            frames = wire.request_frames(cid, body, timeout_ms=max(1, int(attempt_s * 1000)), idempotent=idempotent,
                                         headers=wire_headers)
            outcome = self._attempt(view, peer, cid, frames, attempt_s)
            if isinstance(outcome, Reply):
                return outcome
            problem, retry_safe = outcome
            now = time.monotonic()
            with self._lock:
                repeat = attempts.may_repeat(now, retry_safe=retry_safe)
            if not repeat:
                raise attempts.failure(name, problem, now, retry_safe=retry_safe)

    def _pick_waiting(self, view: _ServiceView, tried: list[str], deadline_s: float, margin_s: float) -> _Peer:
        """No instance ready (first use, all dead): the loop waits for one, as it does for
        asyncio callers."""
        peer: _Peer = self._run_on_loop(self._direct._pick_waiting(view, tried, deadline_s), margin_s)
        return peer

    def _attempt(self, view: _ServiceView, peer: _Peer, cid: int, frames: list[bytes],
                 attempt_s: float) -> Reply | tuple[str, bool]:
        """One attempt: the reply, or (what went wrong, whether it may be repeated safely)."""
        sock = self._socket(peer)
        with self._lock:
            peer.blocking_outstanding += 1
        try:
            if peer.closed:  # the loop closed it between our pick and the count above: nothing sent
                return f"instance {peer.znode} left the registry", True
            try:
                send_frames(sock, frames)
            except zmq.Again:
                return f"instance {peer.znode} send queue full", True
            response = self._wait(sock, peer, cid, time.monotonic() + attempt_s)
        except zmq.ZMQError as exc:
            return f"instance {peer.znode}: {exc}", False
        finally:
            with self._lock:
                peer.blocking_outstanding -= 1
        if isinstance(response, str):
            return response, False
        result = DirectClient._decode_response(*response, peer.znode)
        if isinstance(result, Reply):
            return result
        if isinstance(result, errors.ServiceStopping):
            peer.stopping(time.monotonic())
            self._direct.loop.call_soon_threadsafe(view.refresh)  # the view belongs to the loop
        elif not isinstance(result, errors.ServiceOverloaded):
            raise result
        return str(result), True  # refused without running: may go elsewhere

    def _wait(self, sock: zmq.Socket[Any], peer: _Peer, cid: int, deadline_s: float) -> Response | str:
        """The reply to ``cid``, or why there is none. Replies to earlier attempts that gave
        up (other correlation ids) and PONGs are skipped, but a frame that is fresh tells
        the loop's health view the instance answers (``PeerHealth.thread_heard_s``): the
        reply to ``cid``, and anything read after this wait's first PING. Nobody reads this
        socket between calls, so what came before may be old (a PONG, a reply to an earlier
        attempt); that PING went out only after a receive found the socket empty."""
        pinged = False
        while True:
            if self._closed:
                raise errors.ClientClosedError("direct client closed during the request")
            remaining_s = deadline_s - time.monotonic()
            # Past the deadline, a last look at what is already here: a caller stopped
            # (SIGSTOP) past its deadline may find the reply waiting, and returning "no
            # reply" then left the outcome unknown for a request that had run (the asyncio
            # path reads first too).
            last_look = remaining_s <= 0
            if not last_look and peer.health.state == balance.DEAD:
                return f"instance {peer.znode} stopped answering heartbeats"
            if not last_look and peer.closed:  # it left the registry and nobody pings it now
                return f"instance {peer.znode} left the registry"
            frames = recv_frames_within(sock, 0 if last_look else max(1, int(min(remaining_s, self._interval_s) * 1000)))
            if frames is None:
                if last_look:
                    return f"no reply from instance {peer.znode} in time"
                send_frames(sock, self._ping)  # still waiting: keep the instance following us
                pinged = True
                continue
            if pinged:
                peer.health.thread_heard_s = time.monotonic()
            try:
                header = wire.decode_header(frames[0])
            except errors.FabricError:
                continue  # undecodable: skipped, as the loop's reader skips it
            if header.type in (wire.REPLY, wire.ERROR) and header.correlation_id == cid:
                if not pinged:
                    peer.health.thread_heard_s = time.monotonic()  # a store only: the loop decides
                return header, frames

    def _socket(self, peer: _Peer) -> zmq.Socket[Any]:
        """This thread's DEALER to ``peer``, created on first use. Creation is rare (a new
        instance, a new thread), so it is also when sockets that are no use any more are
        closed: this thread's to instances that are gone, and every socket of threads
        that have ended (a thread per request would otherwise leak them)."""
        sockets: dict[int, tuple[_Peer, zmq.Socket[Any]]] | None = getattr(self._local, "sockets", None)
        if sockets is None:
            sockets = self._local.sockets = {}
        entry = sockets.get(id(peer))
        if entry is not None and entry[0] is peer:
            return entry[1]
        for key, (known, old) in list(sockets.items()):
            if known.closed:
                del sockets[key]
                self._discard(old)
        sock = make_socket(self._direct.ctx, zmq.DEALER)
        if self._direct.security is not None:
            self._direct.security.connect_socket(sock, peer.info.curve_key)  # pinned, as the loop's DEALERs
        sock.connect(peer.info.address)
        with self._lock:
            if self._closed:
                sock.close(linger=0)
                raise errors.ClientClosedError("direct client is closed")
            self._sockets.append((threading.current_thread(), sock))
            orphans: list[zmq.Socket[Any]] = []
            if len(self._sockets) > self._sweep_at:
                orphans = [old for thread, old in self._sockets if not thread.is_alive()]
                self._sockets = [(thread, old) for thread, old in self._sockets if thread.is_alive()]
                self._sweep_at = max(SWEEP_MIN, 2 * len(self._sockets))
        for old in orphans:
            old.close(linger=0)  # its thread has ended: nobody else uses it
        sockets[id(peer)] = (peer, sock)
        return sock

    @property
    def sockets_open(self) -> int:
        """DEALER sockets of the blocking path, all threads together."""
        return len(self._sockets)

    def _discard(self, sock: zmq.Socket[Any]) -> None:
        with self._lock:
            self._sockets = [(thread, old) for thread, old in self._sockets if old is not sock]
        sock.close(linger=0)

    def close(self) -> None:
        """Blocking requests still running in other threads fail with ClientClosedError
        (they look at least every heartbeat interval); then every thread's sockets close.
        A ZeroMQ socket must not close under a thread that uses it, so if one does not
        return within CLOSE_WAIT_S its sockets are left to the process (a bug to report)."""
        with self._lock:
            self._closed = True
        deadline_s = time.monotonic() + CLOSE_WAIT_S
        while self._active and time.monotonic() < deadline_s:
            time.sleep(0.01)
        if self._active:
            return
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for _thread, sock in sockets:
            sock.close(linger=0)

