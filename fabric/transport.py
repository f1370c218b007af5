"""DEALER connections to nodes, with correlation ids: used by the SDK and by followers.

A ``Connections`` object and its sockets belong to one thread (ZeroMQ sockets are not
thread-safe). Its sockets can join an external poller, so a node's single event loop
wakes on replies from leaders as well as on client requests.
"""

from __future__ import annotations

import itertools
import math
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

import zmq
from zmq.backend import Socket as _CythonSocket
from zmq.utils.monitor import recv_monitor_message

from fabric import errors
from fabric.auth.curve import ClientSecurity
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey, Message
from fabric.protocol.header import decode_header

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
_INPROC_NAMES = itertools.count(1)

# pyzmq's Cython socket methods, called with plain-int flags. The sugar layer's
# send_multipart/recv_multipart/get cost a few microseconds per call in IntFlag arithmetic,
# enum conversions and argument checks; every message on the SDK's and the nodes' polled
# connections passes here (the synchronous Connections.request, for metadata, admin and
# group calls, still reads with recv_multipart), and on a path of ~15 thread wake-ups each
# running cold code, microseconds add up (docs/BENCHMARKS.md, "End to end at low rates").
zmq_send: Callable[..., Any] = cast(Any, _CythonSocket.send)  # (sock, data, flags, copy=True)
zmq_recv_frame: Callable[[zmq.Socket[Any], int, bool], zmq.Frame] = cast(Any, _CythonSocket.recv)
zmq_get: Callable[[zmq.Socket[Any], int], int] = cast(Any, _CythonSocket.get)
zmq_set: Callable[[zmq.Socket[Any], int, int], None] = cast(Any, _CythonSocket.set)
NOBLOCK = int(zmq.NOBLOCK)
MORE_NOBLOCK = int(zmq.SNDMORE) | NOBLOCK
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
RCVTIMEO = int(zmq.RCVTIMEO)
COPY_THRESHOLD_BYTES = zmq.COPY_THRESHOLD  # smaller frames are copied: cheaper than tracking a zero-copy one


