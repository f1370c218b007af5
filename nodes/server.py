"""The storage node's front door: bind, poll loop, dispatch table, shutdown.

One event loop on a zmq.Poller serves every request and replicates. All partition state
lives in one ``NodeState`` (``nodes/state.py``) owned by the loop thread; kazoo's threads
only flip flags on it and wake the loop (``nodes/session.py``). Each concern is its own
module, and this file only wires them together:

- ``DISPATCH`` maps each API key to its handler: the one place a new API is registered.
  A handler is ``(node, envelope, request) -> body | None`` (None: it answered or parked
  the request itself). An API that writes is a ``GroupCommit``: its requests are staged
  into the turn's one RocksDB WriteBatch, written once, then committed together.
- ``duties()`` lists what the loop does every turn or on a timer (the group
  coordinator's turn before the requests; after them follower ticks, expiring parked
  fetches and pending acks, the ISR check, the controller, retention, fsync): a new
  periodic duty is one more entry there, not an edit of the loop.

Per loop turn: session check (``nodes/session.py``), role changes (``nodes/roles.py``), up to
``DRAIN_MESSAGES_MAX`` client messages or ``DRAIN_BYTES_MAX`` (produce: ``nodes/produce.py``;
fetch: ``nodes/fetch.py``; replication requests: ``nodes/leader.py``; admin: ``nodes/admin.py``),
the leaders' streams and replies (``nodes/follower.py``), then the duties.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric import zk as zkl
from fabric.limits import PRODUCE_DECOMPRESSED_BYTES_MAX, REQUEST_FRAMES_MAX
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import readable_header
from fabric.transport import Connections, heartbeat, readable, recv_if_ready, unique_inproc_endpoint
from nodes import (
    admin,
    controller,
    drain,
    fetch,
    follower,
    group_api,
    leader,
    metrics,
    produce,
    queue_coordinator,
    retention,
    roles,
    session,
    storage_setup,
    strict_order,
)
from nodes.authz import NodeSecurity, next_release, release_duty
from nodes.duty import Duty
from nodes.group_coordinator import GroupCoordinator
from nodes.state import Envelope, NodeConfig, NodeState, Sockets

log = logging.getLogger("fabric.node")

DRAIN_MESSAGES_MAX = 256  # client messages handled per loop turn before writing, and bytes (16 MiB
DRAIN_BYTES_MAX = 4 * 1024 * 1024  # WriteBatches cost ~40 % more node CPU: BENCHMARKS.md, growth)
POLL_INTERVAL_MS_MAX = 100  # the loop wakes at least this often to check stop and timers
MESSAGE_BYTES_MAX = 256 * 1024 * 1024  # a larger ZeroMQ message is dropped by the socket
ROUTER_HWM_MESSAGES = 10_000  # answers queued to one client (their bytes: nodes/reply_budget.py)
CLIENT_REQUESTS_QUEUED_MAX = 8  # then ZeroMQ stops reading that client: DESIGN.md, "What a node holds in memory"

Handler = Callable[[NodeState, Envelope, apis.Message], "dict[str, Any] | None"]


@dataclass(frozen=True, eq=False)  # hashed by identity: it keys the turn's staged requests
class GroupCommit:
    """An API whose requests write: ``stage`` each into the turn's WriteBatch, then, after
    the one write, ``commit`` them all (answer, park, publish)."""

    stage: Callable[[NodeState, Any, Envelope, apis.Message], Any]
    commit: Callable[[NodeState, list[tuple[Envelope, apis.Message, Any]]], None]


DISPATCH: dict[int, Handler | GroupCommit] = {
    ApiKey.PRODUCE: GroupCommit(produce.stage, produce.commit),
    ApiKey.FETCH: fetch.handle_fetch,
    ApiKey.METADATA: admin.handle_metadata,
    ApiKey.LIST_OFFSETS: admin.handle_list_offsets,
    **admin.TOPIC_APIS,  # CREATE_TOPIC, DELETE_TOPIC, CREATE_PARTITIONS, ALTER_TOPIC_CONFIGS
    ApiKey.DESCRIBE_TOPICS: admin.handle_describe_topics,
    ApiKey.INIT_PRODUCER_ID: admin.handle_init_producer_id,
    ApiKey.REPLICA_ACK: leader.handle_replica_ack,
    ApiKey.OFFSETS_FOR_LEADER_EPOCH: leader.handle_offsets_for_leader_epoch,
    **controller.APIS,  # ELECT_LEADERS, REASSIGN_PARTITION, DESCRIBE_REPLICAS
    ApiKey.DRAIN_NODE: drain.handle_drain,
    **{key: group_api.handle for key in sorted(group_api.GROUP_APIS)},
    **{key: queue_coordinator.handle for key in sorted(queue_coordinator.QUEUE_APIS)},
}
DISPATCH[ApiKey.API_VERSIONS] = functools.partial(admin.handle_api_versions,
                                                  served=frozenset(DISPATCH) | {ApiKey.API_VERSIONS})

# Called, in order, with the partitions whose high watermark moved or took new data.
CHANGE_LISTENERS: list[Callable[[NodeState, set[tuple[str, int]]], None]] = [
    fetch.wake_parked,  # readers before writers: docs/DESIGN.md, "Readers first"
    produce.complete_pending,
]


def sync_storage(node: NodeState, _now: float) -> None:
    """fsync=interval: flush the WAL; always: checkpoint the high watermarks."""
    if node.config.fsync == "interval":
        node.store.sync_wal()
    for plog in node.logs.values():
        plog.checkpoint_high_watermark()


def duties(config: NodeConfig) -> list[Duty]:
    """The loop's duties, in the order they run (within before and after the requests)."""
    return [
        Duty("group coordinator", group_api.tick, before_requests=True),
        Duty("follower tick", follower.tick),
        Duty("expire parked fetches", fetch.expire_parked, deadline=fetch.next_deadline),
        Duty("expire pending acks", produce.expire_pending, deadline=produce.next_deadline),
        Duty("ISR check", leader.check_isr, leader.ISR_CHECK_INTERVAL_S),
        Duty("drain", drain.tick, drain.DRAIN_CHECK_INTERVAL_S),
        Duty("controller", controller.tick, controller.CONTROLLER_RECONCILE_INTERVAL_S, is_due=controller.is_due),
        Duty("retention", retention.run, config.retention_check_interval_ms / 1000.0),
        Duty("storage sync", sync_storage, config.fsync_interval_ms / 1000.0),
        Duty("metrics snapshot", metrics.snapshot_duty, metrics.SNAPSHOT_INTERVAL_S),
        Duty("throttled responses", release_duty, deadline=next_release),
        Duty("sequencer grants", produce.stage_granted, deadline=produce.next_grant_deadline),
        Duty("strict-order ticks", strict_order.tick, strict_order.TICK_CHECK_INTERVAL_S),
        Duty("queue coordinator", queue_coordinator.tick, deadline=queue_coordinator.next_deadline),
    ]


