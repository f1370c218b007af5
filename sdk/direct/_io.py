"""Plain ZeroMQ sockets driven by an asyncio loop, without zmq.asyncio's per-call futures.

A ZeroMQ socket's FD is edge-triggered: it signals that *something* changed, and it stays
quiet until the socket has been drained (recv until EAGAIN). So ``drain`` reads until
EAGAIN (in bounded bursts, yielding to the loop between them), and ``kick`` re-checks after
every send, because a send may consume the pending edge. This is the lean path the
benchmark measures; each socket belongs to the loop's thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import zmq

BURST_MAX = 256  # messages read per wake-up before other sockets get a turn
SOCKET_HWM = 10_000


def make_socket(ctx: zmq.Context[Any], kind: int, *, hwm: int = SOCKET_HWM) -> zmq.Socket[Any]:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    sock.setsockopt(zmq.MAXMSGSIZE, 64 * 1024 * 1024)
    return sock


class SocketReader:
    """Calls ``on_message(frames)`` on the loop for every message the socket receives."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: zmq.Socket[Any],
                 on_message: Callable[[list[bytes]], None]) -> None:
        self._loop = loop
        self._sock = sock
        self._on_message = on_message
        self._fd: int = sock.FD
        self._closed = False
        loop.add_reader(self._fd, self.drain)
        loop.call_soon(self.drain)  # anything that arrived before the reader was added

    def drain(self) -> None:
        if self._closed:
            return
        sock = self._sock
        recv = sock.recv_multipart
        # Asking ZMQ_EVENTS before each read is cheaper than the EAGAIN exception that
        # ends a blind read loop, and it re-arms the edge just the same.
        try:
            for _ in range(BURST_MAX):
                if not int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    return
                self._on_message(recv(zmq.NOBLOCK))
                if self._closed:
                    return
        except zmq.ZMQError:
            return  # socket closed under us during shutdown
        self._loop.call_soon(self.drain)  # more may be waiting: come back after others ran

    def kick(self) -> None:
        """Call after sending on this socket: the send may have swallowed the read edge."""
        if not self._closed and int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._loop.call_soon(self.drain)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._fd)
