"""What every room of the node shares: its configuration, its state and its sockets.

One ``NodeState`` is built by ``nodes/server.py`` and passed to every handler and duty.
The loop thread alone reads and writes it; kazoo's threads only flip the flags marked
below and call ``wake()``. Modules keep their own state here too (the parked fetches of
``nodes/fetch.py``, the pending acks of ``nodes/produce.py``), so nothing holds a
reference back to a node object and a handler's inputs are visible in its signature.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric import zk as zkl
from fabric.limits import (
    FSYNC_INTERVAL_MS_DEFAULT,
    OFFSETS_RETENTION_MS_DEFAULT,
    RETENTION_CHECK_INTERVAL_MS_DEFAULT,
)
from fabric.protocol import apis
from fabric.protocol.header import Header
from fabric.transport import CLIENT_HEARTBEAT_TIMEOUT_MS, Connections, send_multipart_nowait
from nodes.lease import SessionLease
from nodes.log import PartitionLog, Store
from nodes.metrics import NodeMetrics, frames_bytes, response_error_codes
from nodes.reply_budget import ReplyBudget

if TYPE_CHECKING:
    from nodes.authz import NodeSecurity
    from nodes.fetch import ParkedFetch
    from nodes.follower import FollowerReplica
    from nodes.group_coordinator import GroupCoordinator
    from nodes.leader import LeaderReplica
    from nodes.produce import PendingProduce
    from nodes.queue_coordinator import QueueCoordinator
    from nodes.strict_order import StrictOrder

log = logging.getLogger("fabric.node")

PUB_HWM_MESSAGES = 1_000  # beyond this PUB drops; followers notice the gap and fetch
# A loop turn's work (the poll's wait excluded) this long means we were stopped in it: as
# nodes/session.py's PAUSE_SUSPECT_S for a turn that starts late.
TURN_STALL_SUSPECT_S = 1.0

TopicPartition = tuple[str, int]
Envelope = list[Any]  # the ROUTER identity frame(s) a reply goes back through


def envelope_identity(envelope: Envelope) -> bytes:
    """The client's ROUTER identity: what per-client state (ZAP principal, unread answers) is keyed by."""
    first = envelope[0]
    return first.bytes if isinstance(first, zmq.Frame) else bytes(first)


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
    direct_io: str = "auto"  # RocksDB table files with O_DIRECT (nodes/storage_setup.py)
    retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS_DEFAULT
    offsets_retention_ms: int = OFFSETS_RETENTION_MS_DEFAULT  # empty consumer groups (nodes/group_retention.py)
    session_timeout_ms: int = 6_000
    replica_lag_max_ms: int = 5_000
    replication_hwm: int = PUB_HWM_MESSAGES  # messages queued per follower before PUB drops
    replication_buffer_bytes: int = 0  # kernel socket buffer of PUB/SUB; 0 lets the OS size it
    client_heartbeat_timeout_ms: int = CLIENT_HEARTBEAT_TIMEOUT_MS  # silent client connections close (0: never)
    metrics_port: int = 0  # Prometheus endpoint; 0 picks a free port, -1 turns it off
    metrics_host: str = ""  # the address that endpoint binds; "": host's
    security: str = "none"  # "curve": secure mode (nodes/authz.py, docs/SECURITY.md)
    server_key_file: str = ""
    key_file: str = ""
    zk_digest_file: str = ""


