"""The storage node: one event loop on a zmq.Poller serves every request and replicates.

All partition state is owned by the loop thread. Kazoo's threads never touch it: they
mark the routing map dirty or flip a session flag and wake the loop through an inproc
socket; the loop decides what to host and which role to play, in one place
(``_apply_roles``).

Per loop turn the node drains up to ``DRAIN_MESSAGES_MAX`` client messages, stages every
produced batch into one RocksDB WriteBatch (group commit), writes it once, publishes the
batches to followers, answers acks=0/1 producers, parks acks=all producers until the high
watermark passes their batches, and wakes the long-poll fetches the new data satisfies.
As a follower it applies the leader's PUB stream, falling back to FETCH on any gap.
"""

from __future__ import annotations

import logging
import os
import signal
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from fabric import errors
from fabric import zk as zkl
from fabric.limits import (
    FETCH_BYTES_MAX,
    FETCH_WAIT_MS_MAX,
    FSYNC_INTERVAL_MS_DEFAULT,
    PARKED_FETCHES_MAX,
    PRODUCE_TIMEOUT_MS_MAX,
    REQUEST_FRAMES_MAX,
    RETENTION_CHECK_INTERVAL_MS_DEFAULT,
)
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import Header
from fabric.protocol.tags import TagFilter
from fabric.transport import Connections, unique_inproc_endpoint
from nodes import controller
from nodes.group_coordinator import GroupCoordinator
from nodes.log import PartitionLog, Store, partition_key
from nodes.producer_state import DUPLICATE
from nodes.replication import (
    FETCHING,
    FOLLOWER,
    LEADER,
    STREAMING,
    TRUNCATING,
    FollowerReplica,
    LeaderReplica,
    decide_role,
)
from nodes.tag_filter import read_filtered

log = logging.getLogger("fabric.node")

DRAIN_MESSAGES_MAX = 256  # client messages handled per loop turn before writing
SUB_MESSAGES_MAX = 512  # replicated batches applied per loop turn before acking
POLL_INTERVAL_MS_MAX = 100  # the loop wakes at least this often to check stop and timers
REGISTER_WAIT_S = 30.0  # how long a restarted node waits for its old session's znode to expire
PAUSE_SUSPECT_S = 1.0  # a loop turn this late means we were paused: check the session first
REPLICA_ACK_INTERVAL_S = 0.1  # followers report their log end at least this often
REPLICA_STALL_S = 0.3  # no stream progress this long while the leader is ahead: fetch instead
REPLICA_REQUEST_TIMEOUT_S = 2.0  # a truncation or fetch request to the leader is resent after this
REPLICA_FETCH_BYTES_MAX = 8 * 1024 * 1024
ISR_CHECK_INTERVAL_S = 0.1
CONTROLLER_RECONCILE_INTERVAL_S = 2.0
PUB_HWM_MESSAGES = 1_000  # beyond this PUB drops; followers notice the gap and fetch
ZK_OP_TIMEOUT_S = 5.0
_REPLICA_META = struct.Struct("<ii")  # leader epoch, leader node id


@dataclass
class NodeConfig:
    node_id: int
    zk: str
    data_dir: str
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port and publishes it in ZooKeeper
    replication_port: int = 0
    fsync: str = "none"
    fsync_interval_ms: int = FSYNC_INTERVAL_MS_DEFAULT
    retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS_DEFAULT
    session_timeout_ms: int = 6_000
    replica_lag_max_ms: int = 5_000
    replication_hwm: int = PUB_HWM_MESSAGES  # messages queued per follower before PUB drops
    replication_buffer_bytes: int = 0  # kernel socket buffer of PUB/SUB; 0 lets the OS size it


@dataclass
class ParkedFetch:
    envelope: list[Any]
    header: Header
    body: dict[str, Any]
    deadline: float  # monotonic seconds
    keys: set[tuple[str, int]] = field(default_factory=set)


@dataclass
class ProduceOutcome:
    results: list[dict[str, Any]] = field(default_factory=list)
    appended: list[tuple[tuple[str, int], bytes]] = field(default_factory=list)  # to publish
    waits: dict[int, tuple[tuple[str, int], int]] = field(default_factory=dict)  # result index -> (tp, end offset)