def client_router(ctx: zmq.Context[Any], heartbeat_timeout_ms: int) -> zmq.Socket[Any]:
    """The client-facing ROUTER with its bounds: requests queued per client, answers per client."""
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, CLIENT_REQUESTS_QUEUED_MAX)
    router.setsockopt(zmq.SNDHWM, ROUTER_HWM_MESSAGES)
    router.setsockopt(zmq.MAXMSGSIZE, MESSAGE_BYTES_MAX)
    heartbeat(router, heartbeat_timeout_ms)  # frees what dead clients were sent
    return router


class Node:
    """One storage node: its sockets, its ``NodeState``, and the loop that serves them."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        # Secure mode starts first: its ZAP handler must run before any CURVE socket binds,
        # and a missing key file stops the node before it creates its data dir.
        self.authz = NodeSecurity.start(config, self.ctx) if config.security == "curve" else None
        store = storage_setup.open_store(config)
        zk: KazooClient = zkl.make_client(config.zk, config.session_timeout_ms / 1000.0,
                                          **(self.authz.zk_kwargs() if self.authz else {}))
        routing = zkl.RoutingCache(zk, on_change=lambda what: session.on_routing_change(self.state, what))
        self.state = NodeState(config, store, zk, routing, self._bind())
        self.state.authz = self.authz
        self.state.address = self._bind_socket(self.state.sockets.router, config.port)
        self.state.replication_address = self._bind_socket(self.state.sockets.pub, config.replication_port)
        self.state.change_listeners.extend(CHANGE_LISTENERS)
        self.state.groups = GroupCoordinator(config.node_id, self.state.address, routing, self.state.send, self.ctx,
                                             self.state.sockets.poller, serving=self.state.may_coordinate,
                                             routing_current=self.state.session_ok, delete_below=self.state.delete_below,
                                             offsets_retention_ms=config.offsets_retention_ms,
                                             security=self.authz.client if self.authz else None,
                                             caller=self.authz.caller if self.authz else None)
        self.handlers = metrics.instrument(dict(DISPATCH))
        if self.authz is not None:
            self.authz.wrap_handlers(self.handlers)  # METADATA per topic; all-topic answers filtered
        all_duties = duties(config)
        self.duties, self.duties_before = all_duties, [d for d in all_duties if d.before_requests]
        self.duties_after = [d for d in all_duties if not d.before_requests]
        self._timed = [d for d in all_duties if d.interval_s > 0.0]
        self._deadlines = [d.deadline for d in all_duties if d.deadline is not None]

    # -- setup ----------------------------------------------------------------------------
    def _bind(self) -> Sockets:
        router = client_router(self.ctx, self.config.client_heartbeat_timeout_ms)
        pub = self.ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self.config.replication_hwm)
        if self.config.replication_buffer_bytes:
            pub.setsockopt(zmq.SNDBUF, self.config.replication_buffer_bytes)
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.config.replication_hwm)
        if self.config.replication_buffer_bytes:
            sub.setsockopt(zmq.RCVBUF, self.config.replication_buffer_bytes)
        sub.setsockopt(zmq.MAXMSGSIZE, MESSAGE_BYTES_MAX)
        wake_endpoint = unique_inproc_endpoint("node-wake")
        wake_pull = self.ctx.socket(zmq.PULL)
        wake_pull.bind(wake_endpoint)
        wake_push = self.ctx.socket(zmq.PUSH)
        wake_push.setsockopt(zmq.LINGER, 0)
        wake_push.connect(wake_endpoint)
        poller = zmq.Poller()
        for sock in (router, sub, wake_pull):
            poller.register(sock, zmq.POLLIN)
        # Follower -> leader requests (truncation, catch-up fetch, acks) share the poller,
        # so a leader's reply wakes this loop like a client request does.
        # The node's own key in secure mode; never a user's $FABRIC_KEY_FILE.
        replica_conns = Connections(self.ctx, poller=poller, security=self.authz.client if self.authz else None)
        sockets = Sockets(router, pub, sub, wake_pull, wake_push, poller, replica_conns)
        if self.authz is not None:
            self.authz.secure_sockets(sockets)
        return sockets

    def _bind_socket(self, sock: zmq.Socket[Any], port: int) -> str:
        try:
            if port:
                sock.bind(f"tcp://{self.config.host}:{port}")
            else:
                port = sock.bind_to_random_port(f"tcp://{self.config.host}")
        except zmq.ZMQError as exc:  # a port in use, a host that is not this machine's
            raise errors.ConfigError(f"cannot listen on tcp://{self.config.host}:{port or '*'}: {exc.strerror} "
                                     "(options host, port, replication_port)") from None
        return f"tcp://{self.config.host}:{port}"

    # -- main loop -------------------------------------------------------------------------
    def start(self) -> None:
        """Connect to ZooKeeper, register, take up roles (before run()); a failed start ends its session."""
        with session.closed_on_failure(self.state):
            session.start(self.state)
            roles.apply_roles(self.state)

    def run(self) -> None:
        node = self.state
        sockets = node.sockets
        log.info("node %d serving on %s (replication %s)", node.node_id, node.address, node.replication_address)
        now = time.monotonic()
        for duty in self.duties:
            duty.next_s = now + duty.interval_s
        last_turn = now
        try:
            while not node.stopping.is_set():
                timeout_ms = self._poll_timeout_ms()
                events = dict(sockets.poller.poll(timeout_ms))
                now = time.monotonic()
                session.note_turn(node, now, last_turn, timeout_ms)
                last_turn = now
                if sockets.wake_pull in events:
                    while readable(sockets.wake_pull):
                        sockets.wake_pull.recv(zmq.NOBLOCK)
                node.zk_worker.run_completions()
                session.check(node, now)
                if node.routing_dirty and not node.session_lost:
                    # (While the session is lost the cached map may still name us leader:
                    # registering again re-reads it first.)
                    roles.apply_roles(node)
                self._run_duties(self.duties_before, time.monotonic())
                if sockets.router in events:
                    self._drain_requests()
                if sockets.sub in events or node.sub_disconnect_pending:
                    follower.drain_stream(node)
                follower.handle_replies(node)
                self._run_duties(self.duties_after, time.monotonic())
                if node.store.failure is not None:  # a failed write that a handler caught and answered
                    raise node.store.failure  # the node stops all the same (nodes/storage_failure.py)
        finally:
            self._shutdown()

    def _run_duties(self, duties_due: list[Duty], now: float) -> None:
        for duty in duties_due:
            if duty.interval_s <= 0.0:
                duty.run(self.state, now)
            elif now >= duty.next_s or (duty.is_due is not None and duty.is_due(self.state)):
                duty.run(self.state, now)
                duty.next_s = now + duty.interval_s

    def _poll_timeout_ms(self) -> int:
        now = time.monotonic()
        deadline = min([now + POLL_INTERVAL_MS_MAX / 1000.0, *(duty.next_s for duty in self._timed)])
        for source in self._deadlines:
            due = source(self.state)
            if due is not None and due < deadline:
                deadline = due
        return math.ceil(max(0.0, (deadline - now) * 1000.0))  # up: a deadline < 1 ms away must not spin

    def stop(self) -> None:
        self.state.stopping.set()
        self.state.wake()

    def _shutdown(self) -> None:
        node = self.state
        log.info("node %d stopping", node.node_id)
        node.routing.close()
        node.zk_worker.stop(timeout_s=session.CLOSE_SESSION_TIMEOUT_S)  # its job may wait on a paused ZooKeeper
        session.close_within(node)
        node.sockets.replica_conns.close()
        if node.groups is not None:
            node.groups.close()
        strict_order.close(node)
        queue_coordinator.close(node)
        s = node.sockets
        for sock in (s.router, s.pub, s.sub, s.wake_pull, s.wake_push):
            sock.close(linger=0)
        if node.store.failure is None:  # after a failed write, nothing more is written
            for plog in node.logs.values():
                plog.checkpoint_high_watermark()
        node.store.close()
        if self.authz is not None:
            self.authz.close()

    # -- requests --------------------------------------------------------------------------
    def _drain_requests(self) -> None:
        node = self.state
        router = node.sockets.router
        wb, drained_bytes = None, 0
        node.turn_decompressed_bytes = 0
        staged: dict[GroupCommit, list[tuple[Envelope, apis.Message, Any]]] = {}
        for _ in range(DRAIN_MESSAGES_MAX):
            # Small lz4 frames can claim much more than their wire bytes: a turn of many
            # one-bomb requests is bounded by what it decompressed, not only by DRAIN_BYTES_MAX.
            if drained_bytes >= DRAIN_BYTES_MAX or node.turn_decompressed_bytes >= PRODUCE_DECOMPRESSED_BYTES_MAX:
                break
            if not readable(router):
                break
            frames = recv_if_ready(router)
            if frames is None:
                break
            drained_bytes += sum(len(f) for f in frames)
            envelope, message = self._split_envelope(frames)
            if message is None:
                continue
            try:
                request = apis.decode_request([f.buffer if i >= 2 else f.bytes for i, f in enumerate(message)])
            except errors.FabricError as exc:
                node.send_error(envelope, getattr(exc, "header", None), exc)
                continue
            except Exception as exc:  # a decoder bug must not stop the node: answer and go on
                log.exception("decoding a request failed")
                node.send_error(envelope, None, errors.UnknownServerError(f"{type(exc).__name__}: {exc}"))
                continue
            handler = self.handlers.get(request.header.api_key)  # None: UNKNOWN_API to all (_reply), not 80
            if handler is not None and self.authz is not None and not self.authz.admit(node, envelope, message[0], request):
                continue  # refused and answered: no handler sees it
            if isinstance(handler, GroupCommit):
                if wb is None:
                    wb = node.store.new_write_batch()
                try:
                    staged.setdefault(handler, []).append((envelope, request, handler.stage(node, wb, envelope, request)))
                except errors.FabricError as exc:
                    node.send_error(envelope, request.header, exc)
                except Exception as exc:  # a handler bug: this request fails, the node keeps serving
                    log.exception("request %s failed", ApiKey(request.header.api_key).name)
                    node.send_error(envelope, request.header, errors.UnknownServerError(f"{type(exc).__name__}: {exc}"))
                continue
            if wb is not None:
                # Reads and admin calls must see what earlier requests in this turn wrote.
                self._commit(wb, staged)
                wb, staged = None, {}
            self._reply(handler, envelope, request)
        if wb is not None:
            self._commit(wb, staged)

    def _split_envelope(self, frames: list[Any]) -> tuple[Envelope, list[Any] | None]:
        # DEALER peers send [id, header, body...]; REQ peers add an empty delimiter.
        if len(frames) >= 2 and len(frames[1]) == 0:
            envelope, message = frames[:2], frames[2:]
        else:
            envelope, message = frames[:1], frames[1:]
        if len(message) > REQUEST_FRAMES_MAX:
            # Echo the client's header when it reads, so the refusal matches its request.
            self.state.send_error(envelope, readable_header(message[0].bytes), errors.MalformedRequestError(
                f"{len(message)} frames exceed REQUEST_FRAMES_MAX={REQUEST_FRAMES_MAX}"))
            return envelope, None
        return envelope, message

    def _commit(self, wb: Any, staged: dict[GroupCommit, list[tuple[Envelope, apis.Message, Any]]]) -> None:
        """Write the turn's staged requests once, then let each API answer or park them."""
        node = self.state
        node.write_staged(wb, [item for items in staged.values() for item in items])
        for handler, items in staged.items():
            handler.commit(node, items)

    def _reply(self, handler: Handler | None, envelope: Envelope, request: apis.Message) -> None:
        node = self.state
        api = request.header.api_key
        try:
            if handler is None:  # decode_request already refused unknown keys; this guards new ones
                raise errors.UnknownApiError(f"api {api} has no handler")
            body = handler(node, envelope, request)
            if body is not None:
                node.send_response(envelope, request.header, body)
        except errors.FabricError as exc:
            node.send_error(envelope, request.header, exc)
        except Exception as exc:
            log.exception("request %s failed", ApiKey(api).name)
            node.send_error(envelope, request.header, errors.UnknownServerError(f"{type(exc).__name__}: {exc}"))
