"""The bytes of FETCH answers a client has not taken yet, and the bound on them.

ZeroMQ bounds a ROUTER's queue towards each peer by messages only (``ROUTER_HWM_MESSAGES``
in ``nodes/server.py``), and one FETCH answer may carry 64 MiB (``FETCH_BYTES_MAX``): a
client that kept sending fetches and never read its answers made the node hold every one
(an audit: a DEALER sending 100 fetches of 8 MiB every 3 s took a leader from 57 MB to
4.5 GB, still held after it left). Lowering the message bound does not help: ZeroMQ learns
late that a peer has read, so a client reading normally in a burst of 1,000 pipelined
requests lost answers at a bound of 16.

So the last frame of every FETCH answer carrying data is sent as a tracked, uncopied
``zmq.Frame``: libzmq releases it once the answer has been written to the connection (into
the kernel's buffer) or the connection is gone. The answers a client has not taken are
those not yet released. Past ``CLIENT_REPLY_BYTES_MAX`` of them for one client, or
``NODE_REPLY_BYTES_MAX`` for all, a fetch reads nothing: it waits (parked, as a fetch at
the log end does) and is answered empty at its deadline, so a client that is merely
behind gets data again as soon as it reads, and one that never reads costs the node its
bounded empty answers. NATS has the same rule (a client past its pending bytes is a slow
consumer); Kafka mutes a connection while its answer is unsent.

State is per client identity and only touched on the loop thread.
"""

from __future__ import annotations

import collections
import time
from typing import Any, Final

import zmq

CLIENT_REPLY_BYTES_MAX: Final[int] = 128 * 1024 * 1024  # two of the largest FETCH answers
NODE_REPLY_BYTES_MAX: Final[int] = 1024 * 1024 * 1024  # every client together
SWEEP_INTERVAL_S: Final[float] = 5.0  # how often clients whose answers are all taken are forgotten


class ReplyBudget:
    def __init__(self, client_bytes_max: int = CLIENT_REPLY_BYTES_MAX,
                 node_bytes_max: int = NODE_REPLY_BYTES_MAX) -> None:
        self.client_bytes_max = client_bytes_max
        self.node_bytes_max = node_bytes_max
        # identity -> answers in the order sent: (tracker, bytes). libzmq writes a peer's
        # messages in order, so the oldest not yet released blocks the rest.
        self._pending: dict[bytes, collections.deque[tuple[Any, int]]] = {}
        self._client_bytes: dict[bytes, int] = {}
        self.total_bytes = 0
        self._next_sweep_s = 0.0

    def room(self, identity: bytes) -> int:
        """How many bytes a fetch from ``identity`` may read now (0: nothing)."""
        now = time.monotonic()
        if now >= self._next_sweep_s:
            self._next_sweep_s = now + SWEEP_INTERVAL_S
            for other in list(self._pending):
                self._release(other)
        else:
            self._release(identity)
        pending = self._client_bytes.get(identity, 0)
        return max(0, min(self.client_bytes_max - pending, self.node_bytes_max - self.total_bytes))

    def pending_bytes(self, identity: bytes) -> int:
        self._release(identity)
        return self._client_bytes.get(identity, 0)

    def clients(self) -> int:
        return len(self._pending)

    def tracked(self, frames: list[Any]) -> tuple[list[Any], Any]:
        """``frames`` with the last one sent tracked and uncopied, and its tracker."""
        last = zmq.Frame(frames[-1], track=True, copy=False)
        return [*frames[:-1], last], last.tracker

    def sent(self, identity: bytes, tracker: Any, nbytes: int) -> None:
        """An answer of ``nbytes`` left for ``identity`` with ``tracker`` on its last frame."""
        self._pending.setdefault(identity, collections.deque()).append((tracker, nbytes))
        self._client_bytes[identity] = self._client_bytes.get(identity, 0) + nbytes
        self.total_bytes += nbytes

    def _release(self, identity: bytes) -> None:
        queue = self._pending.get(identity)
        if queue is None:
            return
        freed = 0
        while queue and queue[0][0].done:
            freed += queue.popleft()[1]
        if freed:
            self._client_bytes[identity] -= freed
            self.total_bytes -= freed
        if not queue:
            del self._pending[identity]
            del self._client_bytes[identity]
