"""Plain ZeroMQ sockets driven by an asyncio loop, without zmq.asyncio's per-call futures.

A ZeroMQ socket's FD is edge-triggered: it signals that *something* changed, and it stays
quiet until the socket has been drained (recv until EAGAIN). So ``drain`` reads until
EAGAIN (in bounded bursts, yielding to the loop between them), and ``kick`` re-checks after
every send made outside ``drain``, because a send may consume the pending edge. This is
the lean path the benchmark measures; each socket belongs to the loop's thread only.

Sends and receives call pyzmq's Cython socket methods with plain-int flags
(``fabric/transport.py``): the sugar layer's ``send_multipart``/``recv_multipart`` cost a
few microseconds per message in argument checks and IntFlag arithmetic, a visible share of
a ~100 us round trip.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import zmq

from fabric.protocol import direct as wire
from fabric.transport import EVENTS as _EVENTS
from fabric.transport import MORE_NOBLOCK as _MORE_NOBLOCK
from fabric.transport import NOBLOCK as _NOBLOCK
from fabric.transport import POLLIN as _POLLIN
from fabric.transport import RCVTIMEO as _RCVTIMEO
from fabric.transport import zmq_get as _get
from fabric.transport import zmq_recv_frame as _recv_frame
from fabric.transport import zmq_send as _send
from fabric.transport import zmq_set as _set

BURST_MAX = 256  # messages read per wake-up before other sockets get a turn
SOCKET_HWM = 10_000


def make_socket(ctx: zmq.Context[Any], kind: int, *, hwm: int = SOCKET_HWM) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, wire.PAYLOAD_BYTES_MAX)
    return sock


def bind(sock: zmq.Socket[Any], endpoint: str) -> str:
    """Binds ``endpoint`` (port ``*`` or ``0``: a free one); returns what was bound,
    ``tcp://host:port`` (a wildcard host stays a wildcard: see _registry.advertised_address)."""
    if endpoint.endswith((":*", ":0")):
        base = endpoint.rsplit(":", 1)[0]
        return f"{base}:{sock.bind_to_random_port(base)}"
    sock.bind(endpoint)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def send_frames(sock: zmq.Socket[Any], frames: list[bytes]) -> None:
    """One multipart message, without blocking. Raises zmq.Again when the high-water mark
    is reached; ZeroMQ checks it on the first frame only, so nothing was queued then."""
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _MORE_NOBLOCK)
    _send(sock, frames[last], _NOBLOCK)


def recv_frames(sock: zmq.Socket[Any]) -> list[bytes]:
    """One multipart message that the socket's events said is there. Frames are read
    uncopied and copied once into bytes: asking a Frame whether more follow is cheaper
    than RCVMORE."""
    frame = _recv_frame(sock, _NOBLOCK, False)
    frames: list[bytes] = [frame.bytes]
    while frame.more:
        frame = _recv_frame(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def recv_frames_within(sock: zmq.Socket[Any], timeout_ms: int) -> list[bytes] | None:
    """One multipart message, waiting up to ``timeout_ms`` for it; None when none came.

    A blocking receive with a receive timeout, not ``zmq_poll`` and then a non-blocking
    receive: the poll asks the socket's events before and after it waits and the receive
    asks again, each a system call here, where a blocking receive waits on the socket's
    mailbox once (as a bare pyzmq client does)."""
    _set(sock, _RCVTIMEO, timeout_ms)
    try:
        frame = _recv_frame(sock, 0, False)
    except zmq.Again:
        return None
    frames: list[bytes] = [frame.bytes]
    while frame.more:
        frame = _recv_frame(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def recv_frames_with_principal(sock: zmq.Socket[Any]) -> list[bytes]:
    """``recv_frames`` with the sender's principal (the ZAP User-Id, UTF-8) put first: the
    receive of a CURVE server in secure mode (sdk/direct/_secure.py)."""
    frame = _recv_frame(sock, _NOBLOCK, False)
    try:
        principal = str(frame.get("User-Id") or "")
    except (zmq.ZMQError, KeyError):
        principal = ""
    frames: list[bytes] = [principal.encode(), frame.bytes]
    while frame.more:
        frame = _recv_frame(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


class SocketReader:
    """Calls ``on_message(frames)`` on the loop for every message the socket receives
    (read with ``recv``: ``recv_frames``, or ``recv_frames_with_principal`` in secure mode).

    ``lock``, when other threads send on the socket too (a service's sync-handler threads
    send their own replies): held around every use of the socket here, ``on_message``
    included, so it must be re-entrant for sends made from ``on_message``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: zmq.Socket[Any],
                 on_message: Callable[[list[bytes]], None],
                 recv: Callable[[zmq.Socket[Any]], list[bytes]] = recv_frames,
                 lock: threading.RLock | None = None) -> None:
        self._loop = loop
        self._sock = sock
        self._on_message = on_message
        self._recv = recv
        self._lock = lock
        self._fd: int = sock.FD
        self._closed = False
        self._draining = False
        loop.add_reader(self._fd, self.drain)
        loop.call_soon(self.drain)  # anything that arrived before the reader was added

    def drain(self) -> None:
        self._locked(self._drain)

    def _locked(self, step: Callable[[], None]) -> None:
        """``step`` under the socket lock when there is one (no lock: async handlers only)."""
        if self._lock is None:
            step()
            return
        with self._lock:
            step()

    def _drain(self) -> None:
        if self._closed:
            return
        sock = self._sock
        on_message = self._on_message
        recv = self._recv
        # Asking ZMQ_EVENTS before each read is cheaper than the EAGAIN exception that
        # ends a blind read loop, and it re-arms the edge just the same. Sends made by
        # ``on_message`` need no kick: the next check here re-arms the edge after them.
        self._draining = True
        try:
            for _ in range(BURST_MAX):
                if not _get(sock, _EVENTS) & _POLLIN:
                    return
                on_message(recv(sock))
                if self._closed:
                    return
        except zmq.ZMQError:
            return  # socket closed under us during shutdown
        finally:
            self._draining = False
        self._loop.call_soon(self.drain)  # more may be waiting: come back after others ran

    def kick(self) -> None:
        """Call after sending on this socket: the send may have swallowed the read edge."""
        self._locked(self._kick)

    def _kick(self) -> None:
        if not self._closed and not self._draining and _get(self._sock, _EVENTS) & _POLLIN:
            self._loop.call_soon(self.drain)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