@dataclass
class PendingProduce:
    """An acks=all produce waiting for the high watermark to pass its batches."""

    envelope: list[Any]
    header: Header
    results: list[dict[str, Any]]
    waits: dict[int, tuple[tuple[str, int], int]]  # result index -> (tp, offset the HW must reach)
    deadline: float


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.store = Store(os.path.join(config.data_dir, "rocksdb"), fsync=config.fsync)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.configs: dict[str, zkl.TopicConfig] = {}
        self.states: dict[tuple[str, int], zkl.PartitionState] = {}
        self.leaders: dict[tuple[str, int], LeaderReplica] = {}
        self.followers: dict[tuple[str, int], FollowerReplica] = {}
        self.pkeys: dict[bytes, tuple[str, int]] = {}
        self.known_topics: set[str] = set()
        self.parked: list[ParkedFetch] = []
        self.pending: list[PendingProduce] = []
        self.replica_requests: dict[int, tuple[str, Any]] = {}
        self._subscribed: set[bytes] = set()
        self._sub_connected: set[str] = set()
        self._stopping = threading.Event()
        self._routing_dirty = True
        self._wake_lock = threading.Lock()
        self._session_file_lock = threading.Lock()
        self._zk_ok = threading.Event()
        self._session_lost = False
        self._verify_session = False
        self._is_controller = False
        self._controller_dirty = True
        self._producer_ids_next = 0
        self._producer_ids_end = 0
        self._last_ack_sent_s = 0.0
        self.address = ""
        self.replication_address = ""
        self.zk = KazooClient(hosts=config.zk, timeout=config.session_timeout_ms / 1000.0)
        self.routing = zkl.RoutingCache(self.zk, on_change=self._on_routing_change)
        self._bind()
        self.groups = GroupCoordinator(self.node_id, self.address, self.routing, self._send, self.ctx, self.poller,
                                       serving=self._session_ok)

    # -- setup ----------------------------------------------------------------------------
    def _bind(self) -> None:
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, 10_000)
        self.router.setsockopt(zmq.SNDHWM, 10_000)
        self.router.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
        self.address = self._bind_socket(self.router, self.config.port)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, self.config.replication_hwm)
        if self.config.replication_buffer_bytes:
            self.pub.setsockopt(zmq.SNDBUF, self.config.replication_buffer_bytes)
        self.replication_address = self._bind_socket(self.pub, self.config.replication_port)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, self.config.replication_hwm)
        if self.config.replication_buffer_bytes:
            self.sub.setsockopt(zmq.RCVBUF, self.config.replication_buffer_bytes)
        self.sub.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
        wake_endpoint = unique_inproc_endpoint("node-wake")
        self._wake_pull = self.ctx.socket(zmq.PULL)
        self._wake_pull.bind(wake_endpoint)
        self._wake_push = self.ctx.socket(zmq.PUSH)
        self._wake_push.setsockopt(zmq.LINGER, 0)
        self._wake_push.connect(wake_endpoint)
        self.poller = zmq.Poller()
        for sock in (self.router, self.sub, self._wake_pull):
            self.poller.register(sock, zmq.POLLIN)
        # Follower -> leader requests (truncation, catch-up fetch, acks) share the poller,
        # so a leader's reply wakes this loop like a client request does.
        self.replica_conns = Connections(self.ctx, poller=self.poller)

    def _bind_socket(self, sock: zmq.Socket[Any], port: int) -> str:
        if port:
            sock.bind(f"tcp://{self.config.host}:{port}")
        else:
            port = sock.bind_to_random_port(f"tcp://{self.config.host}")
        return f"tcp://{self.config.host}:{port}"

    def _wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_push.send(b"w", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a wake is already queued, or we are closing

    def _on_routing_change(self, what: str) -> None:
        self._routing_dirty = True
        if what in ("nodes", "controller") or what.startswith("partition:"):
            self._controller_dirty = True
        self._wake()

    def _on_zk_state(self, state: str) -> None:
        # Runs on kazoo's thread: only flip flags and wake the loop.
        if state == KazooState.CONNECTED:
            self._zk_ok.set()
            self._record_session()
        else:
            self._zk_ok.clear()
            if state == KazooState.LOST:
                self._session_lost = True
        self._wake()

    def _record_session(self) -> None:
        """Write the ZooKeeper session id and password to the data dir (mode 0600).

        Operators can see which session a node holds; fault tests use it to expire the
        session from outside, as kazoo's own test harness does (``expire_session``).
        """
        try:
            session_id, password = self.zk.client_id
        except (TypeError, ValueError):
            return
        path = os.path.join(self.config.data_dir, "zk_session.json")
        with self._session_file_lock:  # kazoo's thread and ours may both get here
            tmp = path + ".tmp"
            try:
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                    f.write(f'{{"session_id": "{session_id:x}", "password": "{password.hex()}"}}')
                os.replace(tmp, path)
            except OSError as exc:
                log.warning("could not record the ZooKeeper session: %s", exc)

    def _register(self) -> None:
        info = zkl.NodeInfo(
            node_id=self.node_id,
            address=self.address,
            replication_address=self.replication_address,
            host=self.config.host,
            pid=os.getpid(),
            started_ms=int(time.time() * 1000),
        )
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                self.zk.create(zkl.node_path(self.node_id), info.encode(), ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                # Our previous incarnation's session has not expired yet; it will.
                try:
                    _, stat = self.zk.get(zkl.node_path(self.node_id))
                    if stat.owner_session_id == self.zk.client_id[0]:
                        return
                except NoNodeError:
                    continue
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node id {self.node_id} is registered by another live process") from None
                time.sleep(0.2)
    def _reconcile_local_data(self) -> None:
        """At startup, wipe partitions whose topic was deleted (or re-created) while away."""
        topics: dict[str, zkl.TopicConfig] = {}
        for name in self.zk.get_children(zkl.TOPICS):
            try:
                raw, _ = self.zk.get(zkl.topic_path(name))
            except NoNodeError:
                continue
            topics[name] = zkl.TopicConfig.decode(raw)
        it = self.store.db.iter()
        it.seek(b"m")
        stale: list[tuple[str, int]] = []
        while it.valid():
            key = it.key()
            if not key.startswith(b"m"):
                break
            if key.endswith(b"c") and len(key) >= 7:
                topic = key[1:-6].decode("utf-8", "replace")
                partition = int.from_bytes(key[-5:-1], "big")
                config = topics.get(topic)
                if config is None or partition >= config.partitions:
                    stale.append((topic, partition))
            it.next()
        del it
        for topic, partition in stale:
            log.info("wiping local data of deleted partition %s/%d", topic, partition)
            PartitionLog(self.store, topic, partition, incarnation=-1).wipe()

    # -- hosting and roles -----------------------------------------------------------------
    def _apply_roles(self) -> None:
        """Open logs for hosted partitions and make this node leader, follower or neither
        of each, as the routing map says. The only place roles change."""
        self._routing_dirty = False
        topics = self.routing.topics()
        seen: set[tuple[str, int]] = set()
        for name, route in topics.items():
            self.configs[name] = route.config
            for p, state in route.partitions.items():
                if self.node_id not in state.replicas:
                    continue
                tp = (name, p)
                seen.add(tp)
                if tp not in self.logs:
                    self.logs[tp] = PartitionLog(self.store, name, p, route.config.created_ms)
                    self.pkeys[partition_key(name, p)] = tp
                old = self.states.get(tp)
                if old is not None and old.version > state.version:
                    continue  # we already hold a newer state (one we wrote ourselves)
                self.states[tp] = state
                role = decide_role(state, self.node_id)
                if role == LEADER:
                    leader = self.leaders.get(tp)
                    if leader is None or leader.epoch != state.leader_epoch:
                        self._become_leader(tp, state)
                    elif old is not None and old.version < state.version:
                        leader.isr = set(state.isr) | {self.node_id}
                elif role == FOLLOWER:
                    follower = self.followers.get(tp)
                    if follower is None or follower.epoch != state.leader_epoch or follower.leader_id != state.leader:
                        self._become_follower(tp, state)
                else:
                    self._drop_roles(tp)
        for tp in [tp for tp in self.logs if tp not in seen]:
            self._drop_roles(tp)
            if tp[0] not in topics and tp[0] in self.known_topics:
                log.info("topic %s deleted: wiping %s/%d", tp[0], *tp)
                self.logs.pop(tp).wipe()
                self.states.pop(tp, None)
        self.known_topics = set(topics)
        # Stop reconnecting to replication streams of processes that are gone (a restarted
        # node publishes on a new port).
        live = {n.replication_address for n in self.routing.nodes().values()}
        for address in self._sub_connected - live:
            try:
                self.sub.disconnect(address)
            except zmq.ZMQError:
                pass
            self._sub_connected.discard(address)

    def _become_leader(self, tp: tuple[str, int], state: zkl.PartitionState) -> None:
        self._drop_roles(tp)
        plog = self.logs[tp]
        plog.assign_epoch(state.leader_epoch)
        self.leaders[tp] = LeaderReplica.start(self.node_id, state, plog.log_end_offset, time.monotonic())
        log.info("leader of %s/%d at epoch %d from offset %d, isr %s",
                 *tp, state.leader_epoch, plog.log_end_offset, list(state.isr))
        self._update_high_watermark(tp)

    def _become_follower(self, tp: tuple[str, int], state: zkl.PartitionState) -> None:
        self._drop_roles(tp)
        self.followers[tp] = FollowerReplica(state.leader, state.leader_epoch, TRUNCATING)
        pkey = partition_key(*tp)
        if pkey not in self._subscribed:
            self.sub.setsockopt(zmq.SUBSCRIBE, pkey)
            self._subscribed.add(pkey)
        log.info("follower of %s/%d: leader %d epoch %d", *tp, state.leader, state.leader_epoch)

    def _drop_roles(self, tp: tuple[str, int]) -> None:
        if self.leaders.pop(tp, None) is not None:
            self._complete_pending({tp})  # their waits now fail with NOT_LEADER
        follower = self.followers.pop(tp, None)
        if follower is not None:
            self.replica_requests.pop(follower.request_in_flight, None)
            pkey = partition_key(*tp)
            if pkey in self._subscribed:
                self.sub.setsockopt(zmq.UNSUBSCRIBE, pkey)
                self._subscribed.discard(pkey)

    def _step_down_everywhere(self, why: str) -> None:
        if self.leaders:
            log.warning("stepping down from %d leaderships: %s", len(self.leaders), why)
        for tp in list(self.leaders):
            self._drop_roles(tp)
            self.states.pop(tp, None)  # forget it, so the next routing view is applied afresh

    def _leader_log(self, topic: str, partition: int) -> tuple[PartitionLog, LeaderReplica, zkl.TopicConfig]:
        tp = (topic, partition)
        leader = self.leaders.get(tp)
        if leader is not None:
            return self.logs[tp], leader, self.configs[topic]
        route = self.routing.topic(topic)
        if route is None:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}")
        state = route.partitions.get(partition)
        if state is None:
            if 0 <= partition < route.config.partitions:
                raise errors.LeaderNotAvailableError(f"{topic}/{partition} has no state yet")
            raise errors.UnknownTopicOrPartitionError(
                f"topic {topic!r} has no partition {partition} (it has {route.config.partitions})"
            )
        if state.leader == self.node_id:
            raise errors.NodeNotReadyError(f"{topic}/{partition} is becoming led by node {self.node_id}")
        if state.leader < 0:
            raise errors.LeaderNotAvailableError(f"{topic}/{partition} has no live in-sync replica to lead it")
        raise errors.NotLeaderError(f"node {self.node_id} does not lead {topic}/{partition} (leader {state.leader})")

    def _session_ok(self) -> bool:
        return self._zk_ok.is_set() and not self._verify_session and not self._session_lost

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        self.zk.add_listener(self._on_zk_state)
        self.zk.start(timeout=30)
        self._zk_ok.set()
        self._record_session()
        zkl.ensure_layout(self.zk)
        self._reconcile_local_data()
        self.routing.start()
        self._register()
        self._apply_roles()
        log.info("node %d serving on %s (replication %s)", self.node_id, self.address, self.replication_address)
        now = time.monotonic()
        next_retention = now + self.config.retention_check_interval_ms / 1000.0
        next_fsync = now + self.config.fsync_interval_ms / 1000.0
        next_isr_check = now + ISR_CHECK_INTERVAL_S
        next_reconcile = now
        last_turn = now
        try:
            while not self._stopping.is_set():
                timeout_ms = self._poll_timeout_ms(min(next_retention, next_fsync, next_isr_check))
                events = dict(self.poller.poll(timeout_ms))
                now = time.monotonic()
                if now - last_turn > PAUSE_SUSPECT_S + timeout_ms / 1000.0:
                    # We were stopped (SIGSTOP, a long GC, a swapped-out host): the world may
                    # have moved on. Answer nobody until ZooKeeper confirms our session.
                    log.warning("loop stalled for %.1f s; verifying the ZooKeeper session", now - last_turn)
                    self._verify_session = True
                last_turn = now
                if self._wake_pull in events:
                    while True:
                        try:
                            self._wake_pull.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                self._check_session()
                if self._routing_dirty:
                    self._apply_roles()
                self.groups.tick()  # before requests: it must know what it coordinates now
                if self.router in events:
                    self._drain_requests()
                if self.sub in events:
                    self._drain_replication_stream()
                self._handle_replica_replies()
                now = time.monotonic()
                self._follower_tick(now)
                self._expire_parked(now)
                self._expire_pending(now)
                if now >= next_isr_check:
                    self._check_isr(now)
                    next_isr_check = now + ISR_CHECK_INTERVAL_S
                if self._controller_dirty or now >= next_reconcile:
                    self._controller_tick()
                    next_reconcile = now + CONTROLLER_RECONCILE_INTERVAL_S
                if now >= next_retention:
                    self._apply_retention()
                    next_retention = now + self.config.retention_check_interval_ms / 1000.0
                if now >= next_fsync:
                    if self.config.fsync == "interval":
                        self.store.sync_wal()
                    for plog in self.logs.values():
                        plog.checkpoint_high_watermark()
                    next_fsync = now + self.config.fsync_interval_ms / 1000.0
        finally:
            self._shutdown()

    def _check_session(self) -> None:
        if self._session_lost:
            self._step_down_everywhere("ZooKeeper session lost")
            self._is_controller = False
            if self._zk_ok.is_set():
                # kazoo reconnected with a new session: register again and re-read everything.
                self._session_lost = False
                self._verify_session = False
                self._register()
                self.routing.resync()
                self._routing_dirty = True
            return
        if self._verify_session and self._zk_ok.is_set():
            try:
                _, stat = self.zk.get_async(zkl.node_path(self.node_id)).get(timeout=ZK_OP_TIMEOUT_S)
                owned = stat.owner_session_id == self.zk.client_id[0]
            except Exception as exc:  # expired session, connection loss, timeout: all mean "not sure"
                log.warning("session check failed: %s", exc)
                owned = False
            if owned:
                self.routing.resync()
                self._verify_session = False
                self._routing_dirty = True
            else:
                self._step_down_everywhere("could not confirm our ZooKeeper session after a stall")

    def stop(self) -> None:
        self._stopping.set()
        self._wake()

    def _shutdown(self) -> None:
        log.info("node %d stopping", self.node_id)
        self.routing.close()
        try:
            zkl.close_client(self.zk)
        except Exception:  # already gone; nothing to clean
            pass
        self.replica_conns.close()
        self.groups.close()
        for sock in (self.router, self.pub, self.sub, self._wake_pull, self._wake_push):
            sock.close(linger=0)
        for plog in self.logs.values():
            plog.checkpoint_high_watermark()
        self.store.close()

    def _poll_timeout_ms(self, timer_deadline: float) -> int:
        deadline = timer_deadline
        for parked in self.parked:
            deadline = min(deadline, parked.deadline)
        for pending in self.pending:
            deadline = min(deadline, pending.deadline)
        wait_ms = (deadline - time.monotonic()) * 1000.0
        return int(max(0.0, min(wait_ms, POLL_INTERVAL_MS_MAX)))

    def _send(self, envelope: list[Any], frames: list[Any]) -> None:
        try:
            self.router.send_multipart(envelope + frames, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as exc:
            # The client went away (EHOSTUNREACH) or stopped reading (EAGAIN): it will
            # time out and retry; the write itself, if any, is already durable.
            log.debug("dropping a reply: %s", exc)

    def _drain_requests(self) -> None:
        wb = None
        staged: list[tuple[list[Any], apis.Message, ProduceOutcome]] = []
        for _ in range(DRAIN_MESSAGES_MAX):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            envelope, message = self._split_envelope(frames)
            if message is None:
                continue
            try:
                request = apis.decode_request([f.buffer if i >= 2 else f.bytes for i, f in enumerate(message)])
            except errors.FabricError as exc:
                header = getattr(exc, "header", None)
                self._send_error(envelope, header, exc)
                continue
            api = request.header.api_key
            if api == ApiKey.PRODUCE:
                if wb is None:
                    wb = self.store.new_write_batch()
                try:
                    staged.append((envelope, request, self._handle_produce(request, wb)))
                except errors.FabricError as exc:
                    self._send_error(envelope, request.header, exc)
                continue
            if wb is not None:
                # Reads and admin calls must see what earlier requests in this turn wrote.
                self._commit(wb, staged)
                wb, staged = None, []
            self._handle_other(envelope, request)
        if wb is not None:
            self._commit(wb, staged)

    def _split_envelope(self, frames: list[Any]) -> tuple[list[Any], list[Any] | None]:
        # DEALER peers send [id, header, body...]; REQ peers add an empty delimiter.
        if len(frames) >= 2 and len(frames[1]) == 0:
            envelope, message = frames[:2], frames[2:]
        else:
            envelope, message = frames[:1], frames[1:]
        if len(message) > REQUEST_FRAMES_MAX:
            self._send_error(envelope, None, errors.MalformedRequestError(f"{len(message)} frames exceed {REQUEST_FRAMES_MAX}"))
            return envelope, None
        return envelope, message

    def _send_error(self, envelope: list[Any], header: Header | None, exc: errors.FabricError) -> None:
        # Without a decodable header we still answer, with api 0 and correlation id 0, so
        # a confused client sees why instead of waiting for its timeout.
        correlation_id = exc.fields.get("correlation_id", 0)
        request_header = header or Header(0, 0, correlation_id if isinstance(correlation_id, int) else 0)
        self._send(envelope, apis.encode_error_response(request_header, exc.code, exc.message))

    def _commit(self, wb: Any, staged: list[tuple[list[Any], apis.Message, ProduceOutcome]]) -> None:
        """Write the turn's batches once, publish them, then answer or park each producer."""
        try:
            self.store.write(wb)
        except errors.StorageError:
            log.critical("storage write failed; stopping the node so nothing is acknowledged from memory")
            self._stopping.set()
            raise
        touched: set[tuple[str, int]] = set()
        for _envelope, _request, outcome in staged:
            for tp, data in outcome.appended:
                touched.add(tp)
                leader = self.leaders.get(tp)
                if leader is not None and leader.followers:
                    try:
                        self.pub.send_multipart(
                            [partition_key(*tp), _REPLICA_META.pack(leader.epoch, self.node_id), data], zmq.NOBLOCK
                        )
                    except zmq.Again:
                        pass  # PUB is full; followers see the gap and fetch
        for tp in touched:
            self._update_high_watermark(tp)
        now = time.monotonic()
        for envelope, request, outcome in staged:
            acks = request.body["acks"]
            if acks == 0:
                continue
            if acks == 1 or not outcome.waits:
                self._send(envelope, apis.encode_response(request.header, {"results": outcome.results}))
                continue
            deadline = now + request.body["timeout_ms"] / 1000.0
            self.pending.append(PendingProduce(envelope, request.header, outcome.results, outcome.waits, deadline))
            touched.update(tp for tp, _end in outcome.waits.values())
        self._complete_pending(touched)
        self._wake_parked(touched)

    # -- produce ---------------------------------------------------------------------------
    def _handle_produce(self, request: apis.Message, wb: Any) -> ProduceOutcome:
        """Validate and stage every batch of one request (a request-level error raises)."""
        body = request.body
        acks = body["acks"]
        if acks not in (0, 1, -1):
            raise errors.InvalidRequestError(f"acks={acks} must be 0, 1 or -1 (all)")
        if not 0 <= body["timeout_ms"] <= PRODUCE_TIMEOUT_MS_MAX:
            raise errors.InvalidRequestError(f"timeout_ms={body['timeout_ms']} outside [0, {PRODUCE_TIMEOUT_MS_MAX}]")
        now_ms = int(time.time() * 1000)
        outcome = ProduceOutcome()
        results = outcome.results
        for entry, frame in zip(body["entries"], request.batches, strict=True):
            topic, partition = entry["topic"], entry["partition"]
            result = {"topic": topic, "partition": partition, "error": 0, "base_offset": -1, "log_start_offset": -1, "message": ""}
            try:
                plog, leader, config = self._leader_log(topic, partition)
                if not self._session_ok():
                    # SUSPENDED or unverified after a stall: a deposed leader must not take writes.
                    raise errors.NodeNotReadyError(f"node {self.node_id} cannot confirm its ZooKeeper session")
                header = batch_format.validate(frame, config.message_bytes_max)
                if acks == -1 and len(leader.isr) < config.min_insync:
                    raise errors.NotEnoughReplicasError(
                        f"{topic}/{partition}: {len(leader.isr)} in-sync replicas {sorted(leader.isr)} < min_insync={config.min_insync}"
                    )
                verdict, original_offset = plog.producers.check(
                    header.producer_id, header.producer_epoch, header.base_sequence, header.record_count
                )
                if verdict == DUPLICATE:
                    # A retry of a batch we already have: answer as the first time, write
                    # nothing (and for acks=all, wait until that first copy is replicated).
                    result["base_offset"] = original_offset
                    end = original_offset + header.record_count if original_offset >= 0 else plog.log_end_offset
                else:
                    buf = bytearray(frame)
                    result["base_offset"] = plog.append(wb, buf, header, leader.epoch, now_ms)
                    outcome.appended.append(((topic, partition), bytes(buf)))
                    end = result["base_offset"] + header.record_count
                if acks == -1:
                    outcome.waits[len(results)] = ((topic, partition), end)
                result["log_start_offset"] = plog.log_start_offset
            except errors.FabricError as exc:
                result["error"] = exc.code
                result["message"] = exc.message
            results.append(result)
        return outcome

    def _update_high_watermark(self, tp: tuple[str, int]) -> bool:
        leader = self.leaders.get(tp)
        if leader is None:
            return False
        plog = self.logs[tp]
        hw = min(leader.high_watermark(plog.log_end_offset), plog.log_end_offset)
        if hw > plog.high_watermark:
            plog.high_watermark = hw
            return True
        return False

    def _complete_pending(self, tps: set[tuple[str, int]]) -> None:
        if not self.pending or not tps:
            return
        still: list[PendingProduce] = []
        for pending in self.pending:
            for index, (tp, required) in list(pending.waits.items()):
                if tp not in tps:
                    continue
                leader = self.leaders.get(tp)
                result = pending.results[index]
                if leader is None:
                    result["error"] = errors.NotLeaderError.code
                    result["message"] = f"node {self.node_id} lost leadership of {tp[0]}/{tp[1]} before the write was replicated"
                elif self.logs[tp].high_watermark >= required:
                    config = self.configs[tp[0]]
                    if len(leader.isr) < config.min_insync:
                        result["error"] = errors.NotEnoughReplicasAfterAppendError.code
                        result["message"] = f"written, but only {len(leader.isr)} in-sync replicas remain"
                else:
                    continue
                del pending.waits[index]
            if pending.waits:
                still.append(pending)
            else:
                self._send(pending.envelope, apis.encode_response(pending.header, {"results": pending.results}))
        self.pending = still

    def _expire_pending(self, now: float) -> None:
        if not self.pending:
            return
        still: list[PendingProduce] = []
        for pending in self.pending:
            if pending.deadline > now:
                still.append(pending)
                continue
            for index, (tp, _required) in pending.waits.items():
                pending.results[index]["error"] = errors.RequestTimedOutError.code
                pending.results[index]["message"] = f"not replicated to the ISR of {tp[0]}/{tp[1]} within timeout_ms"
            self._send(pending.envelope, apis.encode_response(pending.header, {"results": pending.results}))
        self.pending = still

    # -- everything else -------------------------------------------------------------------
    def _handle_other(self, envelope: list[Any], request: apis.Message) -> None:
        api = request.header.api_key
        try:
            if api == ApiKey.FETCH:
                self._handle_fetch(envelope, request)
                return
            if self.groups.handles(api):
                self.groups.handle(envelope, request)
                return
            if api == ApiKey.METADATA:
                body = self._metadata(request.body["topics"])
            elif api == ApiKey.LIST_OFFSETS:
                body = self._list_offsets(request.body["partitions"])
            elif api == ApiKey.API_VERSIONS:
                body = {
                    "apis": [
                        {"api_key": k, "min_version": lo, "max_version": hi}
                        for k, (lo, hi) in sorted(apis.supported_versions().items())
                    ]
                }
            elif api == ApiKey.CREATE_TOPIC:
                body = self._admin_result(self._create_topic, request.body)
            elif api == ApiKey.DELETE_TOPIC:
                body = self._admin_result(lambda b: zkl.delete_topic(self.zk, b["name"]), request.body)
            elif api == ApiKey.DESCRIBE_TOPICS:
                body = self._describe(request.body["names"])
            elif api == ApiKey.INIT_PRODUCER_ID:
                body = {"error": 0, "producer_id": self._next_producer_id(), "producer_epoch": 0}
            elif api == ApiKey.REPLICA_ACK:
                body = self._replica_ack(request.body)
            elif api == ApiKey.OFFSETS_FOR_LEADER_EPOCH:
                body = self._offsets_for_leader_epoch(request.body["partitions"])
            elif api == ApiKey.ELECT_LEADERS:
                body = self._elect_preferred_leaders(request.body["topics"])
            elif api == ApiKey.CREATE_PARTITIONS:
                body = self._admin_result(lambda b: zkl.add_partitions(self.zk, b["name"], b["partitions"]), request.body)
            else:  # decode_request already refused unknown keys; this guards new ones
                raise errors.UnknownApiError(f"api {api} has no handler")
            self._send(envelope, apis.encode_response(request.header, body))
        except errors.FabricError as exc:
            self._send_error(envelope, request.header, exc)
        except Exception as exc:
            log.exception("request %s failed", ApiKey(api).name)
            self._send_error(envelope, request.header, errors.UnknownServerError(f"{type(exc).__name__}: {exc}"))

    def _next_producer_id(self) -> int:
        if self._producer_ids_next >= self._producer_ids_end:
            self._producer_ids_next, self._producer_ids_end = zkl.allocate_producer_id_block(self.zk)
        producer_id = self._producer_ids_next
        self._producer_ids_next += 1
        return producer_id

    def _admin_result(self, action: Any, body: dict[str, Any]) -> dict[str, Any]:
        try:
            action(body)
        except errors.FabricError as exc:
            return {"error": exc.code, "message": exc.message}
        return {"error": 0, "message": ""}

    def _create_topic(self, body: dict[str, Any]) -> None:
        configs = {c["key"]: c["value"] for c in body["configs"]}
        zkl.create_topic(self.zk, body["name"], body["partitions"], body["replication_factor"], configs)

    def _partition_state_body(self, state: zkl.PartitionState) -> dict[str, Any]:
        return {
            "partition": state.partition,
            "error": 0,
            "leader": state.leader,
            "leader_epoch": state.leader_epoch,
            "replicas": list(state.replicas),
            "isr": list(state.isr),
        }

    def _metadata(self, names: list[str]) -> dict[str, Any]:
        topics = self.routing.topics()
        wanted = names or sorted(topics)
        out = []
        for name in wanted:
            route = topics.get(name)
            if route is None:
                out.append({"error": errors.UnknownTopicOrPartitionError.code, "name": name, "strict_order": 0,
                            "message_bytes_max": 0, "partitions": []})
                continue
            out.append({
                "error": 0,
                "name": name,
                "strict_order": int(route.config.strict_order),
                "message_bytes_max": route.config.message_bytes_max,
                "partitions": [self._partition_state_body(route.partitions[p]) for p in sorted(route.partitions)],
            })
        nodes = [{"node_id": n.node_id, "address": n.address} for n in sorted(self.routing.nodes().values(), key=lambda n: n.node_id)]
        return {"controller_id": self.routing.controller_id, "nodes": nodes, "topics": out}

    def _describe(self, names: list[str]) -> dict[str, Any]:
        topics = self.routing.topics()
        out = []
        for name in names or sorted(topics):
            route = topics.get(name)
            if route is None:
                out.append({"error": errors.UnknownTopicOrPartitionError.code, "name": name, "configs": [], "partitions": []})
                continue
            out.append({
                "error": 0,
                "name": name,
                "configs": [{"key": k, "value": v} for k, v in sorted(route.config.as_strings().items())],
                "partitions": [self._partition_state_body(route.partitions[p]) for p in sorted(route.partitions)],
            })
        return {"topics": out}

    def _list_offsets(self, partitions: list[dict[str, Any]]) -> dict[str, Any]:
        out = []
        for p in partitions:
            result = {"topic": p["topic"], "partition": p["partition"], "error": 0, "timestamp": -1, "offset": -1}
            try:
                plog, _leader, _config = self._leader_log(p["topic"], p["partition"])
                ts = p["timestamp"]
                if ts == apis.LATEST_TIMESTAMP:
                    result["offset"] = plog.high_watermark
                elif ts == apis.EARLIEST_TIMESTAMP:
                    result["offset"] = plog.log_start_offset
                elif ts < 0:
                    raise errors.InvalidRequestError(f"timestamp {ts}: use -1 (latest), -2 (earliest) or ms >= 0")
                else:
                    offset, found_ts = plog.offset_for_timestamp(ts)
                    if offset >= plog.high_watermark:
                        offset, found_ts = -1, -1
                    result["offset"], result["timestamp"] = offset, found_ts
            except errors.FabricError as exc:
                result["error"] = exc.code
            out.append(result)
        return {"partitions": out}

    # -- fetch -----------------------------------------------------------------------------
    def _handle_fetch(self, envelope: list[Any], request: apis.Message) -> None:
        body = request.body
        if not 0 <= body["max_wait_ms"] <= FETCH_WAIT_MS_MAX:
            raise errors.InvalidRequestError(f"max_wait_ms={body['max_wait_ms']} outside [0, {FETCH_WAIT_MS_MAX}]")
        if body["max_bytes"] <= 0 or body["min_bytes"] < 0:
            raise errors.InvalidRequestError("max_bytes must be positive and min_bytes non-negative")
        body["parsed_tag_filter"] = TagFilter(body["tag_filter"]) if body.get("tag_filter") else None
        fetch = ParkedFetch(
            envelope,
            request.header,
            body,
            time.monotonic() + body["max_wait_ms"] / 1000.0,
            {(p["topic"], p["partition"]) for p in body["partitions"]},
        )
        if body["replica_id"] >= 0:
            self._record_replica_fetch(body)
        if not self._try_answer_fetch(fetch, final=body["max_wait_ms"] == 0):
            if len(self.parked) >= PARKED_FETCHES_MAX:
                self._try_answer_fetch(fetch, final=True)
            else:
                self.parked.append(fetch)

    def _record_replica_fetch(self, body: dict[str, Any]) -> None:
        """A follower's fetch offset is its log end: count it like an ack."""
        now = time.monotonic()
        changed: set[tuple[str, int]] = set()
        for p in body["partitions"]:
            tp = (p["topic"], p["partition"])
            leader = self.leaders.get(tp)
            if leader is None or p["current_leader_epoch"] != leader.epoch:
                continue
            leader.record_follower(body["replica_id"], p["fetch_offset"], self.logs[tp].log_end_offset, now)
            if self._update_high_watermark(tp):
                changed.add(tp)
        if changed:
            self._complete_pending(changed)
            self._wake_parked(changed)

    def _try_answer_fetch(self, fetch: ParkedFetch, *, final: bool) -> bool:
        """Answer if there is enough data, an error, or ``final``; else leave it parked."""
        body = fetch.body
        budget = min(body["max_bytes"], FETCH_BYTES_MAX)
        results: list[dict[str, Any]] = []
        frames: list[Any] = []
        total = 0
        any_error = False
        for p in body["partitions"]:
            result = {"topic": p["topic"], "partition": p["partition"], "error": 0, "high_watermark": -1,
                      "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0,
                      "next_fetch_offset": -1, "filtered_bytes": 0}  # the last two: FETCH v1
            try:
                plog, leader, _config = self._leader_log(p["topic"], p["partition"])
                epoch = p["current_leader_epoch"]
                if epoch != apis.ANY_LEADER_EPOCH and epoch != leader.epoch:
                    if epoch < leader.epoch:
                        raise errors.FencedLeaderEpochError(f"epoch {epoch} < {leader.epoch}")
                    raise errors.UnknownLeaderEpochError(f"epoch {epoch} > {leader.epoch}")
                hw = plog.high_watermark
                result["high_watermark"] = hw
                result["log_start_offset"] = plog.log_start_offset
                result["log_end_offset"] = plog.log_end_offset
                # Consumers read only what every in-sync replica has; followers read it all.
                limit = hw if body["replica_id"] == apis.CONSUMER_REPLICA_ID else plog.log_end_offset
                if limit < p["fetch_offset"] <= plog.log_end_offset:
                    batches: list[bytes] = []  # above the HW but inside the log: wait
                else:
                    room = min(p["partition_bytes_max"], budget - total) if total < budget else 0
                    tag_filter = body.get("parsed_tag_filter")
                    if tag_filter is not None and (room > 0 or total == 0):
                        batches, result["next_fetch_offset"], result["filtered_bytes"] = read_filtered(
                            plog.read, limit, p["fetch_offset"], max(room, 1), tag_filter)
                    else:
                        batches = plog.read(p["fetch_offset"], max(room, 1), limit) if (room > 0 or total == 0) else []
                result["batch_count"] = len(batches)
                frames.extend(batches)
                total += sum(len(b) for b in batches)
            except errors.FabricError as exc:
                result["error"] = exc.code
                any_error = True
            results.append(result)
        if not (final or any_error or total >= max(body["min_bytes"], 1)):
            return False
        self._send(fetch.envelope, apis.encode_response(fetch.header, {"partitions": results}, frames))
        return True

    def _wake_parked(self, touched: set[tuple[str, int]]) -> None:
        if not self.parked or not touched:
            return
        still: list[ParkedFetch] = []
        for fetch in self.parked:
            if fetch.keys & touched and self._try_answer_fetch(fetch, final=False):
                continue
            still.append(fetch)
        self.parked = still

    def _expire_parked(self, now: float) -> None:
        if not self.parked:
            return
        still: list[ParkedFetch] = []
        for fetch in self.parked:
            if fetch.deadline <= now:
                self._try_answer_fetch(fetch, final=True)
            else:
                still.append(fetch)
        self.parked = still

    # -- leader side of replication --------------------------------------------------------
    def _replica_ack(self, body: dict[str, Any]) -> dict[str, Any]:
        now = time.monotonic()
        changed: set[tuple[str, int]] = set()
        out = []
        for p in body["partitions"]:
            tp = (p["topic"], p["partition"])
            result = {"topic": tp[0], "partition": tp[1], "error": 0, "high_watermark": -1, "log_end_offset": -1}
            leader = self.leaders.get(tp)
            result["error"] = self._epoch_error(leader, p["leader_epoch"])
            if leader is not None and not result["error"]:
                plog = self.logs[tp]
                leader.record_follower(body["replica_id"], p["log_end_offset"], plog.log_end_offset, now)
                if self._update_high_watermark(tp):
                    changed.add(tp)
                result["high_watermark"] = plog.high_watermark
                result["log_end_offset"] = plog.log_end_offset
            out.append(result)
        if changed:
            self._complete_pending(changed)
            self._wake_parked(changed)
        return {"partitions": out}

    @staticmethod
    def _epoch_error(leader: LeaderReplica | None, epoch: int) -> int:
        """The error code for a follower's request at ``epoch`` (0 if it may proceed)."""
        if leader is None:
            return errors.NotLeaderError.code
        if epoch < leader.epoch:
            return errors.FencedLeaderEpochError.code
        if epoch > leader.epoch:
            return errors.UnknownLeaderEpochError.code
        return 0

    def _offsets_for_leader_epoch(self, partitions: list[dict[str, Any]]) -> dict[str, Any]:
        out = []
        for p in partitions:
            tp = (p["topic"], p["partition"])
            result = {"topic": tp[0], "partition": tp[1], "error": 0, "leader_epoch": -1, "end_offset": -1,
                      "log_start_offset": -1}
            leader = self.leaders.get(tp)
            result["error"] = self._epoch_error(leader, p["current_leader_epoch"])
            if leader is not None and not result["error"]:
                plog = self.logs[tp]
                result["leader_epoch"], result["end_offset"] = plog.end_offset_for_epoch(p["leader_epoch"])
                result["log_start_offset"] = plog.log_start_offset
            out.append(result)
        return {"partitions": out}

    def _check_isr(self, now: float) -> None:
        """Shrink the ISR by lag and grow it by catch-up, writing ZooKeeper before acting."""
        if not self._session_ok():
            return
        lag_max_s = self.config.replica_lag_max_ms / 1000.0
        for tp, leader in list(self.leaders.items()):
            plog = self.logs[tp]
            wanted = leader.isr_change(plog.log_end_offset, plog.high_watermark, now, lag_max_s)
            if wanted is None:
                continue
            state = self.states[tp]
            new_state = zkl.PartitionState(state.partition, state.replicas, state.leader, state.leader_epoch,
                                           tuple(r for r in state.replicas if r in wanted), state.version)
            try:
                written = zkl.write_partition_state(self.zk, tp[0], new_state)
            except BadVersionError:
                # Someone (the controller) changed this partition: re-read before acting.
                self._routing_dirty = True
                self.routing.resync()
                continue
            except Exception as exc:  # connection trouble: try again next check
                log.warning("ISR update of %s/%d failed: %s", *tp, exc)
                continue
            log.info("ISR of %s/%d: %s -> %s", *tp, sorted(leader.isr), sorted(wanted))
            self.states[tp] = written
            self.routing.apply_partition_state(tp[0], written)
            leader.isr = set(written.isr) | {self.node_id}
            if self._update_high_watermark(tp):
                self._wake_parked({tp})
            self._complete_pending({tp})

    # -- follower side of replication ------------------------------------------------------
    def _leader_addresses(self, leader_id: int) -> tuple[str, str] | None:
        info = self.routing.nodes().get(leader_id)
        if info is None:
            return None
        if info.replication_address and info.replication_address not in self._sub_connected:
            self.sub.connect(info.replication_address)
            self._sub_connected.add(info.replication_address)
        return info.address, info.replication_address

    def _replica_request(self, address: str, api_key: int, body: dict[str, Any], kind: str, context: Any) -> int:
        correlation_id = self.replica_conns.next_id()
        try:
            self.replica_conns.send(address, apis.encode_request(api_key, body, correlation_id), wait_connect_ms=0)
        except errors.FabricError:
            return 0
        self.replica_requests[correlation_id] = (kind, context)
        return correlation_id

    def _follower_tick(self, now: float) -> None:
        acks: dict[int, list[dict[str, Any]]] = {}
        for tp, f in self.followers.items():
            plog = self.logs[tp]
            if f.request_in_flight and now - f.request_sent_s > REPLICA_REQUEST_TIMEOUT_S:
                self.replica_requests.pop(f.request_in_flight, None)
                f.request_in_flight = 0
            addresses = self._leader_addresses(f.leader_id)
            if addresses is None:
                continue
            address = addresses[0]
            if f.mode == TRUNCATING and not f.request_in_flight:
                last_epoch = plog.latest_epoch()
                if last_epoch < 0:
                    self._set_mode(tp, f, FETCHING, "empty log: nothing to truncate")
                else:
                    body = {"replica_id": self.node_id, "partitions": [
                        {"topic": tp[0], "partition": tp[1], "current_leader_epoch": f.epoch, "leader_epoch": last_epoch}]}
                    f.request_in_flight = self._replica_request(address, ApiKey.OFFSETS_FOR_LEADER_EPOCH, body, "epoch", (tp, f.epoch))
                    f.request_sent_s = now
            if f.mode == STREAMING and f.leader_log_end > plog.log_end_offset and now - f.last_progress_s > REPLICA_STALL_S:
                self._set_mode(tp, f, FETCHING, f"stream stalled below the leader's end {f.leader_log_end}")
            if f.mode == FETCHING and not f.request_in_flight:
                body = {"replica_id": self.node_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": REPLICA_FETCH_BYTES_MAX,
                        "partitions": [{"topic": tp[0], "partition": tp[1], "fetch_offset": plog.log_end_offset,
                                        "partition_bytes_max": REPLICA_FETCH_BYTES_MAX, "current_leader_epoch": f.epoch}]}
                f.request_in_flight = self._replica_request(address, ApiKey.FETCH, body, "fetch", (tp, f.epoch))
                f.request_sent_s = now
            if f.mode == STREAMING and (plog.log_end_offset != f.acked_log_end or now - self._last_ack_sent_s >= REPLICA_ACK_INTERVAL_S):
                acks.setdefault(f.leader_id, []).append(
                    {"topic": tp[0], "partition": tp[1], "leader_epoch": f.epoch, "log_end_offset": plog.log_end_offset})
                f.acked_log_end = plog.log_end_offset
        if acks:
            self._send_acks(acks)
        if now - self._last_ack_sent_s >= REPLICA_ACK_INTERVAL_S:
            self._last_ack_sent_s = now

    def _set_mode(self, tp: tuple[str, int], f: FollowerReplica, mode: str, why: str) -> None:
        if f.mode != mode:
            log.info("follower of %s/%d (leader %d epoch %d): %s -> %s: %s", *tp, f.leader_id, f.epoch, f.mode, mode, why)
            f.mode = mode

    def _send_acks(self, acks: dict[int, list[dict[str, Any]]]) -> None:
        for leader_id, partitions in acks.items():
            addresses = self._leader_addresses(leader_id)
            if addresses is not None:
                self._replica_request(addresses[0], ApiKey.REPLICA_ACK, {"replica_id": self.node_id, "partitions": partitions},
                                      "ack", None)

    def _drain_replication_stream(self) -> None:
        """Apply batches from leaders' PUB streams that continue our logs exactly."""
        wb = None
        now = time.monotonic()
        now_ms = int(time.time() * 1000)
        for _ in range(SUB_MESSAGES_MAX):
            try:
                pkey, meta, data = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:
                continue  # not three frames: not from a Fabric leader
            tp = self.pkeys.get(pkey)
            if tp is None:
                continue
            f = self.followers.get(tp)
            if f is None or f.mode != STREAMING or len(meta) != _REPLICA_META.size:
                continue
            epoch, leader_id = _REPLICA_META.unpack(meta)
            if epoch != f.epoch or leader_id != f.leader_id:
                continue  # fenced: not the leader we follow
            plog = self.logs[tp]
            try:
                header = batch_format.read_header(data)
            except errors.FabricError:
                continue
            if header.next_offset <= plog.log_end_offset:
                continue  # already have it
            if header.base_offset != plog.log_end_offset:
                self._set_mode(tp, f, FETCHING, f"gap in the stream: batch at {header.base_offset}, log end {plog.log_end_offset}")
                continue
            try:
                batch_format.validate(data, len(data))
            except errors.FabricError as exc:
                self._set_mode(tp, f, FETCHING, f"bad batch from leader {leader_id}: {exc}")
                continue
            if wb is None:
                wb = self.store.new_write_batch()
            plog.append(wb, bytearray(data), header, header.leader_epoch, now_ms, stamp=False)
            f.last_progress_s = now
        if wb is not None:
            self.store.write(wb)
            self._follower_tick(now)  # ack at once: the leader's HW waits on us

    def _handle_replica_replies(self) -> None:
        for _address, frames in self.replica_conns.drain():
            try:
                message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            except errors.FabricError as exc:
                log.warning("undecodable reply from a leader: %s", exc)
                continue
            request = self.replica_requests.pop(message.header.correlation_id, None)
            if request is None or message.header.error_code:
                continue
            kind, context = request
            if kind == "ack":
                self._on_ack_reply(message.body)
                continue
            tp, epoch = context
            f = self.followers.get(tp)
            if f is None or f.epoch != epoch or f.request_in_flight != message.header.correlation_id:
                continue
            f.request_in_flight = 0
            if kind == "epoch":
                self._on_epoch_reply(tp, f, message.body["partitions"][0])
            elif kind == "fetch":
                self._on_fetch_reply(tp, f, message.body["partitions"][0], message.batches)

    def _on_ack_reply(self, body: dict[str, Any]) -> None:
        for p in body["partitions"]:
            tp = (p["topic"], p["partition"])
            f = self.followers.get(tp)
            if f is None or p["error"]:
                continue
            f.leader_log_end = p["log_end_offset"]
            plog = self.logs[tp]
            plog.high_watermark = max(plog.high_watermark, min(p["high_watermark"], plog.log_end_offset))

    def _on_epoch_reply(self, tp: tuple[str, int], f: FollowerReplica, result: dict[str, Any]) -> None:
        if result["error"]:
            return  # the leader does not know its epoch yet, or moved on: ask again later
        plog = self.logs[tp]
        leader_epoch, leader_end = result["leader_epoch"], result["end_offset"]
        if leader_epoch < 0:
            target = plog.log_start_offset  # the leader has nothing as old as our history
        else:
            # KIP-279: cut at the end of the last epoch both logs share, as it is in ours.
            _ours, our_end = plog.end_offset_for_epoch(leader_epoch)
            target = min(leader_end, our_end) if our_end >= 0 else plog.log_start_offset
        if target < plog.log_end_offset:
            log.warning("truncating %s/%d from %d to %d (leader %d epoch %d)",
                        *tp, plog.log_end_offset, target, f.leader_id, f.epoch)
            plog.truncate_to(target)
        if plog.log_end_offset < result["log_start_offset"]:
            plog.reset_to(result["log_start_offset"])
        self._set_mode(tp, f, FETCHING, f"truncation done at {plog.log_end_offset}")

    def _on_fetch_reply(self, tp: tuple[str, int], f: FollowerReplica, result: dict[str, Any], batches: list[Any]) -> None:
        plog = self.logs[tp]
        error = result["error"]
        if error == errors.OffsetOutOfRangeError.code:
            if plog.log_end_offset < result["log_start_offset"]:
                plog.reset_to(result["log_start_offset"])
            elif plog.log_end_offset > result["log_end_offset"] >= 0:
                self._set_mode(tp, f, TRUNCATING, "we hold more than the leader: find the divergence again")
            return
        if error:
            return
        f.leader_log_end = result["log_end_offset"]
        wb = None
        now_ms = int(time.time() * 1000)
        for data in batches:
            raw = bytes(data)
            header = batch_format.read_header(raw)
            if header.next_offset <= plog.log_end_offset:
                continue
            if header.base_offset != plog.log_end_offset:
                self._set_mode(tp, f, TRUNCATING, f"fetched batch at {header.base_offset}, log end {plog.log_end_offset}")
                return
            batch_format.validate(raw, len(raw))
            if wb is None:
                wb = self.store.new_write_batch()
            plog.append(wb, bytearray(raw), header, header.leader_epoch, now_ms, stamp=False)
        if wb is not None:
            self.store.write(wb)
            f.last_progress_s = time.monotonic()
        plog.high_watermark = max(plog.high_watermark, min(result["high_watermark"], plog.log_end_offset))
        if plog.log_end_offset >= result["log_end_offset"]:
            # Level with the leader as of this reply: the stream carries us from here. (Not
            # "an empty fetch": under steady writes a fetch is never empty. Anything the
            # leader published meanwhile is queued on our SUB socket, or, if it was
            # dropped, shows up as a gap and sends us back to fetching.)
            self._set_mode(tp, f, STREAMING, f"level with the leader at {plog.log_end_offset}")
            f.last_progress_s = time.monotonic()
            f.acked_log_end = -1  # report our log end right away

    # -- controller ------------------------------------------------------------------------
    def _controller_tick(self) -> None:
        self._controller_dirty = False
        if not self._session_ok():
            return
        if self.routing.controller_id < 0 and not self._is_controller:
            try:
                self.zk.create(zkl.CONTROLLER, str(self.node_id).encode(), ephemeral=True)
                self._is_controller = True
                log.info("node %d is the controller", self.node_id)
            except NodeExistsError:
                pass
            except Exception as exc:
                log.warning("controller election failed: %s", exc)
        elif self._is_controller and self.routing.controller_id not in (-1, self.node_id):
            self._is_controller = False
        if self._is_controller:
            self._reconcile_leaders()

    def _reconcile_leaders(self) -> None:
        """Elect a leader wherever the current one is gone (or an offline ISR member is back)."""
        live = set(self.routing.nodes())
        for name, route in self.routing.topics().items():
            for p, cached in route.partitions.items():
                if controller.elect(cached, live, unclean=route.config.unclean_leader_election) is None:
                    continue
                try:
                    raw, stat = self.zk.get(zkl.partition_path(name, p))
                    state = zkl.PartitionState.decode(p, raw, stat.version)
                    live = set(zkl.live_nodes(self.zk))
                    new_state = controller.elect(state, live, unclean=route.config.unclean_leader_election)
                    if new_state is None:
                        continue
                    written = zkl.write_partition_state(self.zk, name, new_state)
                except (BadVersionError, NoNodeError):
                    self._controller_dirty = True
                    continue
                except Exception as exc:
                    log.warning("leader election for %s/%d failed: %s", name, p, exc)
                    self._controller_dirty = True
                    continue
                self.routing.apply_partition_state(name, written)
                self._routing_dirty = True
                log.info("controller: %s/%d leader %d -> %d, epoch %d, isr %s",
                         name, p, state.leader, written.leader, written.leader_epoch, list(written.isr))

    def _elect_preferred_leaders(self, topics: list[str]) -> dict[str, Any]:
        if not self._is_controller:
            raise errors.NotControllerError(f"node {self.node_id} is not the controller (ask node {self.routing.controller_id})")
        live = set(zkl.live_nodes(self.zk))
        moved = 0
        for name, route in self.routing.topics().items():
            if topics and name not in topics:
                continue
            for p in route.partitions:
                try:
                    raw, stat = self.zk.get(zkl.partition_path(name, p))
                    new_state = controller.prefer(zkl.PartitionState.decode(p, raw, stat.version), live)
                    if new_state is None:
                        continue
                    written = zkl.write_partition_state(self.zk, name, new_state)
                except (BadVersionError, NoNodeError):
                    continue
                self.routing.apply_partition_state(name, written)
                self._routing_dirty = True
                moved += 1
        return {"error": 0, "message": "", "moved": moved}

    # -- retention -------------------------------------------------------------------------
    def _apply_retention(self) -> None:
        now_ms = int(time.time() * 1000)
        for (topic, partition), plog in self.logs.items():
            config = self.configs.get(topic)
            if config is None:
                continue
            deleted = plog.apply_retention(config.retention_ms, config.retention_bytes, now_ms)
            if deleted:
                log.info("retention deleted %d records of %s/%d; log starts at %d", deleted, topic, partition, plog.log_start_offset)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fabric node", description="Run one Fabric storage node.")
    parser.add_argument("--id", type=int, required=True, dest="node_id")
    parser.add_argument("--zk", required=True, help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="client port; 0 picks a free one")
    parser.add_argument("--replication-port", type=int, default=0, help="replication PUB port; 0 picks a free one")
    parser.add_argument("--replica-lag-max-ms", type=int, default=5_000,
                        help="a follower this far behind leaves the in-sync replicas")
    parser.add_argument("--replication-hwm", type=int, default=PUB_HWM_MESSAGES,
                        help="batches queued per follower before the replication stream drops (it then fetches)")
    parser.add_argument("--replication-buffer-bytes", type=int, default=0,
                        help="kernel buffer of the replication sockets; 0 lets the OS size it")
    parser.add_argument("--fsync", choices=("none", "interval", "every-batch"), default="none")
    parser.add_argument("--fsync-interval-ms", type=int, default=FSYNC_INTERVAL_MS_DEFAULT)
    parser.add_argument("--retention-check-interval-ms", type=int, default=RETENTION_CHECK_INTERVAL_MS_DEFAULT)
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format=f"%(asctime)s node{args.node_id} %(levelname)s %(message)s")
    os.makedirs(args.data_dir, exist_ok=True)
    node = Node(
        NodeConfig(
            node_id=args.node_id,
            zk=args.zk,
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            replication_port=args.replication_port,
            replica_lag_max_ms=args.replica_lag_max_ms,
            replication_hwm=args.replication_hwm,
            replication_buffer_bytes=args.replication_buffer_bytes,
            fsync=args.fsync,
            fsync_interval_ms=args.fsync_interval_ms,
            retention_check_interval_ms=args.retention_check_interval_ms,
            session_timeout_ms=args.session_timeout_ms,
        )
    )

    def on_signal(signum: int, _frame: Any) -> None:
        node.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node.run()
    return 0
