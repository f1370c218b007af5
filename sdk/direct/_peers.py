"""What a DirectClient knows of the instances it talks to: one ``_Peer`` (a DEALER, its
requests in flight, its heartbeat health) per instance, grouped by service in a
``_ServiceView`` that picks the least loaded ready instance."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import TYPE_CHECKING

import zmq

from fabric import errors
from fabric.protocol import direct as wire
from sdk.direct import _balance as balance
from sdk.direct import _registry as registry
from sdk.direct._io import SocketReader, make_socket, send_frames

if TYPE_CHECKING:
    from sdk.direct._client import DirectClient


Response = tuple[wire.DirectHeader, list[bytes]]  # a REPLY or ERROR, its header decoded once

# An instance that answered SERVICE_STOPPING takes nothing new from this client for this
# long, then is tried again (as a gRPC channel reconnects after a GOAWAY). One that really
# stops has left the registry and gone silent by then; one that refused for a moment, or
# keeps serving under the same registration, is back in rotation. A refused request costs
# its caller one round trip: nothing ran, so it goes elsewhere.
STOPPING_HOLD_S = 1.0


class _PeerLost(Exception):
    """The instance stopped answering (heartbeats) or left the registry with this request in flight."""


class _Peer:
    def __init__(self, client: DirectClient, view: _ServiceView, znode: str, info: registry.InstanceInfo,
                 now: float) -> None:
        self.znode = znode
        self.view = view
        self.info = info
        self.health = balance.PeerHealth(now, interval_ms=client.heartbeat_interval_ms,
                                         liveness=client.heartbeat_liveness)
        self.pending: dict[int, asyncio.Future[Response]] = {}
        self.leaving = False  # gone from the registry: finish what is in flight, take nothing new
        self.draining = False  # answered SERVICE_STOPPING: take nothing new until draining_until_s
        self.draining_until_s = 0.0
        self.remote_load = 0
        self.blocking_outstanding = 0  # requests in flight from the blocking API's threads
        self.left_s = 0.0  # when it left the registry
        self.closed = False
        self.redials = 0
        # Secure mode: its key's principal may serve the service (re-checked on every change
        # of principals or ACLs: DirectClient._trust_changed); no new requests otherwise.
        self.trusted = True
        self._client = client
        self.sock = make_socket(client.ctx, zmq.DEALER)
        try:
            if client.security is not None:
                client.security.connect_socket(self.sock, info.curve_key)  # pinned: the registered key
            self.sock.connect(info.address)
        except zmq.ZMQError:  # an address (or key) ZeroMQ refuses: the caller skips this instance
            self.sock.close(linger=0)
            raise
        self.reader = SocketReader(client.loop, self.sock, self._on_message)

    @property
    def pickable(self) -> bool:
        return self.health.alive and not self.leaving and not self.draining and self.trusted

    @property
    def outstanding(self) -> int:
        """Requests of this client in flight to the instance, from the loop and from
        blocking callers' threads."""
        return len(self.pending) + self.blocking_outstanding

    def stopping(self, now: float) -> None:
        """It answered SERVICE_STOPPING: out of selection for STOPPING_HOLD_S (the
        client's heartbeat loop ends the hold). Safe from a blocking caller's thread: the
        view is refreshed by whoever calls this, on the loop."""
        self.draining_until_s = now + STOPPING_HOLD_S
        self.draining = True

    def send(self, frames: list[bytes]) -> bool:
        try:
            send_frames(self.sock, frames)
        except zmq.ZMQError:
            return False  # the high-water mark is full: nothing was queued
        self.reader.kick()
        return True

    def redial(self) -> None:
        """Secure mode: libzmq (4.3) never retries a connection whose CURVE handshake was
        refused, so a peer silent past its limit is dialled again (its key, or ours, may
        have been registered since: principals take effect without restarts)."""
        with contextlib.suppress(zmq.ZMQError):
            self.sock.disconnect(self.info.address)
        self.sock.connect(self.info.address)
        self.health.unanswered_since_s = None
        self.redials += 1

    def _on_message(self, frames: list[bytes]) -> None:
        if self.health.heard(time.monotonic()):
            self.view.refresh()
        try:
            header = wire.decode_header(frames[0])
        except errors.FabricError:
            return
        if header.type == wire.PONG:
            self.remote_load = header.aux
            return
        if header.type == wire.PING:
            self.send(wire.pong_frames(0))
            return
        future = self.pending.pop(header.correlation_id, None)
        if future is not None and not future.done():
            future.set_result((header, frames))
        elif header.type == wire.ERROR and header.correlation_id == 0 and len(frames) == 2:
            self._notice(frames[1])

    def _notice(self, body: bytes) -> None:
        """An ERROR under correlation id 0 is about the instance, not a request: a stop
        notice (SERVICE_STOPPING) takes it out of selection at once, before this client's
        ZooKeeper watch says it left; requests in flight go on (it drains them)."""
        try:
            code = wire.decode_error(body).code
        except errors.FabricError:
            return
        if code == errors.ServiceStopping.code:
            was_draining = self.draining
            self.stopping(time.monotonic())
            if not was_draining:
                self.view.refresh()

    def fail_all(self, reason: str) -> None:
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(_PeerLost(reason))

    def close(self) -> None:
        self.closed = True
        self.fail_all(f"instance {self.znode} closed")
        self.reader.close()
        self.sock.close(linger=0)