def send_multipart_nowait(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """One multipart message without blocking, large frames sent without a copy (as
    pyzmq's ``send_multipart(copy=False)``). Raises zmq.Again at the high-water mark;
    ZeroMQ checks it on the first frame only, so nothing was queued then."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        zmq_send(sock, frame, MORE_NOBLOCK if i < last else NOBLOCK, len(frame) < COPY_THRESHOLD_BYTES)


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message is waiting: cheaper than a receive that ends in zmq.Again (an
    exception per drained socket per loop turn), and it re-arms the FD's edge the same."""
    return bool(zmq_get(sock, EVENTS) & POLLIN)


def recv_multipart_nowait(sock: zmq.Socket[Any]) -> list[zmq.Frame]:
    """One multipart message as uncopied frames (``recv_multipart(NOBLOCK, copy=False)``);
    raises zmq.Again when none is waiting."""
    frame = zmq_recv_frame(sock, NOBLOCK, False)
    frames = [frame]
    while frame.more:
        frame = zmq_recv_frame(sock, NOBLOCK, False)
        frames.append(frame)
    return frames


def recv_if_ready(sock: zmq.Socket[Any]) -> list[zmq.Frame] | None:
    """``recv_multipart_nowait`` after ``readable`` said a message waits, or None if it is
    gone after all: ZMQ_EVENTS can report POLLIN for a connection whose pipe is torn down
    before the receive (a node killed mid-answer), and that receive raises zmq.Again. A
    consumer's poll raised it to the caller once while a leader was being killed."""
    try:
        return recv_multipart_nowait(sock)
    except zmq.Again:
        return None


def unique_inproc_endpoint(prefix: str) -> str:
    """An inproc address no other object in this process has used. Not ``id(obj)``: an
    address is reused after garbage collection while the old socket may still be bound
    (an unclosed producer's thread keeps its own)."""
    return f"inproc://{prefix}-{next(_INPROC_NAMES)}"
SOCKET_HWM = 10_000
# ZMTP heartbeats (libzmq >= 4.2). A peer whose host died, or whose network went away
# without a FIN or RST, otherwise keeps its connection, and every message queued to it,
# for as long as TCP keeps a silent connection open (hours, or for good without
# keepalive). libzmq's I/O thread answers the PINGs, so a busy peer (a long loop turn, a
# GIL held) still answers: only a stopped, dead or cut-off one times out.
CLIENT_HEARTBEAT_TIMEOUT_MS = 30_000
HEARTBEAT_INTERVAL_MS_MIN = 100


def heartbeat(sock: zmq.Socket[Any], timeout_ms: int) -> None:
    """Close ``sock``'s connections to peers that answer nothing for ``timeout_ms`` (PINGs
    every third of it); 0 leaves heartbeats off. Set before bind or connect."""
    if timeout_ms > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, max(HEARTBEAT_INTERVAL_MS_MIN, timeout_ms // 3))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, timeout_ms)  # the peer may drop us likewise
# Handshake failures a socket monitor reports: a CURVE key the node refused, a plaintext
# client meeting a CURVE node (mechanism mismatch), or a wrong server key.
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# ...and a connection that dropped: a node that stopped or died closes its end at once
# (the kernel does it for a killed process), long before a request to it times out; and
# one that came up, so that requests lost with a dropped connection are resent once the
# socket has reconnected by itself (a node's heartbeat closed the connection of a client
# that was stopped past client_heartbeat_timeout_ms, PROTOCOL.md 5.3).
_MONITORED = _HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
FROM_ENV: Any = object()  # Connections(security=FROM_ENV): $FABRIC_KEY_FILE/$FABRIC_SERVER_KEY, else plaintext


class Connections:
    """DEALER sockets by node address, with correlation ids and a poller."""

    def __init__(self, context: zmq.Context[Any] | None = None, poller: zmq.Poller | None = None,
                 security: ClientSecurity | None = FROM_ENV) -> None:
        self.ctx = context or zmq.Context.instance()
        self.security: ClientSecurity | None = ClientSecurity.from_env() if security is FROM_ENV else security
        # One monitor per socket, watching only for failed handshakes, so that a refused
        # key or a plaintext/CURVE mismatch is reported as such instead of as a timeout.
        self._monitors: dict[str, zmq.Socket[Any]] = {}
        self._handshake_errors: dict[str, str] = {}
        self._disconnected: set[str] = set()  # since the last take_disconnected()
        # Per address: connections dropped so far (kept across drop()), and whether one is up
        # now. A request sent when drops() was n went out on a connection that is gone once
        # drops() > n: its answer can no longer come (it would come on that connection).
        self._drops: dict[str, int] = {}
        self._up: dict[str, bool] = {}
        self.sockets: dict[str, zmq.Socket[Any]] = {}
        self.by_socket: dict[zmq.Socket[Any], str] = {}
        self.poller = poller or zmq.Poller()
        self._ids = itertools.count(1)
        # Replies to other requests that arrived while request() waited for its own: kept
        # for the next poll()/drain(). Dropping them would strand whoever waits on them
        # (a producer's acknowledgement, a consumer's fetch) until their timeout.
        self._stash: list[tuple[str, list[Any]]] = []
        # Connections nobody closed (a Consumer, Admin or QueueConsumer dropped without
        # close()) close their sockets when collected. pyzmq's own __del__ warns first
        # (ResourceWarning, one per socket), and where warnings are errors (-W error, this
        # project's tests) the warning raised before its close(): each dropped consumer
        # leaked its sockets for good, 8 descriptors with 3 nodes. Not at exit: a daemon
        # thread (a producer's sender) may still use its sockets then. Not with a poller
        # shared with others (a node's loop): it still holds, and polls, the sockets.
        self._finalizer: weakref.finalize[Any, Any] | None = None
        if poller is None:
            self._finalizer = weakref.finalize(self, _close_sockets, self.sockets, self._monitors)
            self._finalizer.atexit = False

    def next_id(self) -> int:
        return next(self._ids) & 0xFFFFFFFF

    def socket(self, address: str) -> zmq.Socket[Any]:
        sock = self.sockets.get(address)
        if sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, SOCKET_HWM)
            sock.setsockopt(zmq.RCVHWM, SOCKET_HWM)
            sock.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
            # Without IMMEDIATE a DEALER queues to a peer that is not there; with it a
            # send to a dead node fails fast and we try another route.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            if self.security is not None:
                self.security.apply(sock)
            monitor_address = unique_inproc_endpoint("handshake-monitor")
            sock.monitor(monitor_address, _MONITORED)
            monitor = self.ctx.socket(zmq.PAIR)
            monitor.setsockopt(zmq.LINGER, 0)
            monitor.connect(monitor_address)
            try:
                sock.connect(address)
            except zmq.ZMQError as exc:
                # The address came from the network (a METADATA node list, a FIND_COORDINATOR
                # answer): one libzmq cannot parse ("garbage", "udp://...") raised a bare
                # ZMQError out of every SDK call and killed a producer's sender thread, and
                # left this socket and its monitor open on each attempt. Not reachable, as
                # a node that is down: callers re-read the map and try again.
                sock.disable_monitor()
                sock.close(linger=0)
                monitor.close(linger=0)
                raise errors.NodeNotReadyError(
                    f"node address {address!r:.200} is not a ZeroMQ endpoint ({exc})", sent=False) from None
            self._monitors[address] = monitor
            self.sockets[address] = sock
            self.by_socket[sock] = address
            self.poller.register(sock, zmq.POLLIN)
        return sock

    def send(self, address: str, frames: list[Any], *, wait_connect_ms: int = 1_000) -> None:
        """Send without blocking forever: a node that is down raises NodeNotReadyError, with
        ``sent=False`` (nothing went out: safe to send elsewhere or again)."""
        sock = self.socket(address)
        monitor = self._monitors.get(address)
        if monitor is not None and zmq_get(monitor, EVENTS) & POLLIN:
            self._read_monitor(address)  # a drop before this send is counted before it: see drops()
        deadline = time.monotonic() + wait_connect_ms / 1000.0
        while True:
            try:
                send_multipart_nowait(sock, frames)
                return
            except zmq.Again:
                if time.monotonic() >= deadline:
                    self.raise_handshake_error(address)
                    raise errors.NodeNotReadyError(f"node {address} is not reachable", sent=False) from None
                time.sleep(0.005)

    def handshake_error(self, address: str) -> str | None:
        """Why the last handshake with ``address`` failed, if a failure was reported."""
        self._read_monitor(address)
        return self._handshake_errors.get(address)

    def _read_monitor(self, address: str) -> bool:
        """Read the connection events queued for ``address``; True if one was a disconnect."""
        monitor = self._monitors.get(address)
        dropped = False
        while monitor is not None:
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            if event.get("event") == zmq.EVENT_DISCONNECTED:
                self._disconnected.add(address)
                self._drops[address] = self._drops.get(address, 0) + 1
                self._up[address] = False
                dropped = True
                continue
            if event.get("event") == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._up[address] = True
                continue
            self._handshake_errors[address] = _describe_handshake_failure(event, self.security is not None)
        return dropped

    def drops(self, address: str) -> int:
        """How many connections to ``address`` dropped so far, as read from its monitor (by
        send(), take_disconnected() and request()). Note it right after sending a request."""
        return self._drops.get(address, 0)

    def lost_and_back(self, address: str, drops_at_send: int) -> bool:
        """The connection a request went out on (``drops(address)`` then: ``drops_at_send``)
        has dropped, so its answer cannot come, and a new connection is up: resend it now
        rather than after its timeout. While none is up (the node is down) the caller keeps
        waiting as before (a new leader, or the timeout)."""
        return self._drops.get(address, 0) > drops_at_send and self._up.get(address, False)

    def take_disconnected(self) -> set[str]:
        """Addresses whose connection dropped since the last call (read from the monitors)."""
        for address, monitor in list(self._monitors.items()):
            if zmq_get(monitor, EVENTS) & POLLIN:  # cheaper than a recv that raises Again
                self.handshake_error(address)
        gone, self._disconnected = self._disconnected, set()
        return gone

    def raise_handshake_error(self, address: str) -> None:
        why = self.handshake_error(address)
        if why is not None:
            raise errors.AuthenticationFailedError(f"node {address} refused the connection: {why}")

    def drop(self, address: str) -> None:
        """Close a socket, discarding anything queued on it (after a timeout)."""
        sock = self.sockets.pop(address, None)
        if sock is not None:
            self.by_socket.pop(sock, None)
            self.poller.unregister(sock)
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            sock.close(linger=0)
        monitor = self._monitors.pop(address, None)
        if monitor is not None:
            monitor.close(linger=0)
        self._handshake_errors.pop(address, None)
        self._up.pop(address, None)  # a new socket is up only once its handshake succeeds

    def drain(self) -> list[tuple[str, list[Any]]]:
        """Every reply already waiting on any socket, without blocking."""
        out, self._stash = self._stash, []
        for sock, address in list(self.by_socket.items()):
            self._receive_all(sock, address, out)
        return out

    @staticmethod
    def _receive_all(sock: zmq.Socket[Any], address: str, out: list[tuple[str, list[Any]]]) -> None:
        while readable(sock):
            message = recv_if_ready(sock)
            if message is None:
                return
            out.append((address, message))

    def poll(self, timeout_ms: int) -> list[tuple[str, list[Any]]]:
        out, self._stash = self._stash, []
        if out:
            timeout_ms = 0  # something is already waiting: do not block
        if not self.poller.sockets:
            time.sleep(max(0, timeout_ms) / 1000.0)
            return out
        for sock, _ in self.poller.poll(max(0, timeout_ms)):
            address = self.by_socket.get(sock)
            if address is not None:  # other sockets may share an external poller
                self._receive_all(sock, address, out)
        return out

    def request(self, address: str, api_key: int, body: dict[str, Any], *, timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                batches: list[bytes] | None = None, wait_connect_ms: int = 1_000) -> Message:
        """One synchronous request. Replies to other requests that arrive meanwhile are
        kept and handed out by the next poll() or drain()."""
        correlation_id = self.next_id()
        if address in self._monitors:
            self._read_monitor(address)  # a drop before this request is not this request's
        self.send(address, apis.encode_request(api_key, body, correlation_id, batches=batches),
                  wait_connect_ms=wait_connect_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        sock = self.sockets[address]
        # The monitor is polled too: when the connection the request went out on drops (the
        # node died or closed it), its answer can no longer come, and waiting out the whole
        # timeout (15 s for a queue ack) only delays the caller's retry elsewhere.
        waiter = zmq.Poller()
        waiter.register(sock, zmq.POLLIN)
        waiter.register(self._monitors[address], zmq.POLLIN)
        while True:
            remaining_ms = math.ceil((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                self.raise_handshake_error(address)
                self.drop(address)
                raise errors.RequestTimedOutError(f"{ApiKey(api_key).name} to {address} timed out after {timeout_ms} ms")
            ready = dict(waiter.poll(remaining_ms))
            if sock not in ready:
                if self._read_monitor(address) and not sock.poll(0):
                    self.raise_handshake_error(address)
                    self.drop(address)
                    raise errors.NodeNotReadyError(
                        f"{ApiKey(api_key).name} to {address}: the connection dropped before the answer came")
                continue
            frames = sock.recv_multipart(copy=False)
            if not decode_header(frames[0].bytes).is_response:
                continue  # no answer (a request, a flag left out): dropped as others' answers are (apis.decode_response)
            message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            # The API too: an answer of another API carrying this id (a node that echoed a
            # wrong correlation id) read as this one's raised a bare KeyError from its body.
            if message.header.correlation_id != correlation_id or message.header.api_key != api_key:
                self._stash.append((address, frames))
                continue
            if message.header.error_code:
                errors.raise_for_code(message.header.error_code, message.body.get("message", ""))
            return message

    def close(self) -> None:
        for address in list(self.sockets):
            self.drop(address)
        if self._finalizer is not None:
            self._finalizer.detach()


def _close_sockets(sockets: dict[str, zmq.Socket[Any]], monitors: dict[str, zmq.Socket[Any]]) -> None:
    """What a Connections nobody closed does when collected (nobody else holds its sockets)."""
    for sock in [*sockets.values(), *monitors.values()]:
        sock.close(linger=0)
    sockets.clear()
    monitors.clear()


def _describe_handshake_failure(event: Any, secure: bool) -> str:
    kind = event.get("event")
    if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return "the node does not know this client's key (register it: fabric principal add)"
    if not secure and event.get("value") == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "the node requires CURVE; set $FABRIC_KEY_FILE and $FABRIC_SERVER_KEY (docs/SECURITY.md)"
    if not secure:
        # A CURVE node often just closes a plaintext handshake (no detail, EPIPE), and so
        # does anything that is not ZeroMQ: a ZooKeeper address given without zk:// is the
        # usual slip (a bare HOST:PORT means a node). Both are named.
        return ("either the node requires CURVE (set $FABRIC_KEY_FILE and $FABRIC_SERVER_KEY, docs/SECURITY.md) "
                "or what answers there is not a Fabric node (a ZooKeeper address needs zk:// in front) "
                f"(zmq event {kind}, value {event.get('value')})")
    return ("the CURVE handshake failed: wrong server key, or the node is not secure "
            f"(zmq event {kind}, value {event.get('value')})")
