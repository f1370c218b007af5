"""The direct plane's asyncio core: find instances through ZooKeeper, talk to them peer to
peer. One DEALER per instance, correlation ids for pipelining, PING/PONG heartbeats,
least-outstanding selection, Lazy-Pirate retries for idempotent calls only."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from typing import Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric.auth.store import zk_digest_from_env
from fabric.protocol import direct as wire
from fabric.zk import close_client, close_client_within
from sdk._client import Bootstrap
from sdk.direct import _balance as balance
from sdk.direct import _registry as registry
from sdk.direct._deadlines import Deadlines
from sdk.direct._peers import Response, _Peer, _PeerLost, _ServiceView
from sdk.direct._pubsub import PENDING_MAX_DEFAULT, MessageHandler, Publisher, Subscription
from sdk.direct._secure import DirectCredentials, DirectSecurity
from sdk.direct._server import CONCURRENCY_DEFAULT, Handler, Service
from sdk.direct._types import (
    GatherResult,
    Message,
    Reply,
    as_bytes,
    as_headers,
    count_arg,
    ms_arg,
    to_loop,
)

log = logging.getLogger("fabric.direct")

TIMEOUT_MS_DEFAULT = 5_000
ATTEMPTS_MAX_DEFAULT = 3
TIMEOUT_MS_MAX = 24 * 3600 * 1000  # fits the header's u32 with room to spare
LEAVING_GRACE_S = 5.0  # an instance gone from the registry stays a last resort while it answers
REGISTRY_ASK_INTERVAL_S = 0.1  # a name's view asks ZooKeeper itself at most this often (_wait_pickable)
DISCOVERY_WAIT_MS = 2_000  # a call with no instance ready waits this long (within its deadline) for one
# A service this client has not called for this long is forgotten (_ServiceView.idle): its
# registry watch and its connections close, and the next call reads the registry again.
SERVICE_VIEW_IDLE_MS = 600_000
IDLE_CHECK_INTERVAL_S = 1.0


class DirectClient:
    """Request-reply, scatter-gather, pub/sub and serving, on the running asyncio loop.

    Create with ``await DirectClient.connect("zk://host:port")`` (or through
    ``sdk.connect``); every method must be called on that loop."""

    def __init__(self, zk: KazooClient, *, own_zk: bool = True,
                 heartbeat_interval_ms: int = balance.HEARTBEAT_INTERVAL_MS,
                 heartbeat_liveness: int = balance.HEARTBEAT_LIVENESS,
                 retry_ratio: float = 0.2, min_retries_per_s: float = 10.0,
                 publisher_bind: str = "tcp://127.0.0.1:*", advertise: str | None = None,
                 security: DirectSecurity | None = None, service_view_idle_ms: float = SERVICE_VIEW_IDLE_MS) -> None:
        self.service_view_idle_s = ms_arg("service_view_idle_ms", service_view_idle_ms, TIMEOUT_MS_MAX) / 1000
        self.zk = zk
        self._own_zk = own_zk
        self.loop = asyncio.get_running_loop()
        # Secure mode: the ZAP handler belongs to a context (one per context), so a secure
        # client has a context of its own; a plaintext one shares the process's.
        self.security = security
        self.ctx: zmq.Context[Any] = security.zap_context if security is not None else zmq.Context.instance()
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.heartbeat_liveness = heartbeat_liveness
        # Sockets bind to loopback unless told otherwise; with a wildcard bind
        # (tcp://0.0.0.0:*) the registry gets ``advertise`` or the host's address toward
        # ZooKeeper (sdk.direct._registry.advertised_address).
        self.publisher_bind = publisher_bind
        self.advertise = advertise
        self.retry_budget = balance.RetryBudget(ratio=retry_ratio, min_retries_per_s=min_retries_per_s,
                                                now=time.monotonic())
        self._views: dict[str, _ServiceView] = {}
        self._ids = itertools.count(1)
        self._services: list[Service] = []
        self._subscriptions: list[Subscription] = []
        self._publisher: Publisher | None = None
        self._publisher_lock = asyncio.Lock()
        # Chosen now, so subscriptions made before the publisher starts already know which
        # registered publisher is this client's own (delivered in process, not connected to).
        self._publisher_id = random.getrandbits(32)
        self._closed = False
        self._rng = random.Random()
        self._deadlines = Deadlines(self.loop)
        self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())
        if security is not None:
            security.add_listener(self._trust_changed_threadsafe)

    @classmethod
    async def connect(cls, zk_hosts: str, *, credentials: DirectCredentials | None = None,
                      **options: Any) -> DirectClient:
        """Connect to ZooKeeper: ``zk_hosts`` is ``zk://host:port[,host:port][/chroot]``
        (as ``sdk.connect`` takes it) or the same without ``zk://``. With ``credentials``
        (or ``$FABRIC_KEY_FILE`` set) the client runs secure: CURVE on every direct
        socket, ACLs on services; serving and publishing also need a ZooKeeper credential
        that may write the registry (``credentials.zk_digest`` or
        ``$FABRIC_ZK_DIGEST_FILE``; docs/SECURITY.md)."""
        zk_hosts = zookeeper_hosts(zk_hosts)
        credentials = credentials or DirectCredentials.from_env()
        # A plaintext client may still hold a ZooKeeper credential ($FABRIC_ZK_DIGEST_FILE).
        zk_digest = credentials.zk_digest if credentials is not None else zk_digest_from_env()
        starting = asyncio.ensure_future(asyncio.to_thread(registry.start_client, zk_hosts, zk_digest=zk_digest))
        try:
            zk = await asyncio.shield(starting)
        except asyncio.CancelledError:  # the thread goes on: close its client once started
            starting.add_done_callback(_close_started_client)
            raise
        security = None
        try:
            if credentials is not None:
                security = DirectSecurity(credentials, zk, zmq.Context())
                await asyncio.to_thread(security.start)
            return cls(zk, own_zk=True, security=security, **options)
        except BaseException:  # cancelled, refused, or bad options: nothing may stay open
            if security is not None:
                security.close()
            _close_in_background(zk)
            raise

    # -- discovery ---------------------------------------------------------------------

    async def _view(self, name: str, timeout_ms: int = TIMEOUT_MS_DEFAULT) -> _ServiceView:
        """The view of ``name``, after its first registry read. The read belongs to the
        view, not to the request that started it: a request that runs out of time leaves it
        running for the others, and a failed read is forgotten so the next request tries
        ZooKeeper again."""
        if self._closed:
            raise errors.ClientClosedError("direct client is closed")
        view = self._views.get(name)
        if view is None:
            registry.validate_service_name(name)
            view = _ServiceView(name)
            self._views[name] = view
            view.loading = asyncio.ensure_future(self._first_read(view))
        view.used_s = time.monotonic()
        if not view.known.is_set():
            assert view.loading is not None
            try:
                await asyncio.wait_for(asyncio.shield(view.loading), timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise errors.NoServiceAvailable(
                    f"service {name!r}: the registry did not answer within {timeout_ms} ms") from None
        if view.error is not None:
            raise view.error
        return view

    async def _first_read(self, view: _ServiceView) -> None:
        loop = self.loop
        view.watch = registry.RegistryWatch(
            self.zk, registry.service_path(view.name),
            lambda found: to_loop(loop, self._instances_changed, view, found))
        try:
            await asyncio.to_thread(view.watch.start)
        except Exception as exc:
            view.watch.close()
            if self._views.get(view.name) is view:
                del self._views[view.name]
            view.error = errors.NoServiceAvailable(f"service {view.name!r}: registry unreadable: {exc}")
            view.known.set()
            return
        await view.known.wait()  # the watch's first delivery, posted to this loop

    def _instances_changed(self, view: _ServiceView, found: dict[str, registry.InstanceInfo]) -> None:
        if self._closed:
            return
        now = time.monotonic()
        for znode, peer in view.peers.items():
            if znode not in found and not peer.leaving:
                peer.leaving = True  # closed by the heartbeat loop once nothing is in flight
                peer.left_s = now
        if view.unusable:
            view.unusable.intersection_update(found)
        view.distrusted = {znode: info for znode, info in view.distrusted.items() if znode in found}
        for znode, info in found.items():
            if znode not in view.peers and znode not in view.unusable and znode not in view.distrusted:
                if self.security is not None and not self.security.trusted_server(info.curve_key, view.name):
                    view.distrusted[znode] = info
                    log.warning("instance %s of %s ignored: its key is not a principal allowed to serve it",
                                znode, view.name)
                    continue
                self._add_peer(view, znode, info, now)
        view.refresh()
        view.known.set()

    def _add_peer(self, view: _ServiceView, znode: str, info: registry.InstanceInfo, now: float) -> None:
        try:
            peer = _Peer(self, view, znode, info, now)
        except zmq.ZMQError as exc:  # one bad entry must not cost the others: skip it, say so once
            view.unusable.add(znode)
            log.warning("instance %s of %s ignored: cannot connect to %r: %s", znode, view.name,
                        info.address, exc)
            return
        view.peers[znode] = peer
        peer.health.ping_due(now)
        peer.send(wire.ping_frames(self.heartbeat_interval_ms))  # admitted as soon as it answers

    def _trust_changed_threadsafe(self) -> None:
        """Principals or ACLs changed (kazoo's thread): re-check on the loop."""
        if not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing to re-check
                self.loop.call_soon_threadsafe(self._trust_changed)

    def _trust_changed(self) -> None:
        """An instance whose key's principal may no longer serve its service (serve ACL
        revoked, principal removed or rotated to another key) gets no new requests from
        now on, as docs/SECURITY.md promises for every caller; one granted since is
        admitted. Requests already in flight to it finish."""
        security = self.security
        if self._closed or security is None:
            return
        now = time.monotonic()
        for view in list(self._views.values()):
            for znode, peer in view.peers.items():
                trusted = security.trusted_server(peer.info.curve_key, view.name)
                if peer.trusted and not trusted:
                    log.warning("instance %s of %s no longer used: its key is not a principal allowed to serve it",
                                znode, view.name)
                peer.trusted = trusted
            for znode, info in list(view.distrusted.items()):
                if security.trusted_server(info.curve_key, view.name):
                    del view.distrusted[znode]
                    self._add_peer(view, znode, info, now)
            view.refresh()

    def _drop_idle_views(self, now: float) -> None:
        for name, view in list(self._views.items()):
            if view.idle(now, self.service_view_idle_s):
                del self._views[name]
                view.close()
                log.debug("service %s not called for %.0f s: its view dropped", name, self.service_view_idle_s)

    async def _heartbeat_loop(self) -> None:
        interval_s = self.heartbeat_interval_ms / 1000 / 2
        next_idle_check_s = 0.0
        due_s = time.monotonic() + interval_s
        while not self._closed:
            await asyncio.sleep(interval_s)
            # Woken this much later than asked: this process (or its VM) did not run, and
            # that time is nobody's silence (PeerHealth.excuse). A few intervals of slack:
            # a busy loop is late by a little all the time.
            stalled_s = time.monotonic() - due_s
            due_s = time.monotonic() + interval_s
            stalled = stalled_s > 2 * interval_s
            if time.monotonic() >= next_idle_check_s:
                next_idle_check_s = time.monotonic() + IDLE_CHECK_INTERVAL_S
                self._drop_idle_views(time.monotonic())
            for view in self._views.values():
                for peer in list(view.peers.values()):
                    peer.reader.drain()  # frames that came while this loop was stalled count first
                now = time.monotonic()
                for znode, peer in list(view.peers.items()):
                    if peer.health.absorb():  # what blocking callers heard on their own sockets counts too
                        view.refresh()
                    if stalled:
                        peer.health.excuse(stalled_s)
                    if peer.draining and now >= peer.draining_until_s:
                        peer.draining = False  # its SERVICE_STOPPING hold is over: it may serve again
                        view.refresh()
                    if peer.health.check(now):
                        log.info("instance %s of %s silent for %.0f ms: marked dead", znode, view.name,
                                 peer.health.silence_limit_s * 1000)
                        view.refresh()
                        peer.fail_all(f"instance {znode} stopped answering heartbeats")
                    if peer.leaving and self._may_close(view, peer, now):
                        del view.peers[znode]
                        peer.close()
                        view.refresh()
                        continue
                    if self.security is not None and self._silent(peer, now):
                        peer.redial()
                    if peer.health.ping_due(now):
                        peer.send(wire.ping_frames(self.heartbeat_interval_ms))

    @staticmethod
    def _silent(peer: _Peer, now: float) -> bool:
        """Not alive, and a PING unanswered for longer than the silence limit."""
        since = peer.health.unanswered_since_s
        return not peer.health.alive and since is not None and now - since > peer.health.silence_limit_s

    @staticmethod
    def _may_close(view: _ServiceView, peer: _Peer, now: float) -> bool:
        """A peer gone from the registry closes once nothing of ours is in flight to it and
        it is not the last resort of its view (sdk.direct._ServiceView.refresh) any more:
        dead, past LEAVING_GRACE_S, or other instances are ready."""
        if peer.pending or peer.blocking_outstanding:
            return False
        if not peer.health.alive or now - peer.left_s > LEAVING_GRACE_S:
            return True
        if peer in view.ready:
            return any(not p.leaving for p in view.ready)
        # Kept while it may become the last resort again: nothing ready, and a new instance
        # yet to answer (which, should it never answer, leaves this one the only choice).
        return bool(view.ready) or not view.awaiting_first_answer()

    async def _wait_pickable(self, view: _ServiceView, deadline: float) -> dict[str, _Peer]:
        """Instances ready to take a request; waits briefly for registered ones to answer."""
        limit = min(deadline, time.monotonic() + DISCOVERY_WAIT_MS / 1000)
        asked: bool | None = None  # ZooKeeper asked: it lists an instance the watch has not delivered yet
        while True:
            ready = view.pickable()
            if ready:
                return ready
            remaining = limit - time.monotonic()
            none_registered = not any(not p.leaving for p in view.peers.values())
            if (none_registered and remaining > 0 and asked is None
                    and time.monotonic() - view.registry_asked_s >= REGISTRY_ASK_INTERVAL_S):
                # The watch delivers a little after ZooKeeper changed: a caller that has just
                # seen an instance in services() (a read of its own) must not be told none
                # is registered. ZooKeeper is asked once; instances there that the watch
                # has not delivered yet are waited for, as registered ones are. At most
                # every REGISTRY_ASK_INTERVAL_S per name: a caller calling a name nobody
                # serves in a loop must not turn each call into a ZooKeeper read.
                view.registry_asked_s = time.monotonic()
                asked = await self._registered_unseen(view, remaining)
                continue  # the view may have changed meanwhile
            if remaining <= 0 or (none_registered and not asked):
                registered = len(view.peers)
                stopping = sum(1 for p in view.peers.values() if p.draining)
                state = f"{stopping} answered SERVICE_STOPPING, the rest not answering" if stopping else "none answering"
                raise errors.NoServiceAvailable(
                    f"no live instance of service {view.name!r} ({registered} registered, {state})"
                    if registered else f"no instance of service {view.name!r} is registered")
            view.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(view.changed.wait(), remaining)

    async def _registered_unseen(self, view: _ServiceView, timeout_s: float) -> bool:
        """ZooKeeper lists an instance of ``view`` that the view has not had yet."""
        try:
            found = await asyncio.wait_for(asyncio.to_thread(
                registry.read_instances, self.zk, registry.service_path(view.name)), timeout_s)
        except (asyncio.TimeoutError, errors.FabricError):
            return False  # no answer: the view is all there is to go by
        return bool(found.keys() - view.peers.keys() - view.unusable - view.distrusted.keys())

    # -- request-reply -----------------------------------------------------------------

    async def request(self, name: str, payload: bytes | str, *, timeout_ms: int = TIMEOUT_MS_DEFAULT,
                      headers: dict[str, bytes | str] | None = None, idempotent: bool = False,
                      attempts_max: int = ATTEMPTS_MAX_DEFAULT) -> Reply:
        """Send to one instance (least outstanding requests) and wait for its reply.

        ``idempotent=True`` allows Lazy-Pirate retries on another instance after a timeout
        of one attempt or a dead peer, up to ``attempts_max`` attempts and within the retry
        budget. A non-idempotent request is sent once: if its instance dies or the time runs
        out it fails with RequestTimeout (outcome unknown), never sent twice. Requests an
        instance refused without running them (overloaded, stopping) are retried either way.
        """
        ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        count_arg("attempts_max", attempts_max, 1)
        body = as_bytes(payload, "payload")
        wire_headers = as_headers(headers)
        started_s = time.monotonic()  # timeout_ms bounds the whole call, a first registry read included
        view = self._views.get(name)
        if view is None or not view.known.is_set():
            view = await self._view(name, timeout_ms)
        loop = self.loop
        attempts = balance.Attempts(timeout_ms=timeout_ms, idempotent=idempotent, attempts_max=attempts_max,
                                    budget=self.retry_budget, now=started_s)
        tried: list[str] = []
        while True:
            peer = view.pick(tried, self._rng) or await self._pick_waiting(view, tried, attempts.deadline_s)
            znode = peer.znode
            tried.append(znode)
            cid = next(self._ids) & wire.U32_MAX
            attempt_s = attempts.begin(time.monotonic())
            frames = wire.request_frames(cid, body, timeout_ms=max(1, int(attempt_s * 1000)), idempotent=idempotent,
                                         headers=wire_headers)
            future: asyncio.Future[Response] = loop.create_future()
            peer.pending[cid] = future
            retry_safe = False  # may this attempt be repeated elsewhere without running twice?
            if not peer.send(frames):
                peer.pending.pop(cid, None)
                retry_safe = True
                problem = f"instance {znode} send queue full"
            else:
                self._deadlines.add(future, attempt_s)
                try:
                    response = await future
                except asyncio.CancelledError:
                    # The caller gave up (asyncio.wait_for, a cancelled task): it is not
                    # outstanding at this instance any more, for least-outstanding selection.
                    peer.pending.pop(cid, None)
                    raise
                except _PeerLost as exc:
                    problem = str(exc)
                except asyncio.TimeoutError:
                    peer.pending.pop(cid, None)
                    problem = f"no reply from instance {znode} within {attempt_s * 1000:.0f} ms"
                else:
                    result = self._decode_response(*response, znode)
                    if isinstance(result, Reply):
                        return result
                    retry_safe = self._refused(result, peer)
                    problem = str(result)
            if self._closed:  # close() failed this attempt: no retry on closed sockets (as the blocking path)
                raise errors.ClientClosedError(f"direct client closed during the request ({problem})")
            now = time.monotonic()
            if not attempts.may_repeat(now, retry_safe=retry_safe):
                raise attempts.failure(name, problem, now, retry_safe=retry_safe)

    async def _pick_waiting(self, view: _ServiceView, tried: list[str], deadline_s: float) -> _Peer:
        """The slow path of a pick: no instance is ready yet (first use, all dead)."""
        await self._wait_pickable(view, deadline_s)
        peer = view.pick(tried, self._rng)
        if peer is None:
            raise errors.NoServiceAvailable(f"no live instance of service {view.name!r}")
        return peer

    @staticmethod
    def _refused(result: errors.FabricError, peer: _Peer) -> bool:
        """An ERROR answer: True when the instance refused without running the handler (the
        request may go elsewhere); any other error is the caller's, raised as it is."""
        if not isinstance(result, (errors.ServiceOverloaded, errors.ServiceStopping)):
            raise result
        if isinstance(result, errors.ServiceStopping):
            peer.stopping(time.monotonic())
            peer.view.refresh()
        return True

    @staticmethod
    def _decode_response(header: wire.DirectHeader, frames: list[bytes], znode: str) -> Reply | errors.FabricError:
        try:
            if len(frames) - 1 != wire.expected_frames(header):
                raise errors.MalformedRequestError(f"{wire.TYPE_NAMES[header.type]} with {len(frames) - 1} body frames")
            if header.type == wire.REPLY:
                headers = wire.decode_headers(frames[2]) if header.has_headers else {}
                return Reply(frames[1], headers, znode)
            if header.type != wire.ERROR:
                raise errors.MalformedRequestError(f"unexpected {wire.TYPE_NAMES[header.type]} for a request")
            body = wire.decode_error(frames[1])
        except errors.FabricError as exc:
            return exc
        cls = errors.error_for_code(body.code)
        if cls is errors.RemoteError or body.code == errors.RemoteError.code:
            return errors.RemoteError(f"{body.type_name}: {body.message} (instance {znode})",
                                      remote_type=body.type_name, remote_message=body.message, instance=znode)
        return cls(body.message, remote_type=body.type_name, instance=znode)

    # -- scatter-gather ----------------------------------------------------------------

    async def gather(self, name: str, payload: bytes | str, *, timeout_ms: int = TIMEOUT_MS_DEFAULT,
                     headers: dict[str, bytes | str] | None = None, min_replies: int | None = None) -> GatherResult:
        """Ask every registered instance once; return what came back within ``timeout_ms``
        and name the instances that did not answer (dead, stopping, silent: ``missing``).
        Raises NoServiceAvailable only when no instance is registered. With
        ``min_replies``, fewer replies than that raise RequestTimeout (carrying the partial
        result as ``result``)."""
        ms_arg("timeout_ms", timeout_ms, TIMEOUT_MS_MAX)
        if min_replies is not None:
            count_arg("min_replies", min_replies, 0)
        body = as_bytes(payload, "payload")
        wire_headers = as_headers(headers)
        deadline = time.monotonic() + timeout_ms / 1000  # the whole call, a first registry read included
        view = await self._view(name, timeout_ms)
        try:
            await self._wait_pickable(view, deadline)  # a fresh view: let first PINGs be answered
        except errors.NoServiceAvailable:
            if not any(not p.leaving for p in view.peers.values()):
                raise  # nobody registered: nobody to report missing either
            # Registered but none answering: each is reported missing, as when others answer.
        # Every instance not known dead is asked, also those that have not answered their
        # first PING yet (their request waits in the DEALER queue until the connection is
        # up); dead ones are reported missing rather than skipped.
        targets = {z: p for z, p in view.peers.items()
                   if not p.leaving and not p.draining and p.health.state != balance.DEAD}
        missing = [z for z, p in view.peers.items() if z not in targets and not p.leaving]
        futures: dict[str, asyncio.Future[Response]] = {}
        sent: dict[str, tuple[_Peer, int]] = {}
        # Each request carries the time left, not the whole timeout_ms: the wait for a first
        # PONG above may have used some (or all: then nothing is sent, every target missing),
        # and a handler must not run on for a caller that has given up.
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            missing.extend(targets)
            targets = {}
        for znode, peer in targets.items():
            cid = next(self._ids) & wire.U32_MAX
            future: asyncio.Future[Response] = self.loop.create_future()
            peer.pending[cid] = future
            frames = wire.request_frames(cid, body, timeout_ms=left_ms, idempotent=True,
                                         headers=wire_headers)
            if peer.send(frames):
                futures[znode] = future
                sent[znode] = (peer, cid)
            else:
                peer.pending.pop(cid, None)
                missing.append(znode)
        if futures:
            try:
                await asyncio.wait(list(futures.values()), timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.CancelledError:
                for peer, cid in sent.values():  # given up: not outstanding any more (as request())
                    peer.pending.pop(cid, None)
                raise
        if self._closed:  # as request(): not "no instance answered"
            raise errors.ClientClosedError("direct client closed while gathering")
        replies: list[Reply] = []
        failed: dict[str, errors.FabricError] = {}
        for znode, future in futures.items():
            peer, cid = sent[znode]
            if not future.done():
                peer.pending.pop(cid, None)
                future.cancel()
                missing.append(znode)
                continue
            if future.exception() is not None:
                missing.append(znode)
                continue
            result = self._decode_response(*future.result(), znode)
            if isinstance(result, Reply):
                replies.append(result)
            else:
                failed[znode] = result
        gathered = GatherResult(replies, sorted(missing), failed)
        if min_replies is not None and len(replies) < min_replies:
            raise errors.RequestTimeout(
                f"service {name!r}: {len(replies)} of {min_replies} required replies within {timeout_ms} ms "
                f"(missing: {', '.join(gathered.missing) or '-'})", result=gathered)
        return gathered

    # -- serving -----------------------------------------------------------------------

    async def serve(self, name: str, handler: Handler, *, concurrency: int = CONCURRENCY_DEFAULT,
                    version: str = "", metadata: dict[str, Any] | None = None,
                    bind: str = "tcp://127.0.0.1:*", queue_max: int | None = None,
                    advertise: str | None = None) -> Service:
        """Bind, register and answer requests for ``name`` until ``service.stop()`` (or
        this client's close). Sync handlers run on up to ``concurrency`` threads of the
        instance, which send their replies themselves."""
        if self._closed:
            raise errors.ClientClosedError("direct client is closed")
        service = Service(self.zk, self.ctx, name, handler, concurrency=concurrency, version=version,
                          metadata=metadata, bind=bind, queue_max=queue_max, advertise=advertise or self.advertise,
                          security=self.security)
        await service.start()
        self._services = [s for s in self._services if not s.stopped]  # stopped ones are done with
        self._services.append(service)
        return service

    # -- pub/sub -----------------------------------------------------------------------

    async def start_publisher(self) -> Publisher:
        """Bind and register this client's PUB socket now rather than on the first publish
        (subscribers connect only after that, and PUB/SUB drops what comes before)."""
        if self._publisher is None:
            async with self._publisher_lock:
                if self._publisher is None:
                    if self._closed:
                        raise errors.ClientClosedError("direct client is closed")
                    fresh = Publisher(self.zk, self.ctx, bind=self.publisher_bind, advertise=self.advertise,
                                      security=self.security, publisher_id=self._publisher_id)
                    await fresh.start()
                    self._publisher = fresh
        return self._publisher

    async def publish(self, subject: str, payload: bytes | str, *, headers: dict[str, bytes | str] | None = None) -> None:
        """At most once, to every current subscriber; never blocks on a slow one. This
        client's own subscriptions get it in process, whether or not the PUB socket's
        subscribers have connected yet (as a NATS connection sees its own publishes)."""
        publisher = self._publisher or await self.start_publisher()
        body, header_map = as_bytes(payload, "payload"), as_headers(headers)
        sequence = publisher.publish(subject, body, header_map)
        if self._subscriptions:
            message = Message(subject, body, header_map or {}, publisher.publisher_id, sequence)
            for subscription in self._subscriptions:
                subscription.deliver_local(message)

    def publisher(self) -> Publisher | None:
        return self._publisher

    async def subscribe(self, pattern: str, handler: MessageHandler | None = None, *,
                        pending_max: int = PENDING_MAX_DEFAULT) -> Subscription:
        if self._closed:
            raise errors.ClientClosedError("direct client is closed")
        subscription = Subscription(self.zk, self.ctx, pattern, handler, pending_max=pending_max,
                                    security=self.security, own_publisher_id=self._publisher_id)
        await subscription.start()
        self._subscriptions = [s for s in self._subscriptions if not s.closed]  # closed ones are done with
        self._subscriptions.append(subscription)
        return subscription

    # -- introspection and shutdown ----------------------------------------------------

    async def services(self) -> dict[str, dict[str, registry.InstanceInfo]]:
        """Every registered service and its instances, read from ZooKeeper now."""
        return await asyncio.to_thread(registry.list_services, self.zk)

    def instances(self, name: str) -> dict[str, str]:
        """This client's view: instance -> health (connecting, alive, dead, leaving, or
        stopping: it answered SERVICE_STOPPING within the last STOPPING_HOLD_S)."""
        view = self._views.get(name)
        if view is None:
            return {}
        return {z: ("leaving" if p.leaving else "stopping" if p.draining else p.health.state)
                for z, p in view.peers.items()}

    async def close(self, *, drain_timeout_ms: int = 10_000) -> None:
        if self._closed:
            return
        for service in self._services:
            await service.stop(drain_timeout_ms=drain_timeout_ms)
        for subscription in self._subscriptions:
            await subscription.close()
        if self._publisher is not None:
            await self._publisher.close()
        self._closed = True
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        for view in self._views.values():
            view.close()
        self._views.clear()
        self._deadlines.close()
        if self.security is not None:
            self.security.close()  # every socket of its context is closed by now
        if self._own_zk:
            await asyncio.to_thread(close_client, self.zk)

    async def __aenter__(self) -> DirectClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def zookeeper_hosts(spec: str) -> str:
    """kazoo's ``host:port[,host:port][/chroot]`` from ``spec``, given with or without the
    ``zk://`` scheme. Any other scheme is refused at once: kazoo would try to resolve it as
    a host name until the connect timeout."""
    if not isinstance(spec, str):
        raise TypeError(f"zk_hosts must be a str such as 'zk://HOST:PORT', got {type(spec).__name__} {spec!r:.60}")
    if "://" not in spec:
        return spec
    try:
        hosts = Bootstrap(spec).zk
    except ValueError as exc:
        raise errors.InvalidRequestError(f"zk_hosts {exc}") from None
    if hosts is None:
        raise errors.InvalidRequestError(
            f"zk_hosts {spec!r}: the direct plane finds services through ZooKeeper, zk://HOST:PORT[/chroot]")
    return hosts


def _close_started_client(starting: asyncio.Future[KazooClient]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        _close_in_background(starting.result())


def _close_in_background(zk: KazooClient) -> None:
    """Close a ZooKeeper client without blocking the loop (or awaiting in a cancelled task)."""
    close_client_within(zk, 0.0)