class _ServiceView:
    """What this client knows of one service: its instances and their health."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.peers: dict[str, _Peer] = {}
        self.known = asyncio.Event()  # the registry answered at least once
        self.changed = asyncio.Event()  # set whenever a peer becomes pickable
        self.watch: registry.RegistryWatch | None = None
        self.unusable: set[str] = set()  # registered instances ZeroMQ cannot dial: warned about once
        # Secure mode: registered instances whose key's principal may not serve the name (yet):
        # admitted if a grant comes (DirectClient._trust_changed).
        self.distrusted: dict[str, registry.InstanceInfo] = {}
        self.error: errors.FabricError | None = None  # the first registry read failed
        self.loading: asyncio.Future[None] | None = None  # the first registry read
        # The pickable peers, recomputed on every change of a peer's state rather than on
        # every request (the request path reads it).
        self.ready: list[_Peer] = []
        self.used_s = time.monotonic()  # the last call through this view (``idle``)
        self.registry_asked_s = float("-inf")  # when a call finding no instance last read ZooKeeper itself

    def idle(self, now_s: float, idle_s: float) -> bool:
        """Not called for ``idle_s`` and nothing of ours in flight to its instances: the
        client may drop it (its watch and connections), as gRPC closes an idle channel; the
        next call reads the registry again. Without that a long-lived caller kept a view, a
        ZooKeeper watch and its connections for every name it ever called, for ever."""
        return (now_s - self.used_s >= idle_s and self.known.is_set()
                and not any(p.pending or p.blocking_outstanding for p in self.peers.values()))

    def close(self) -> None:
        if self.loading is not None:
            self.loading.cancel()
        if self.watch is not None:
            self.watch.close()
        for peer in self.peers.values():
            peer.close()
        self.peers.clear()
        self.ready = []

    def refresh(self) -> None:
        ready = [p for p in self.peers.values() if p.pickable]
        if not ready and not self.awaiting_first_answer():
            # Last resort: instances that left the registry but still answer heartbeats. A
            # ZooKeeper session that expired and came back removes and re-creates an
            # instance's znode; this bridges that gap. One that really stops answers
            # SERVICE_STOPPING (nothing runs, the caller moves on); a dead one goes silent.
            # Not while a registered instance is yet to answer its first PING (a
            # replacement that has just started): an instance that has just stopped may
            # still count as alive for a heartbeat interval, and a request sent to it in
            # that window was lost (it waited out the silence limit, then failed as
            # "may have run"); waiting a moment for the new instance costs a round trip.
            ready = [p for p in self.peers.values()
                     if p.leaving and p.health.alive and not p.draining and p.trusted]
        self.ready = ready
        if ready:
            self.changed.set()

    def pickable(self) -> dict[str, _Peer]:
        return {p.znode: p for p in self.ready}

    def awaiting_first_answer(self) -> bool:
        """A registered, trusted instance has not answered yet (nor been declared dead)."""
        return any(p.health.state == balance.CONNECTING and not p.leaving and p.trusted
                   for p in self.peers.values())

    def pick(self, tried: list[str], rng: random.Random) -> _Peer | None:
        """Least outstanding requests among the ready peers (this client's count, from any
        thread); None when no peer is ready."""
        self.used_s = time.monotonic()
        ready = self.ready
        if len(ready) <= 1:
            return ready[0] if ready else None  # the only choice, tried or not
        now = time.monotonic()
        suspects = [p.znode for p in ready if p.health.suspect(now)]
        chosen = balance.pick_instance({p.znode: p.outstanding for p in ready}, exclude=tried, avoid=suspects, rng=rng)
        return next(p for p in ready if p.znode == chosen)