def parse_node_args(argv: list[str] | None) -> tuple[NodeConfig, str]:
    """The node's command line (``nodes/launch.py`` spells every option out) and its log level."""
    import argparse

    from fabric import allocator

    allocator.tune()  # called once, by the node process's main: it moves large batches

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
    parser.add_argument("--client-heartbeat-timeout-ms", type=int, default=CLIENT_HEARTBEAT_TIMEOUT_MS,
                        help="close a client connection silent this long, heartbeats included; 0: never")
    parser.add_argument("--fsync", choices=("none", "interval", "every-batch"), default="none")
    parser.add_argument("--fsync-interval-ms", type=int, default=FSYNC_INTERVAL_MS_DEFAULT)
    parser.add_argument("--direct-io", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--retention-check-interval-ms", type=int, default=RETENTION_CHECK_INTERVAL_MS_DEFAULT)
    parser.add_argument("--offsets-retention-ms", type=int, default=OFFSETS_RETENTION_MS_DEFAULT)
    parser.add_argument("--session-timeout-ms", type=int, default=6_000)
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus endpoint; 0 picks a free port, -1 off")
    parser.add_argument("--metrics-host", default="", help="address the Prometheus endpoint binds (default: --host)")
    parser.add_argument("--security", choices=("none", "curve"), default="none")
    parser.add_argument("--server-key-file", default="")
    parser.add_argument("--key-file", default="")
    parser.add_argument("--zk-digest-file", default="")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    config = NodeConfig(
        node_id=args.node_id,
        zk=args.zk,
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        replication_port=args.replication_port,
        replica_lag_max_ms=args.replica_lag_max_ms,
        replication_hwm=args.replication_hwm,
        replication_buffer_bytes=args.replication_buffer_bytes,
        client_heartbeat_timeout_ms=args.client_heartbeat_timeout_ms,
        fsync=args.fsync,
        fsync_interval_ms=args.fsync_interval_ms,
        direct_io=args.direct_io,
        retention_check_interval_ms=args.retention_check_interval_ms,
        offsets_retention_ms=args.offsets_retention_ms,
        session_timeout_ms=args.session_timeout_ms,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        security=args.security,
        server_key_file=args.server_key_file,
        key_file=args.key_file,
        zk_digest_file=args.zk_digest_file,
    )
    return config, str(args.log_level)


@dataclass
class Sockets:
    """The node's sockets, bound by ``nodes/server.py``."""

    router: zmq.Socket[Any]  # clients and followers' requests
    pub: zmq.Socket[Any]  # the replication stream this node publishes as a leader
    sub: zmq.Socket[Any]  # the leaders' streams this node follows
    wake_pull: zmq.Socket[Any]
    wake_push: zmq.Socket[Any]
    poller: zmq.Poller
    replica_conns: Connections  # follower -> leader requests, on the same poller


@dataclass
class NodeState:
    config: NodeConfig
    store: Store
    zk: KazooClient
    routing: zkl.RoutingCache
    sockets: Sockets
    address: str = ""
    replication_address: str = ""

    # Partitions hosted here, and this node's role in each (changed only by nodes/roles.py).
    logs: dict[TopicPartition, PartitionLog] = field(default_factory=dict)
    configs: dict[str, zkl.TopicConfig] = field(default_factory=dict)
    states: dict[TopicPartition, zkl.PartitionState] = field(default_factory=dict)
    leaders: dict[TopicPartition, LeaderReplica] = field(default_factory=dict)
    followers: dict[TopicPartition, FollowerReplica] = field(default_factory=dict)
    pkeys: dict[bytes, TopicPartition] = field(default_factory=dict)  # stream topic frame -> partition
    known_topics: set[str] = field(default_factory=set)

    # Requests waiting for something: long-poll fetches (nodes/fetch.py), acks=all
    # produces (nodes/produce.py), follower requests to leaders (nodes/follower.py).
    parked: list[ParkedFetch] = field(default_factory=list)
    reply_budget: ReplyBudget = field(default_factory=ReplyBudget)  # FETCH answers not yet taken
    pending: list[PendingProduce] = field(default_factory=list)
    replica_requests: dict[int, tuple[str, Any]] = field(default_factory=dict)
    subscribed: set[bytes] = field(default_factory=set)
    sub_connected: set[str] = field(default_factory=set)
    sub_disconnect_pending: set[str] = field(default_factory=set)  # see follower.disconnect_streams
    last_ack_sent_s: float = 0.0
    # lz4 output of this loop turn's PRODUCE batches so far: the turn stops draining requests
    # past PRODUCE_DECOMPRESSED_BYTES_MAX (nodes/server.py), as past DRAIN_BYTES_MAX of wire bytes.
    turn_decompressed_bytes: int = 0

    # Flags kazoo's threads may flip (then they call wake()); everything else is loop-only.
    stopping: threading.Event = field(default_factory=threading.Event)
    zk_ok: threading.Event = field(default_factory=threading.Event)
    routing_dirty: bool = True
    controller_dirty: bool = True
    session_lost: bool = False
    verify_session: bool = False  # set after a stall: answer nobody until ZooKeeper confirms us
    listening_since_s: float = 0.0  # when ZooKeeper last confirmed us after a stall (leader.isr_change)
    turn_started_s: float = 0.0  # when the loop's turn began (monotonic; nodes/session.py note_turn)
    drain_requested: bool = False  # SIGTERM: a controlled shutdown (nodes/drain.py) is wanted
    draining_since: float = 0.0  # loop-only from here: when the drain began (monotonic), 0 if not
    drained_at_s: float = 0.0  # when the drain had nothing left to move

    is_controller: bool = False
    metrics: NodeMetrics | None = None  # counts requests and serves /metrics (nodes/metrics.py)
    groups: GroupCoordinator | None = None  # consumer groups this node coordinates (set by nodes/server.py)
    producer_ids_next: int = 0
    producer_ids_end: int = 0
    authz: NodeSecurity | None = None  # secure mode: ACL check and quotas (nodes/authz.py)
    strict_order: StrictOrder | None = None  # made on first use by nodes/strict_order.py
    queues: QueueCoordinator | None = None  # made on first use by nodes/queue_coordinator.py
    queues_adopt_next_s: float = 0.0  # when it next looks for led queue partitions not loaded

    # What this node may do while ZooKeeper is in doubt (nodes/lease.py); kazoo's thread
    # sets its state, heartbeat answers its last contact (a float each, GIL-atomic).
    lease: SessionLease = field(init=False)
    heartbeat_due_s: float = 0.0
    heartbeat_sent_s: float = 0.0  # 0 when no heartbeat is in flight
    heartbeat_round: int = 0  # one more at every (re)connection: older answers are stale
    # Blocking ZooKeeper work runs on this worker (admin calls, producer-id blocks, the
    # controller's rounds, ISR writes, registering again); results come back to the loop.
    zk_worker: zkl.Worker = field(init=False)
    jobs: set[str] = field(default_factory=set)  # one-at-a-time worker jobs in flight
    isr_jobs: set[TopicPartition] = field(default_factory=set)  # ISR writes in flight

    # Called with the partitions whose high watermark moved or that took new data, so
    # whatever waits on them (pending acks, parked fetches, later group or queue waits)
    # can answer. Registered by nodes/server.py.
    change_listeners: list[Callable[[NodeState, set[TopicPartition]], None]] = field(default_factory=list)
    _wake_lock: threading.Lock = field(default_factory=threading.Lock)
    session_file_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.lease = SessionLease(self.config.session_timeout_ms / 1000.0, time.monotonic())
        self.zk_worker = zkl.Worker(self.wake)

    @property
    def node_id(self) -> int:
        return self.config.node_id

    def write_staged(self, wb: Any, staged: Iterable[tuple[Envelope, apis.Message, Any]] = ()) -> None:
        """Write a turn's staged requests. A failed write answers each of them with the
        retriable STORAGE_ERROR and raises: the loop then stops the node, so nothing is
        acknowledged from memory (nodes/storage_failure.py)."""
        try:
            self.store.write(wb)
        except errors.StorageError as exc:
            for envelope, request, _outcome in staged:
                self.send_error(envelope, request.header, exc)
            raise

    def wake(self) -> None:
        """Wake the loop from another thread (kazoo's) or a signal handler."""
        with self._wake_lock:
            try:
                self.sockets.wake_push.send(b"w", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a wake is already queued, or we are closing

    def session_ok(self) -> bool:
        """Connected with a session we hold: metadata changes may be attempted. Not in a
        turn that was itself stopped (``stalled_in_turn``): the ISR check in the rest of a
        turn a SIGSTOP froze saw every follower's last ack from before the stop and shrank
        the ISR to the leader alone (a fault hunt with the C producer)."""
        return self.zk_ok.is_set() and not self.stalled_in_turn() and not self.session_lost

    def may_coordinate(self) -> bool:
        """Consumer groups may be coordinated here (nodes/group_coordinator.py): within the
        lease, as acks=1 writes and METADATA answers (nodes/lease.py). Its answers steer
        members as those steer clients, and past the lease a new coordinator may exist. Not
        ``session_ok``: a ZooKeeper that restarts in a second then cost every group a
        reload and its members their commits (a fault audit saw 40 s without progress)."""
        return not self.session_lost and not self.verify_session and self.lease.within_lease(time.monotonic())

    def check_write_allowed(self, acks: int) -> None:
        """The lease rule (nodes/lease.py): acks=all while the ISR holds, acks=0/1 only while
        our session cannot have expired, nothing after a stall until ZooKeeper confirms us."""
        if self.session_lost or self.stalled_in_turn() or not self.lease.replicated_writes_allowed():
            raise errors.NodeNotReadyError(f"node {self.node_id} cannot confirm its ZooKeeper session")
        now = time.monotonic()
        if acks != -1 and not self.lease.within_lease(now):
            raise errors.NodeNotReadyError(
                f"node {self.node_id} is out of touch with ZooKeeper ({self.lease.describe(now)}): acks=0/1 "
                f"writes wait until it is back, so a leader that may have been replaced takes none")

    def unfenced_leader_allowed(self) -> bool:
        """Whether we may act as a leader that nothing fences once deposed (the queue
        coordinator: its state writes go acks=all to another node, which no follower of
        ours refuses as a follower refuses a deposed data leader's stream): the acks=1 rule
        (``check_write_allowed``), within our session's lease, not the ISR's hold."""
        try:
            self.check_write_allowed(1)
        except errors.NodeNotReadyError:
            return False
        return True

    def stalled_in_turn(self) -> bool:
        """Whether ZooKeeper must confirm us first (``verify_session``), also when we were
        stopped in the middle of this loop turn: the turn's start checks for a stall, but a
        SIGSTOP lands anywhere, and the rest of a turn frozen before the queue coordinator's
        tick answered receives and wrote its state as a leader deposed meanwhile."""
        if not self.verify_session and self.turn_started_s and \
                time.monotonic() - self.turn_started_s > TURN_STALL_SUSPECT_S:
            log.warning("loop turn stalled for %.1f s; verifying the ZooKeeper session",
                        time.monotonic() - self.turn_started_s)
            self.verify_session = True
        return self.verify_session

    def check_routing_current(self) -> None:
        """METADATA and DESCRIBE_TOPICS only within the lease: past it our map may be stale
        (a new leader elected without us seeing it), so send the client to another node."""
        now = time.monotonic()
        if self.session_lost or not self.lease.within_lease(now):
            raise errors.NodeNotReadyError(
                f"node {self.node_id} is out of touch with ZooKeeper ({self.lease.describe(now)}); "
                f"its routing map may be stale: ask another node")

    def resync_soon(self) -> None:
        """Re-read the routing map on the ZooKeeper worker (one at a time)."""
        if "resync" in self.jobs:
            return

        def done(_result: Any, error: BaseException | None) -> None:
            self.jobs.discard("resync")
            if error is not None:
                log.warning("re-reading the routing map failed: %s", error)
            self.routing_dirty = True
            self.controller_dirty = True

        try:
            self.zk_worker.submit(self.routing.resync, done)
        except errors.NodeNotReadyError:
            return
        self.jobs.add("resync")

    def check_session_ok(self) -> None:
        if not self.session_ok():
            raise errors.NodeNotReadyError(
                f"node {self.node_id} cannot reach ZooKeeper ({self.lease.describe(time.monotonic())}): "
                f"metadata changes wait until it is back; reads and writes go on")

    def answer_later(self, envelope: Envelope, header: Header, job: Callable[[], Any],
                     to_body: Callable[[Any], dict[str, Any]] | None = None) -> None:
        """Run ``job`` (ZooKeeper work) on the worker; answer the request with
        ``to_body(result)`` back on the loop. Refused at once without ZooKeeper."""
        self.check_session_ok()
        api = header.api_key

        def done(result: Any, error: BaseException | None) -> None:
            if isinstance(error, errors.FabricError):
                self.send_error(envelope, header, error)
            elif error is not None:
                log.warning("request %s failed: %s: %s", api, type(error).__name__, error)
                self.send_error(envelope, header, errors.RequestTimedOutError(
                    f"ZooKeeper did not complete the request: {type(error).__name__}: {error}"))
            else:
                self.send_response(envelope, header, to_body(result) if to_body is not None else result)

        self.zk_worker.submit(job, done)

    def delete_below(self, tp: TopicPartition, offset: int) -> int:
        """A coordinator's compaction (nodes/group_coordinator.py): delete the batches of a
        partition we lead that lie wholly below ``offset`` (and below the high watermark),
        whose records it has restated above it. Followers follow the new log start as they
        follow a queue's (nodes/follower.py). Returns the records deleted."""
        plog = self.logs.get(tp)
        if plog is None or tp not in self.leaders:
            return 0
        return plog.delete_below(min(offset, plog.high_watermark))

    def partitions_changed(self, tps: set[TopicPartition]) -> None:
        if tps:
            for listener in self.change_listeners:
                listener(self, tps)

    # -- answering -------------------------------------------------------------------------
    def send(self, envelope: Envelope, frames: list[Any]) -> bool:
        """False when the answer did not leave: the caller is gone or not reading."""
        try:
            send_multipart_nowait(self.sockets.router, envelope + frames)
        except zmq.ZMQError as exc:
            # The client went away (EHOSTUNREACH) or stopped reading (EAGAIN): it will
            # time out and retry; the write itself, if any, is already durable.
            log.debug("dropping a reply: %s", exc)
            return False
        return True

    def send_response(self, envelope: Envelope, header: Header, body: dict[str, Any], batches: list[Any] | None = None) -> bool:
        """False when the answer did not leave (``send``); a held one counts as sent."""
        frames = apis.encode_response(header, body, batches)
        if self.metrics is not None:
            self.metrics.observe_response(header.api_key, response_error_codes(body), frames_bytes(frames))
        if self.authz is not None and self.authz.hold(envelope, header, frames):
            return True  # secure mode: a throttled PRODUCE's response waits (nodes/authz.py)
        return self.send(envelope, frames)

    def send_error(self, envelope: Envelope, header: Header | None, exc: errors.FabricError) -> None:
        # Without a decodable header we still answer, with api 0 and correlation id 0, so
        # a confused client sees why instead of waiting for its timeout.
        correlation_id = exc.fields.get("correlation_id", 0)
        request_header = header or Header(0, 0, correlation_id if isinstance(correlation_id, int) else 0)
        frames = apis.encode_error_response(request_header, exc.code, exc.message)
        if self.metrics is not None:
            self.metrics.observe_response(request_header.api_key, [exc.code], frames_bytes(frames))
        self.send(envelope, frames)

    # -- lookups ---------------------------------------------------------------------------
    def leader_log(self, topic: str, partition: int) -> tuple[PartitionLog, LeaderReplica, zkl.TopicConfig]:
        """The log this node leads for ``topic/partition``, or the error that says why not."""
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
