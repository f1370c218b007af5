"""The ZooKeeper layout (docs/ZOOKEEPER.md), its codecs, and the routing-map cache.

Layout, below the root ``/fabric`` (a kazoo chroot in the connect string moves it)::

    /fabric/nodes/<node_id>                   ephemeral, JSON NodeInfo
    /fabric/topics/<topic>                    JSON TopicConfig
    /fabric/topics/<topic>/partitions         empty; its version moves with each queue created naming
                                              this topic its dead-letter topic (create_topic, delete_topic)
    /fabric/topics/<topic>/partitions/<p>     JSON PartitionState, written with version checks
    /fabric/controller                        ephemeral, the elected controller's node id

Znode data is JSON (UTF-8): this is the admin path; clients in other languages learn the
routing map from the METADATA API of any node and never need to read ZooKeeper.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Final

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    RolledBackError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import EventType, WatchedEvent
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE

from fabric import errors
from fabric.limits import (
    MESSAGE_BYTES_MAX_DEFAULT,
    PARTITIONS_MAX,
    REPLICATION_FACTOR_MAX,
    TOPIC_MESSAGE_BYTES_MAX,
    TOPIC_MESSAGE_BYTES_MIN,
    TOPIC_NAME_BYTES_MAX,
)
from fabric.protocol.apis import INTERNAL_TOPIC_PREFIX, is_internal_topic
from fabric.protocol.queues import (
    DEDUP_WINDOW_MS_DEFAULT,
    DEDUP_WINDOW_MS_MAX,
    MAX_DELIVERIES_DEFAULT,
    MAX_DELIVERIES_MAX,
    QUEUE_GROUP_RETENTION_MS_DEFAULT,
    QUEUE_GROUP_RETENTION_MS_MAX,
    QUEUE_GROUP_RETENTION_MS_MIN,
    QUEUE_MESSAGE_BYTES_DEFAULT,
    VISIBILITY_TIMEOUT_MS_DEFAULT,
    VISIBILITY_TIMEOUT_MS_MAX,
)
from fabric.wording import plural

ROOT = "/fabric"
NODES = f"{ROOT}/nodes"
TOPICS = f"{ROOT}/topics"
CONTROLLER = f"{ROOT}/controller"
PRODUCER_IDS = f"{ROOT}/producer_ids"
PRODUCER_ID_BLOCK = 1000

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_DECIMAL = re.compile(r"-?[0-9]+")  # a topic config integer as a user may write it
log = logging.getLogger("fabric.zk")

# -- how long anything waits for ZooKeeper ------------------------------------------------
# kazoo's defaults back off reconnects up to an hour and let a synchronous call wait for
# ever. A ZooKeeper that paused for 15 s then left a node asleep in a 25 s backoff, past its
# session, while its loop sat in a call without a timeout. These are the deliberate values.
#
# Reconnect: never give up (a node must come back whenever ZooKeeper does), but never
# sleep more than ZK_RECONNECT_DELAY_MAX_S between attempts, so a returning server is seen
# within about a second, well inside any session timeout.
ZK_RECONNECT_DELAY_S = 0.1  # first pause between connection attempts
ZK_RECONNECT_BACKOFF = 2.0  # each failed attempt doubles the pause ...
ZK_RECONNECT_DELAY_MAX_S = 1.0  # ... up to this
ZK_RECONNECT_JITTER = 0.4  # +-40 % so a cluster's nodes do not reconnect in lockstep
# Commands (kazoo's recipes retry through connection loss with this policy): a few tries
# within a deadline, then the error reaches the caller, which retries on its own schedule.
ZK_COMMAND_TRIES_MAX = 3
ZK_COMMAND_DELAY_S = 0.1
ZK_COMMAND_DELAY_MAX_S = 1.0
ZK_COMMAND_DEADLINE_S = 5.0
# Every call this module makes waits at most this long for its answer.
ZK_OP_TIMEOUT_S = 5.0
# A topic create or delete whose version check lost to a concurrent change reads and tries
# again, this many times in all (a queue and its dead-letter topic: create_topic).
TOPIC_TRANSACTION_TRIES = 5
# ZooKeeper refuses a request larger than its jute.maxbuffer (1 MiB - 1 by default) by
# dropping the connection it came on: a topic's creation is one request (a transaction),
# and 8,000 partitions of RF 3 made the node that asked lose its connection (its lease,
# its watches) and the create fail with a bare ConnectionLoss. Less 1 KiB for the header.
ZK_REQUEST_BYTES_MAX: Final[int] = 1024 * 1024 - 1 - 1024
# How long a client process waits for its first connection.
ZK_START_TIMEOUT_S = 15.0
# kazoo waits session_timeout / (number of servers listed) for a server to answer its
# connect request. With one server that is the whole session: a restarted server that takes
# the TCP connection but answers late (still loading) cost nodes their sessions in a fault
# audit (5 restarts in 20), though an attempt a moment later would have kept them. The
# server list counts as this many entries (make_client), so one attempt waits at most that
# fraction of the session.
ZK_CONNECT_ATTEMPTS_PER_SESSION = 3


def connection_retry() -> KazooRetry:
    return KazooRetry(max_tries=-1, delay=ZK_RECONNECT_DELAY_S, backoff=ZK_RECONNECT_BACKOFF,
                      max_jitter=ZK_RECONNECT_JITTER, max_delay=ZK_RECONNECT_DELAY_MAX_S)


def startup_retry() -> KazooRetry:
    """For a process's first, idempotent calls: through connection loss until ZK_START_TIMEOUT_S."""
    return KazooRetry(max_tries=-1, delay=ZK_COMMAND_DELAY_S, backoff=2.0, max_delay=ZK_COMMAND_DELAY_MAX_S,
                      deadline=ZK_START_TIMEOUT_S)


def command_retry() -> KazooRetry:
    return KazooRetry(max_tries=ZK_COMMAND_TRIES_MAX, delay=ZK_COMMAND_DELAY_S, backoff=2.0,
                      max_jitter=ZK_RECONNECT_JITTER, max_delay=ZK_COMMAND_DELAY_MAX_S, deadline=ZK_COMMAND_DEADLINE_S)


def make_client(hosts: str, session_timeout_s: float = 10.0, **kwargs: Any) -> KazooClient:
    """A kazoo client with Fabric's retry policy (not kazoo's hour-long backoff) and
    connect attempts of at most a third of the session each (``_Servers``)."""
    client = KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=connection_retry(),
                         command_retry=command_retry(), **kwargs)
    client.hosts = _Servers(client.hosts)
    return client


class _Servers(list[tuple[str, int]]):
    """kazoo's list of servers, which counts as at least ZK_CONNECT_ATTEMPTS_PER_SESSION
    entries. kazoo gives a connect request ``session_timeout / len(client.hosts)`` to be
    answered, and iterates the list itself to try each server once per round. Listing a
    server several times would shorten the wait too, but it also makes kazoo reconnect at
    once, without its backoff, after a connection drops (the next entry is the same server),
    which fights any other client attaching to the session."""

    def __len__(self) -> int:
        return max(super().__len__(), ZK_CONNECT_ATTEMPTS_PER_SESSION)


def wait(result: IAsyncResult, what: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> Any:
    """The value of an async kazoo call, waiting at most ``timeout_s``.

    kazoo's own errors (NoNodeError, BadVersionError, ConnectionLoss, SessionExpiredError)
    pass through; a call ZooKeeper did not answer in time raises RequestTimedOutError (retriable).
    """
    try:
        return result.get(timeout=timeout_s)
    except KazooTimeoutError:
        raise errors.RequestTimedOutError(f"ZooKeeper did not answer {what} within {timeout_s:g} s") from None


def get(zk: KazooClient, path: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> tuple[bytes, Any]:
    return wait(zk.get_async(path), f"get {path}", timeout_s)


def get_children(zk: KazooClient, path: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> list[str]:
    return wait(zk.get_children_async(path), f"get_children {path}", timeout_s)


def exists(zk: KazooClient, path: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> Any:
    return wait(zk.exists_async(path), f"exists {path}", timeout_s)


def set_data(zk: KazooClient, path: str, data: bytes, version: int = -1, timeout_s: float = ZK_OP_TIMEOUT_S) -> Any:
    return wait(zk.set_async(path, data, version=version), f"set {path}", timeout_s)


def create(zk: KazooClient, path: str, data: bytes = b"", *, ephemeral: bool = False, makepath: bool = False,
           timeout_s: float = ZK_OP_TIMEOUT_S) -> str:
    return wait(zk.create_async(path, data, ephemeral=ephemeral, makepath=makepath),
                f"create {path}", timeout_s)


def ensure_path(zk: KazooClient, path: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> None:
    wait(zk.ensure_path_async(path), f"ensure_path {path}", timeout_s)


def commit(tx: Any, what: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> list[Any]:
    return wait(tx.commit_async(), what, timeout_s)


ZK_PIPELINE_REQUESTS_MAX = 1_000  # requests get_many/set_many keep outstanding at once, each batch within its timeout


def _pipelined(requests: list[tuple[str, Callable[[], IAsyncResult]]], timeout_s: float) -> list[Any]:
    """Send each batch of requests before waiting for the first answer; each result, or the
    exception it raised, in order. A batch's answers share one deadline."""
    out: list[Any] = []
    for start in range(0, len(requests), ZK_PIPELINE_REQUESTS_MAX):
        pending = [(what, send()) for what, send in requests[start:start + ZK_PIPELINE_REQUESTS_MAX]]
        deadline = time.monotonic() + timeout_s
        for what, result in pending:
            try:
                out.append(wait(result, what, max(0.0, deadline - time.monotonic())))
            except Exception as exc:  # per item: one missing znode or stale version fails only itself
                out.append(exc)
    return out


def get_many(zk: KazooClient, paths: list[str], timeout_s: float = ZK_OP_TIMEOUT_S) -> list[Any]:
    """Read many znodes pipelined: every request of a batch goes out before the first answer
    is awaited, so it costs about one round trip instead of one per path (a controller
    electing leaders for a failed node's 667 partitions spent 19-31 s in serial reads and
    writes). Per path: ``(data, stat)`` or the exception (NoNodeError, RequestTimedOutError...)."""
    return _pipelined([(f"get {path}", functools.partial(zk.get_async, path)) for path in paths], timeout_s)


def set_many(zk: KazooClient, writes: list[tuple[str, bytes, int]], timeout_s: float = ZK_OP_TIMEOUT_S) -> list[Any]:
    """Version-checked writes of ``(path, data, version)``, pipelined like ``get_many``. Each
    is its own fence: a stale one fails alone (BadVersionError in its place), unlike a
    transaction, where one stale partition would undo the election of all the others."""
    return _pipelined([(f"set {path}", functools.partial(zk.set_async, path, data, version=version))
                       for path, data, version in writes], timeout_s)


class _QuietClose(logging.Filter):
    """kazoo logs "Connection dropped: socket connection broken" as a warning when a client
    closes its own session cleanly (the server hangs up first). Drop exactly that record
    while one of our clients is closing; real drops still show."""

    closing = 0

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.closing and record.getMessage().startswith("Connection dropped"))


_QUIET_CLOSE = _QuietClose()
logging.getLogger("kazoo.client").addFilter(_QUIET_CLOSE)


def close_client(client: KazooClient) -> None:
    """Stop and close a kazoo client without its spurious warning."""
    _QUIET_CLOSE.closing += 1
    try:
        client.stop()
        client.close()
    finally:
        _QUIET_CLOSE.closing -= 1


def close_client_within(client: KazooClient, timeout_s: float) -> bool:
    """``close_client`` on a thread, waited for at most ``timeout_s``; False if it did not
    end. For a process on its way out: kazoo waits for the server to confirm the close, as
    long as 10 s or the session timeout when ZooKeeper does not answer. Unconfirmed, the
    session (and its ephemeral znodes) ends by timing out, as after a crash; the thread
    ends by itself when kazoo gives up."""
    def close() -> None:
        with contextlib.suppress(Exception):  # never connected, or already gone: nothing to end
            close_client(client)

    closer = threading.Thread(target=close, name="zk-close", daemon=True)
    closer.start()
    closer.join(max(0.0, timeout_s))
    return not closer.is_alive()


def node_path(node_id: int) -> str:
    return f"{NODES}/{node_id}"


def topic_path(topic: str) -> str:
    return f"{TOPICS}/{topic}"


def partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    address: str  # the client ROUTER endpoint, e.g. tcp://127.0.0.1:9092
    replication_address: str = ""  # the replication PUB endpoint
    host: str = "127.0.0.1"
    pid: int = 0
    started_ms: int = 0
    metrics_address: str = ""  # the node's Prometheus endpoint (nodes/metrics.py); "" when off
    version: str = ""  # the Fabric release the node runs (fabric.__version__); "" from older nodes

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> NodeInfo:
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class TopicConfig:
    partitions: int
    replication_factor: int = 3
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1 keeps forever
    retention_bytes: int = -1  # per partition; -1 means no size limit
    message_bytes_max: int = MESSAGE_BYTES_MAX_DEFAULT
    min_insync: int = 2  # build() lowers it to the replication factor for rf < 2
    strict_order: bool = False
    unclean_leader_election: bool = False
    created_ms: int = 0
    # Strict-order topics: an idle partition's leader appends a tick after this long, so
    # ordered readers' watermark keeps moving (docs/DESIGN.md, "Strict-order topics").
    strict_order_tick_ms: int = 50
    # Queue mode (docs/QUEUES.md): set by `fabric queue create`; any topic may be consumed as
    # a queue, and these are then the defaults it is consumed with.
    queue: bool = False
    visibility_timeout_ms: int = VISIBILITY_TIMEOUT_MS_DEFAULT
    max_deliveries: int = MAX_DELIVERIES_DEFAULT
    dead_letter: str = ""  # a topic; "" drops poison and expired messages (counted)
    message_ttl_ms: int = 0  # 0: no queue-wide TTL
    max_messages: int = 0  # 0: no limit; past it sends get QUEUE_FULL (retriable)
    max_bytes: int = 0
    dedup_window_ms: int = DEDUP_WINDOW_MS_DEFAULT
    # A queue group idle this long (no receive, settle or live lease) is deleted.
    queue_group_retention_ms: int = QUEUE_GROUP_RETENTION_MS_DEFAULT

    # Keys a user may set at creation, with their parsers.
    SETTABLE = (
        "retention_ms",
        "retention_bytes",
        "message_bytes_max",
        "min_insync",
        "strict_order",
        "unclean_leader_election",
        "strict_order_tick_ms",
        "queue",
        "visibility_timeout_ms",
        "max_deliveries",
        "dead_letter",
        "message_ttl_ms",
        "max_messages",
        "max_bytes",
        "dedup_window_ms",
        "queue_group_retention_ms",
    )

    # Keys ALTER_TOPIC_CONFIGS may change later. Fixed: strict_order, queue and dead_letter
    # (what the data already written means), dedup_window_ms (a queue's log is trimmed by it).
    ALTERABLE = (
        "retention_ms",
        "retention_bytes",
        "message_bytes_max",
        "min_insync",
        "unclean_leader_election",
        "strict_order_tick_ms",
        "visibility_timeout_ms",
        "max_deliveries",
        "message_ttl_ms",
        "max_messages",
        "max_bytes",
        "queue_group_retention_ms",
    )

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> TopicConfig:
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def as_strings(self) -> dict[str, str]:
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in asdict(self).items()}

    @classmethod
    def build(cls, partitions: int, replication_factor: int, configs: dict[str, str], now_ms: int) -> TopicConfig:
        """Validate user input into a config; every refusal names the key and the rule."""
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise errors.InvalidPartitionsError(f"partitions={partitions} outside [1, {PARTITIONS_MAX}]")
        if not 1 <= replication_factor <= REPLICATION_FACTOR_MAX:
            raise errors.InvalidReplicationFactorError(
                f"replication_factor={replication_factor} outside [1, {REPLICATION_FACTOR_MAX}]"
            )
        values: dict[str, Any] = {}
        for key, raw in configs.items():
            if key not in cls.SETTABLE:
                raise errors.InvalidConfigError(f"unknown topic config {key!r}; known: {', '.join(cls.SETTABLE)}")
            if key == "dead_letter":
                if raw:
                    validate_topic_name(raw)
                    if is_internal_topic(raw):
                        # The leader writes dead letters (their key, value and headers the
                        # producers' own) with its node rights: into __queue_state or
                        # __consumer_offsets they would forge queue state or group offsets.
                        raise errors.InvalidQueueConfigError(
                            f"dead_letter {raw!r}: names starting with {INTERNAL_TOPIC_PREFIX!r} are Fabric's "
                            "internal topics, which cannot take dead letters")
                values[key] = raw
            elif key in ("strict_order", "unclean_leader_election", "queue"):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise errors.InvalidConfigError(f"{key} must be true or false, got {raw!r}")
                values[key] = raw.lower() in ("true", "1")
            else:
                # Plain ASCII decimal only: int() would also take " 2048", "1_000" and other
                # scripts' digits, which a config shown back by describe would not match.
                if _DECIMAL.fullmatch(raw) is None:
                    raise errors.InvalidConfigError(f"{key} must be a decimal integer, got {raw!r}")
                values[key] = int(raw)
                if not -(1 << 63) <= values[key] < 1 << 63:  # clients read configs as i64
                    raise errors.InvalidConfigError(f"{key}={raw[:40]} does not fit a 64-bit integer")
        values.setdefault("min_insync", min(2, replication_factor))
        if values.get("queue"):
            # A queue keeps its messages until they are consumed, with SQS-like message
            # sizes (docs/QUEUES.md), whoever creates it: the SDK and the CLI set these, and
            # a queue made with CREATE_TOPIC and queue=true alone kept them only 7 days.
            values.setdefault("retention_ms", -1)
            values.setdefault("message_bytes_max", QUEUE_MESSAGE_BYTES_DEFAULT)
        config = cls(partitions=partitions, replication_factor=replication_factor, created_ms=now_ms, **values)
        if not TOPIC_MESSAGE_BYTES_MIN <= config.message_bytes_max <= TOPIC_MESSAGE_BYTES_MAX:
            raise errors.InvalidConfigError("message_bytes_max must be within [1024, 67108864]")
        if not 1 <= config.min_insync <= replication_factor:
            raise errors.InvalidConfigError(
                f"min_insync={config.min_insync} must be within [1, replication_factor={replication_factor}]"
            )
        if config.retention_ms == 0 or config.retention_ms < -1:
            raise errors.InvalidConfigError("retention_ms must be positive or -1 (forever)")
        if config.retention_bytes == 0 or config.retention_bytes < -1:
            raise errors.InvalidConfigError("retention_bytes must be positive or -1 (no limit)")
        if not 10 <= config.strict_order_tick_ms <= 60_000:
            raise errors.InvalidConfigError("strict_order_tick_ms must be within [10, 60000]")
        config.check_queue_settings()
        return config

    def check_queue_settings(self) -> None:
        """The queue settings' bounds (docs/QUEUES.md), each refusal quoting its constant."""
        if not 0 < self.visibility_timeout_ms <= VISIBILITY_TIMEOUT_MS_MAX:
            raise errors.InvalidQueueConfigError(
                f"visibility_timeout_ms {self.visibility_timeout_ms} outside 1..VISIBILITY_TIMEOUT_MS_MAX "
                f"({VISIBILITY_TIMEOUT_MS_MAX} ms, 12 h)")
        if not 1 <= self.max_deliveries <= MAX_DELIVERIES_MAX:
            raise errors.InvalidQueueConfigError(
                f"max_deliveries {self.max_deliveries} outside 1..MAX_DELIVERIES_MAX ({MAX_DELIVERIES_MAX})")
        if not 0 < self.dedup_window_ms <= DEDUP_WINDOW_MS_MAX:
            raise errors.InvalidQueueConfigError(
                f"dedup_window_ms {self.dedup_window_ms} outside 1..DEDUP_WINDOW_MS_MAX ({DEDUP_WINDOW_MS_MAX} ms)")
        for name in ("message_ttl_ms", "max_messages", "max_bytes"):
            if getattr(self, name) < 0:
                raise errors.InvalidQueueConfigError(f"{name} must be >= 0 (0: no limit)")
        if not QUEUE_GROUP_RETENTION_MS_MIN <= self.queue_group_retention_ms <= QUEUE_GROUP_RETENTION_MS_MAX:
            raise errors.InvalidQueueConfigError(
                f"queue_group_retention_ms {self.queue_group_retention_ms} outside QUEUE_GROUP_RETENTION_MS_MIN.."
                f"QUEUE_GROUP_RETENTION_MS_MAX ({QUEUE_GROUP_RETENTION_MS_MIN}..{QUEUE_GROUP_RETENTION_MS_MAX} ms)")


@dataclass(frozen=True)
class PartitionState:
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    version: int = -1  # the znode version it was read at; the fence for the next write
    # A reassignment in progress (nodes/reassign.py): ``replicas`` is then the new list
    # followed by ``removing``; ``adding`` are new replicas not yet in the ISR's history.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    throttle_bytes_per_s: int = 0  # the adding replicas' catch-up fetch limit; 0 = none

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    def encode(self) -> bytes:
        data: dict[str, Any] = {"replicas": list(self.replicas), "leader": self.leader,
                                "leader_epoch": self.leader_epoch, "isr": list(self.isr)}
        if self.reassigning:  # absent otherwise: the znode reads as it always did
            data.update(adding=list(self.adding), removing=list(self.removing),
                        throttle_bytes_per_s=self.throttle_bytes_per_s)
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def decode(cls, partition: int, raw: bytes, version: int = -1) -> PartitionState:
        data = json.loads(raw)
        return cls(partition, tuple(data["replicas"]), int(data["leader"]), int(data["leader_epoch"]), tuple(data["isr"]),
                   version, tuple(data.get("adding", ())), tuple(data.get("removing", ())),
                   int(data.get("throttle_bytes_per_s", 0)))


@dataclass
class TopicRoute:
    name: str
    config: TopicConfig
    partitions: dict[int, PartitionState] = field(default_factory=dict)


def validate_topic_name(name: str) -> None:
    if not name or len(name.encode()) > TOPIC_NAME_BYTES_MAX or not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise errors.InvalidTopicError(
            f"invalid topic name {name!r}: 1 to {TOPIC_NAME_BYTES_MAX} characters of [A-Za-z0-9._-], "
            "not '.' or '..' (a topic is a ZooKeeper node of that name)"
        )


def ensure_layout(zk: KazooClient) -> None:
    """Create Fabric's top znodes if missing. Called as a process starts, when ZooKeeper
    may itself have just started: a lost connection is retried until ZK_START_TIMEOUT_S."""
    retry = startup_retry()
    for path in (ROOT, NODES, TOPICS):
        retry(ensure_path, zk, path)


def live_nodes(zk: KazooClient) -> dict[int, NodeInfo]:
    out: dict[int, NodeInfo] = {}
    for child in get_children(zk, NODES):
        try:
            raw, _ = get(zk, node_path(int(child)))
        except NoNodeError:
            continue
        info = NodeInfo.decode(raw)
        out[info.node_id] = info
    return out


def assign_replicas(topic: str, partitions: int, replication_factor: int, node_ids: list[int]) -> list[list[int]]:
    """Round robin over live nodes, starting at a per-topic offset so leaders spread."""
    ids = sorted(node_ids)
    if replication_factor > len(ids):
        raise errors.InvalidReplicationFactorError(
            f"replication_factor={replication_factor} but only {plural(len(ids), 'live node')}"
        )
    start = zlib.crc32(topic.encode()) % len(ids)
    return [[ids[(start + p + j) % len(ids)] for j in range(replication_factor)] for p in range(partitions)]


INCARNATION_EPOCHS: Final[int] = 1 << 30  # initial epochs repeat after 2^30 ms; 2^30 elections of headroom in an i32


def initial_leader_epoch(created_ms: int) -> int:
    """A new topic's first leader epoch, from its creation time rather than 0: a node that
    missed a delete and re-create of the topic (paused or cut off meanwhile) still leads the
    old incarnation, and equal epochs let it serve the old records to the new replicas'
    fetches and count their acks (they carry the epoch). Different epochs fence it
    (FENCED/UNKNOWN_LEADER_EPOCH) until it sees the new topic and wipes its old copy."""
    return created_ms % INCARNATION_EPOCHS


def create_op_bytes(zk: KazooClient, path: str, data: bytes) -> int:
    """What one create adds to a transaction on the wire (jute): the op's header (type,
    done, error), the path with the client's chroot, the data, the ACLs and the flags."""
    acls = zk.default_acl or OPEN_ACL_UNSAFE
    acl_bytes = 4 + sum(4 + 4 + len(acl.id.scheme.encode()) + 4 + len(acl.id.id.encode()) for acl in acls)
    return 9 + 4 + len((zk.chroot or "").encode()) + len(path.encode()) + 4 + len(data) + acl_bytes + 4


def check_transaction_bytes(name: str, partitions: int, request_bytes: int) -> None:
    """Refuse a topic transaction ZooKeeper would refuse by dropping our connection."""
    if request_bytes > ZK_REQUEST_BYTES_MAX:
        fit = partitions * ZK_REQUEST_BYTES_MAX // request_bytes
        raise errors.InvalidPartitionsError(
            f"topic {name!r}: {partitions:,} partitions need a ZooKeeper transaction of {request_bytes:,} bytes, more "
            f"than the {ZK_REQUEST_BYTES_MAX:,} ZooKeeper takes in one request (ZK_REQUEST_BYTES_MAX, its default "
            f"jute.maxbuffer); about {fit:,} fit: use fewer partitions, or several topics")


def create_topic(
    zk: KazooClient, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
) -> TopicConfig:
    """Create the topic config and every partition state in one ZooKeeper transaction.

    A queue's transaction also rewrites its dead-letter topic's ``partitions`` znode with
    the version it read (same bytes): the dead-letter topic must still be there when the
    queue appears, and a delete of it that looked for its queues before this commit fails
    its own version check and looks again (``delete_topic``)."""
    validate_topic_name(name)
    config = TopicConfig.build(partitions, replication_factor, configs, int(time.time() * 1000))
    # Any topic may be read in queue mode with its dead_letter: as its own, its poison
    # messages would come back for ever, whether it says queue=true or not.
    if config.dead_letter == name:
        raise errors.InvalidQueueConfigError(f"topic {name!r} cannot be its own dead-letter queue")
    for _ in range(TOPIC_TRANSACTION_TRIES):
        tx = zk.transaction()
        if config.dead_letter:
            # It must exist first (Admin.create_queue creates it before the queue): a queue whose
            # dead-letter topic is missing took sends and then, at its first poison message,
            # failed every receive of that partition until someone created the topic.
            try:
                raw, stat = get(zk, partitions_path(config.dead_letter))
            except NoNodeError:
                raise _no_dead_letter_topic(config.dead_letter) from None
            tx.set_data(partitions_path(config.dead_letter), raw, version=stat.version)
        nodes = live_nodes(zk)
        if not nodes:
            raise errors.LeaderNotAvailableError("no live nodes to host the topic")
        assignment = assign_replicas(name, partitions, replication_factor, list(nodes))
        tx.create(topic_path(name), config.encode())
        tx.create(partitions_path(name), b"")
        request_bytes = create_op_bytes(zk, topic_path(name), config.encode()) + create_op_bytes(zk, partitions_path(name), b"")
        for p, replicas in enumerate(assignment):
            state = PartitionState(p, tuple(replicas), replicas[0], initial_leader_epoch(config.created_ms), tuple(replicas))
            tx.create(partition_path(name, p), state.encode())
            request_bytes += create_op_bytes(zk, partition_path(name, p), state.encode())
        check_transaction_bytes(name, partitions, request_bytes)
        results = commit(tx, f"topic {name!r} transaction")
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return config
        if any(isinstance(r, NodeExistsError) for r in failures):
            raise errors.TopicAlreadyExistsError(f"topic {name!r} already exists")
        if config.dead_letter and any(isinstance(r, NoNodeError) for r in failures):
            raise _no_dead_letter_topic(config.dead_letter)  # deleted since it was read
        if not any(isinstance(r, BadVersionError) for r in failures):
            raise errors.UnknownServerError(f"creating topic {name!r} failed: {failures[0]!r}")
        # Another queue naming the same dead-letter topic was created meanwhile: again.
    raise errors.UnknownServerError(f"creating topic {name!r}: its dead-letter topic kept changing; try again")


def _no_dead_letter_topic(dead_letter: str) -> errors.InvalidQueueConfigError:
    return errors.InvalidQueueConfigError(
        f"dead-letter topic {dead_letter!r} does not exist: create it first "
        f"(fabric queue create {dead_letter}, or Admin.create_queue with dead_letter= does both)")


def dead_letter_users(zk: KazooClient, name: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> list[str]:
    """The topics whose dead-letter topic is ``name``, queues or not (any topic may be read
    in queue mode with its ``dead_letter``: deleted under a plain one, it left that one's
    reads failing on "dead-letter topic does not exist"), read from ZooKeeper itself (a
    node's watched copy of the topics lags: a queue created a moment ago is not in it yet)."""
    deadline = time.monotonic() + timeout_s  # for the whole scan, not per topic
    topics = get_children(zk, TOPICS, timeout_s)
    pending = [(topic, zk.get_async(topic_path(topic))) for topic in topics]
    users = []
    for topic, result in pending:
        try:
            raw, _stat = wait(result, f"get {topic_path(topic)}", max(0.0, deadline - time.monotonic()))
        except NoNodeError:  # deleted since the listing
            continue
        config = TopicConfig.decode(raw)
        if config.dead_letter == name:
            users.append(topic)
    return sorted(users)


def settled_copies(states: Iterable[PartitionState]) -> int:
    """The fewest copies any of ``states`` has for good: a moving partition counts the
    smaller of its old and new replica lists (its new replicas may still be catching up).
    A topic's ``replication_factor`` says what it was made with; a reassignment
    (``fabric topic reassign``) changes the copies, and this is what they are now."""
    return min(min(len(s.replicas) - len(s.adding), len(s.replicas) - len(s.removing)) for s in states)


def read_partition_states(zk: KazooClient, name: str, partitions: int) -> list[PartitionState]:
    """Partitions 0..``partitions``-1 of a topic, read now (pipelined), each with the
    version it was read at; raises the first read's exception (NoNodeError, a timeout)."""
    reads = get_many(zk, [partition_path(name, p) for p in range(partitions)])
    for read in reads:
        if isinstance(read, Exception):
            raise read
    return [PartitionState.decode(p, data, stat.version) for p, (data, stat) in enumerate(reads)]


def current_replication_factor(zk: KazooClient, name: str, config: TopicConfig) -> int:
    """``settled_copies`` of the topic's partitions, read now; the config's value when a
    partition state cannot be read (a topic being deleted, ZooKeeper's answer lost)."""
    try:
        states = read_partition_states(zk, name, config.partitions)
    except Exception:
        return config.replication_factor
    return settled_copies(states) if states else config.replication_factor


def add_partitions(zk: KazooClient, name: str, total: int) -> TopicConfig:
    """Grow a topic to ``total`` partitions: the config (version-checked) and the new
    partition states in one transaction. Existing partitions and their keys' placement
    are untouched; new ones are assigned round robin like at creation."""
    import dataclasses

    validate_topic_name(name)
    try:
        raw, stat = get(zk, topic_path(name))
    except NoNodeError:
        raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None
    config = TopicConfig.decode(raw)
    if config.strict_order:
        # Its ordered readers merge a fixed set of partitions by global ID: a partition
        # added later would hold IDs below what they already delivered (a reader would
        # have to place them earlier than records it handed out), or be skipped unseen.
        raise errors.InvalidPartitionsError(
            f"topic {name!r} is strict-order: its partition count is fixed at creation (create a new topic "
            "with more partitions and move producers to it)")
    if not config.partitions < total <= PARTITIONS_MAX:
        raise errors.InvalidPartitionsError(
            f"topic {name!r} has {config.partitions} partitions; the new total must be more, at most {PARTITIONS_MAX}"
        )
    # New partitions get the copies the topic has now, not what it was made with: one made
    # with 1 and moved to 3 by `fabric topic reassign` got new partitions of 1 copy.
    factor = current_replication_factor(zk, name, config)
    nodes = live_nodes(zk)
    assignment = assign_replicas(name, total, factor, list(nodes))
    grown = dataclasses.replace(config, partitions=total, replication_factor=factor)
    tx = zk.transaction()
    tx.set_data(topic_path(name), grown.encode(), version=stat.version)
    request_bytes = create_op_bytes(zk, topic_path(name), grown.encode())  # (a set is no larger than a create)
    for p in range(config.partitions, total):
        replicas = assignment[p]
        data = PartitionState(p, tuple(replicas), replicas[0], initial_leader_epoch(config.created_ms),
                              tuple(replicas)).encode()
        tx.create(partition_path(name, p), data)
        request_bytes += create_op_bytes(zk, partition_path(name, p), data)
    check_transaction_bytes(name, total - config.partitions, request_bytes)
    failures = [r for r in commit(tx, f"topic {name!r} transaction") if isinstance(r, Exception)]
    if failures:
        raise errors.InvalidPartitionsError(f"topic {name!r} changed while adding partitions; try again: {failures[0]!r}")
    return grown


# Shown by `fabric topic describe` beside the configs, so an operator may well try to alter
# them: say what changes them instead of "not a topic config".
_CHANGED_ELSEWHERE = {
    "partitions": "is changed with `fabric topic add-partitions` (Admin.create_partitions), not as a config",
    "replication_factor": "is changed by moving partitions to more or fewer nodes (`fabric topic reassign`), not as a config",
    "created_ms": "is set when the topic is created",
}


def _why_not_alterable(key: str) -> str:
    if key in _CHANGED_ELSEWHERE:
        return _CHANGED_ELSEWHERE[key]
    return "is fixed at creation" if key in TopicConfig.SETTABLE else "is not a topic config"


def alter_topic_config(zk: KazooClient, name: str, configs: dict[str, str]) -> TopicConfig:
    """Set some of a topic's configs (the rest keep their values), as Kafka's
    incrementalAlterConfigs: validated as at creation, written version-checked. Only the
    keys in ``TopicConfig.ALTERABLE``; the others shape data already written and are fixed."""
    validate_topic_name(name)
    if not configs:
        raise errors.InvalidConfigError("no config to set")
    for key in configs:
        if key not in TopicConfig.ALTERABLE:
            raise errors.InvalidConfigError(f"{key!r} {_why_not_alterable(key)}; alterable: {', '.join(TopicConfig.ALTERABLE)}")
    failures: list[Any] = []
    for _ in range(TOPIC_TRANSACTION_TRIES):
        try:
            raw, stat = get(zk, topic_path(name))
        except NoNodeError:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None
        config = TopicConfig.decode(raw)
        current = config.as_strings()
        merged = {key: current[key] for key in TopicConfig.SETTABLE} | configs
        # min_insync is checked against the copies the topic has now (a topic made with 1 and
        # moved to 3 could not be given min_insync 2), and the factor stored follows them. A
        # move to fewer copies committed after this read rewrites the config
        # (write_partition_state_with_config): the version check below then fails, and the
        # next try checks against the copies it left.
        factor = current_replication_factor(zk, name, config)
        altered = TopicConfig.build(config.partitions, factor, merged, config.created_ms)
        tx = zk.transaction()
        tx.set_data(topic_path(name), altered.encode(), version=stat.version)
        failures = [r for r in commit(tx, f"topic {name!r} transaction") if isinstance(r, Exception)]
        if not failures:
            return altered
        if any(isinstance(r, NoNodeError) for r in failures):
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        if not any(isinstance(r, BadVersionError) for r in failures):
            break
    raise errors.InvalidConfigError(f"topic {name!r} changed while its configs were set; try again: {failures[0]!r}")


def delete_topic(zk: KazooClient, name: str) -> None:
    """Delete a topic's znodes in one transaction; refused while a queue names it as its
    dead-letter topic. The ``partitions`` znode is deleted with the version read before
    that check, so a queue created meanwhile (``create_topic`` rewrites that znode) fails
    this transaction, and the next try finds the queue."""
    validate_topic_name(name)
    for _ in range(TOPIC_TRANSACTION_TRIES):
        try:
            children, stat = wait(zk.get_children_async(partitions_path(name), include_data=True),
                                  f"get_children {partitions_path(name)}")
        except NoNodeError:
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None
        users = dead_letter_users(zk, name)
        if users:  # their receives would fail at their next poison message
            raise errors.InvalidQueueConfigError(
                f"topic {name!r} is the dead-letter queue of {', '.join(users)}: delete those first")
        tx = zk.transaction()
        for child in children:
            tx.delete(f"{partitions_path(name)}/{child}")
        tx.delete(partitions_path(name), version=stat.version)
        tx.delete(topic_path(name))
        results = commit(tx, f"topic {name!r} transaction")
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return
        if any(isinstance(r, NoNodeError) for r in failures):
            raise errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        if not any(isinstance(r, (BadVersionError, NotEmptyError)) for r in failures):
            raise errors.UnknownServerError(f"deleting topic {name!r} failed: {failures[0]!r}")
        # A queue naming it was created, or a partition added, since the read: look again.
    raise errors.UnknownServerError(f"deleting topic {name!r}: it kept changing; try again")


def write_partition_state(zk: KazooClient, topic: str, state: PartitionState,
                          incarnation_ms: int | None = None) -> PartitionState:
    """Version-checked write: fails with BadVersionError if anyone wrote since ``state.version``.

    ``incarnation_ms``: the topic's ``created_ms`` the writer's state belongs to; a topic
    deleted and created again meanwhile fails the same way. The version alone cannot tell:
    a new topic's partition znodes start again at version 0, and a leader that missed the
    re-creation (paused) wrote its old term's state over the new topic's."""
    if incarnation_ms is not None:
        try:
            raw, _stat = get(zk, topic_path(topic))
        except NoNodeError:
            raise BadVersionError() from None
        if TopicConfig.decode(raw).created_ms != incarnation_ms:
            raise BadVersionError()
    stat = set_data(zk, partition_path(topic, state.partition), state.encode(), version=state.version)
    return dataclasses.replace(state, version=stat.version)


def commit_all(tx: Any, what: str, timeout_s: float = ZK_OP_TIMEOUT_S) -> list[Any]:
    """``commit`` a transaction that must succeed whole: its results, or the exception of
    the op that failed (BadVersionError, NoNodeError), not the RolledBackError of the
    others it undid."""
    results = commit(tx, what, timeout_s)
    failures = [r for r in results if isinstance(r, Exception)]
    if failures:
        raise next((r for r in failures if not isinstance(r, RolledBackError)), failures[0])
    return results


def write_partition_state_with_config(zk: KazooClient, topic: str, old: PartitionState, new: PartitionState,
                                      config: bytes, config_version: int) -> PartitionState:
    """Write ``new`` over ``old`` (version-checked, as ``write_partition_state``) in one
    transaction with the topic config it was decided against, read at ``config_version``
    (``config`` its data): a reassignment, checked against that config's ``min_insync``.
    The config is checked when ``new`` keeps at least ``old``'s copies (``settled_copies``),
    and written again unchanged, moving its version on, when it has fewer: a config write
    decided from the copies before this one (ALTER_TOPIC_CONFIGS setting ``min_insync``, the
    controller raising an internal topic's) then fails its own version check and decides
    again, rather than leaving ``min_insync`` above the partition's copies. Raises
    BadVersionError (the config or the partition changed since read) or NoNodeError (the
    topic was deleted)."""
    tx = zk.transaction()
    if settled_copies([new]) < settled_copies([old]):
        tx.set_data(topic_path(topic), config, version=config_version)
    else:
        tx.check(topic_path(topic), config_version)
    tx.set_data(partition_path(topic, new.partition), new.encode(), version=new.version)
    results = commit_all(tx, f"partition {topic}/{new.partition} transaction")
    return dataclasses.replace(new, version=results[-1].version)


def write_partition_states(zk: KazooClient, writes: list[tuple[str, PartitionState, int]]) -> list[Any]:
    """``write_partition_state`` for many partitions, pipelined: each ``(topic, state,
    incarnation_ms)`` written version-checked, its topic's ``created_ms`` checked first.
    Per write, in order: the state as written, or the exception (BadVersionError for a
    stale version or incarnation). A leader's ISR changes after a restart of a follower
    (667 at 2,000 partitions) were one job each, two round trips after another."""
    topics = sorted({topic for topic, _state, _incarnation in writes})
    configs = dict(zip(topics, get_many(zk, [topic_path(topic) for topic in topics]), strict=True))
    out: list[Any] = [None] * len(writes)
    checked = []
    for i, (topic, _state, incarnation_ms) in enumerate(writes):
        read = configs[topic]
        if isinstance(read, NoNodeError) or (
                not isinstance(read, Exception) and TopicConfig.decode(read[0]).created_ms != incarnation_ms):
            out[i] = BadVersionError()  # deleted, or deleted and created again: not our term's topic
        elif isinstance(read, Exception):
            out[i] = read
        else:
            checked.append(i)
    results = set_many(zk, [(partition_path(writes[i][0], writes[i][1].partition), writes[i][1].encode(),
                             writes[i][1].version) for i in checked])
    for i, result in zip(checked, results, strict=True):
        out[i] = result if isinstance(result, Exception) else dataclasses.replace(writes[i][1], version=result.version)
    return out


def allocate_producer_id_block(zk: KazooClient) -> tuple[int, int]:
    """Reserve [start, start + PRODUCER_ID_BLOCK) with a version-checked write.

    Two nodes racing both read the same version; one write wins and the other retries,
    so no id is ever handed out twice.
    """
    from kazoo.exceptions import BadVersionError

    ensure_path(zk, PRODUCER_IDS)
    for _ in range(100):
        raw, stat = get(zk, PRODUCER_IDS)
        start = int(json.loads(raw)["next"]) if raw else 0
        try:
            set_data(zk, PRODUCER_IDS, json.dumps({"next": start + PRODUCER_ID_BLOCK}).encode(), version=stat.version)
        except BadVersionError:
            continue
        return start, start + PRODUCER_ID_BLOCK
    raise errors.UnknownServerError("could not reserve a producer id block after 100 attempts")


class RoutingCache:
    """The routing map read from ZooKeeper and kept current with watches.

    Kazoo runs watch callbacks on its own thread; this class only updates dictionaries
    under a lock and calls ``on_change`` (which must be quick and must not block: the node
    uses it to post an event to its own loop).
    """

    def __init__(self, zk: KazooClient, on_change: Callable[[str], None] | None = None) -> None:
        self._zk = zk
        self._lock = threading.Lock()
        self._topics: dict[str, TopicRoute] = {}
        self._nodes: dict[int, NodeInfo] = {}
        self._watched_topics: set[str] = set()
        self._on_change = on_change
        self.controller_id = -1
        self.generation = 0
        self._closed = False
        # Set when a watch callback could not read what changed (connection lost halfway):
        # the owner calls resync() once ZooKeeper answers again. A callback that raised
        # would lose that event, so callbacks never raise.
        self.needs_resync = False
        self._partition_watches: dict[str, set[int]] = {}
        self._partition_watchers: dict[tuple[str, int], Callable[[WatchedEvent], None]] = {}
        # What changed since the node last applied the map (``take_changes``): the partitions
        # whose state a watch or this process updated, or, after anything else, everything.
        self._changed_partitions: set[tuple[str, int]] = set()
        self._changed_all = True

    def start(self) -> None:
        ensure_layout(self._zk)
        self._zk.ChildrenWatch(NODES, self._nodes_changed)
        self._zk.ChildrenWatch(TOPICS, self._topics_changed)
        self._zk.DataWatch(CONTROLLER, self._controller_changed)

    def close(self) -> None:
        self._closed = True

    # Snapshots for readers: copies, so callers never see a half-applied update.
    def topics(self) -> dict[str, TopicRoute]:
        with self._lock:
            return {name: TopicRoute(r.name, r.config, dict(r.partitions)) for name, r in self._topics.items()}

    def topic(self, name: str) -> TopicRoute | None:
        with self._lock:
            route = self._topics.get(name)
            return None if route is None else TopicRoute(route.name, route.config, dict(route.partitions))

    def nodes(self) -> dict[int, NodeInfo]:
        with self._lock:
            return dict(self._nodes)

    def incarnations(self) -> dict[str, int]:
        """Each topic's ``created_ms``, without copying its partitions."""
        with self._lock:
            return {name: route.config.created_ms for name, route in self._topics.items()}

    def partition(self, name: str, partition: int) -> tuple[TopicConfig, PartitionState] | None:
        """One partition's state and its topic's config, without copying the topic."""
        with self._lock:
            route = self._topics.get(name)
            state = None if route is None else route.partitions.get(partition)
            return None if route is None or state is None else (route.config, state)

    def take_changes(self) -> set[tuple[str, int]] | None:
        """The partitions whose state changed since the last call; None when something else
        changed too (nodes, topics, configs, a resync) or nothing was recorded: the caller
        then re-reads the whole map. A failover of 667 leaderships is 667 partition events,
        and re-reading every partition at each was most of a node's time (roles.apply_roles)."""
        with self._lock:
            changed, everything = self._changed_partitions, self._changed_all
            self._changed_partitions, self._changed_all = set(), False
        return None if everything or not changed else changed

    def resync(self) -> None:
        """Re-read the live nodes, the controller, every topic and partition state now
        (after a pause, a lost session or a failed watch callback, when events may have
        been missed). Newer versions replace cached ones."""
        self.needs_resync = False
        try:
            nodes = live_nodes(self._zk)
            raw_controller, _ = get(self._zk, CONTROLLER)
            controller_id = int(raw_controller) if raw_controller else -1
        except NoNodeError:
            controller_id = -1
        except Exception:
            self.needs_resync = True
            raise
        with self._lock:
            self._nodes = nodes
        self.controller_id = controller_id
        try:
            self._resync_topics()
        except Exception:
            self.needs_resync = True
            raise

    def _resync_topics(self) -> None:
        # Pipelined (get_many): one read per znode in turn was 2,200 round trips at 2,000
        # partitions, holding the node's one ZooKeeper worker (ISR writes, admin) meanwhile.
        names = set(get_children(self._zk, TOPICS))
        fresh: dict[str, TopicRoute] = {}
        for name, read in zip(sorted(names), get_many(self._zk, [topic_path(n) for n in sorted(names)]), strict=True):
            if isinstance(read, NoNodeError):
                continue  # deleted since the listing
            if isinstance(read, Exception):
                raise read
            fresh[name] = TopicRoute(name, TopicConfig.decode(read[0]))
        wanted = [(name, p) for name, route in fresh.items() for p in range(route.config.partitions)]
        reads = get_many(self._zk, [partition_path(name, p) for name, p in wanted])
        for (name, p), read in zip(wanted, reads, strict=True):
            if isinstance(read, NoNodeError):
                continue
            if isinstance(read, Exception):
                raise read
            raw_state, stat = read
            fresh[name].partitions[p] = PartitionState.decode(p, raw_state, stat.version)
        with self._lock:
            for name, route in fresh.items():
                cached = self._topics.get(name)
                if cached is None or cached.config.created_ms != route.config.created_ms:
                    # New, or deleted and created again: none of the old partition states
                    # apply (their versions, starting again at 0, cannot be compared).
                    self._topics[name] = route
                    continue
                cached.config = route.config
                for p, state in route.partitions.items():
                    old = cached.partitions.get(p)
                    if old is None or old.version < state.version:
                        cached.partitions[p] = state
            for gone in set(self._topics) - names:
                del self._topics[gone]
        self._watch_topics(names)
        for name, route in fresh.items():
            self._watch_partitions(name, route.config.partitions)
        self._changed("resync")

    def apply_partition_state(self, topic: str, state: PartitionState) -> None:
        """Record a state this process itself just wrote (its watch event follows later)."""
        with self._lock:
            route = self._topics.get(topic)
            if route is not None:
                old = route.partitions.get(state.partition)
                if old is None or old.version < state.version:
                    route.partitions[state.partition] = state
                    self._changed_partitions.add((topic, state.partition))

    def _changed(self, what: str, partition: tuple[str, int] | None = None) -> None:
        with self._lock:
            if partition is None:
                self._changed_all = True
            else:
                self._changed_partitions.add(partition)
        self.generation += 1
        if self._on_change is not None:
            self._on_change(what)

    def _nodes_changed(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        nodes: dict[int, NodeInfo] = {}
        with self._lock:
            previous = dict(self._nodes)
        for child in children:
            try:
                raw, _ = get(self._zk, node_path(int(child)))
            except (NoNodeError, ValueError):
                continue
            except Exception as exc:  # connection lost halfway: keep what we knew, re-read later
                log.warning("could not read node %s (%s); will re-read the routing map", child, exc)
                self.needs_resync = True
                with contextlib.suppress(ValueError):
                    if int(child) in previous:
                        nodes[int(child)] = previous[int(child)]
                continue
            info = NodeInfo.decode(raw)
            nodes[info.node_id] = info
        with self._lock:
            self._nodes = nodes
        self._changed("nodes")
        return None

    def _controller_changed(self, data: bytes | None, stat: Any, event: WatchedEvent | None = None) -> bool | None:
        if self._closed:
            return False
        try:
            self.controller_id = int(data) if data else -1
        except ValueError:
            self.controller_id = -1
        self._changed("controller")
        return None

    def _topics_changed(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        names = set(children)
        with self._lock:
            for gone in set(self._topics) - names:
                del self._topics[gone]
            self._watched_topics &= names
        self._watch_topics(names)
        self._changed("topics")
        return None

    def _watch_topics(self, names: set[str]) -> None:
        """Watch every topic in ``names`` not yet watched (a failed attempt is retried by
        the next resync)."""
        with self._lock:
            new = names - self._watched_topics
            self._watched_topics |= new
        for name in sorted(new):
            try:
                self._zk.DataWatch(topic_path(name), self._make_topic_watch(name))
            except Exception as exc:  # connection lost: watch it on the next resync
                log.warning("could not watch topic %s (%s); will re-read the routing map", name, exc)
                with self._lock:
                    self._watched_topics.discard(name)
                self.needs_resync = True

    def _watch_partitions(self, name: str, count: int) -> None:
        """Read and watch every partition of ``name`` not watched yet, all at once: each
        read is sent without waiting for the one before (kazoo's DataWatch waited for each
        answer on its one callback thread, so a failover's 667 changed partitions took 7 s
        to reach the routing map at about 10 ms a read on a busy node)."""
        with self._lock:
            watched = self._partition_watches.setdefault(name, set())
            new = [p for p in range(count) if p not in watched]
            watched.update(new)
        for p in new:
            self._read_partition(name, p)

    def _read_partition(self, name: str, partition: int) -> None:
        """Read one partition state and leave a one-shot watch on it; the answer arrives on
        kazoo's completion thread (``_partition_read``), and the watch's event reads again."""
        key = (name, partition)
        with self._lock:
            watcher = self._partition_watchers.get(key)
            if watcher is None:
                # One function per partition, for good: kazoo keeps a path's watchers in a set,
                # so a read made while another is out does not fire twice for one change.
                watcher = self._partition_watchers[key] = functools.partial(self._partition_event, name, partition)
        try:
            self._zk.get_async(partition_path(name, partition), watch=watcher).rawlink(
                functools.partial(self._partition_read, name, partition))
        except Exception as exc:  # the client is closing or closed: the next resync tries again
            self._unwatch(name, partition, exc)

    def _partition_event(self, name: str, partition: int, event: WatchedEvent) -> None:
        if self._closed:
            return
        if event.type == EventType.CHANGED:
            self._read_partition(name, partition)
        elif event.type == EventType.DELETED:
            with self._lock:
                route = self._topics.get(name)
                if route is not None:
                    route.partitions.pop(partition, None)
                self._partition_watches.get(name, set()).discard(partition)
                self._partition_watchers.pop((name, partition), None)
        else:  # the connection dropped (kazoo forgets every watch): read again once it is back
            self._unwatch(name, partition, None)

    def _forget_partitions(self, name: str) -> None:
        """(Under the lock.) A topic deleted, or created again: its partitions are read afresh."""
        self._partition_watches.pop(name, None)
        for key in [key for key in self._partition_watchers if key[0] == name]:
            del self._partition_watchers[key]

    def _unwatch(self, name: str, partition: int, error: BaseException | None) -> None:
        """Forget the watch on one partition, and have the owner resync (which watches it again)."""
        if error is not None:
            log.warning("could not watch %s/%d (%s); will re-read the routing map", name, partition, error)
        with self._lock:
            self._partition_watches.get(name, set()).discard(partition)
        self.needs_resync = True

    def _partition_read(self, name: str, partition: int, result: IAsyncResult) -> None:
        if self._closed:
            return
        if not result.successful():
            if isinstance(result.exception, NoNodeError):  # deleted: its topic's watch says more
                with self._lock:
                    route = self._topics.get(name)
                    if route is not None:
                        route.partitions.pop(partition, None)
                    self._partition_watches.get(name, set()).discard(partition)
                return
            self._unwatch(name, partition, result.exception)  # connection trouble
            return
        data, stat = result.value
        state = PartitionState.decode(partition, data, stat.version)
        with self._lock:
            route = self._topics.get(name)
            if route is None:
                return
            old = route.partitions.get(partition)
            if old is not None and old.version >= state.version:
                return  # a duplicate delivery, or older than what we hold
            route.partitions[partition] = state
        self._changed(f"partition:{name}:{partition}", (name, partition))

    def _make_topic_watch(self, name: str) -> Callable[..., bool | None]:

        def topic_data(data: bytes | None, stat: Any, event: WatchedEvent | None = None) -> bool | None:
            if self._closed:
                return False
            if data is None or (event is not None and event.type == EventType.DELETED):
                with self._lock:
                    self._topics.pop(name, None)
                    self._watched_topics.discard(name)
                    self._forget_partitions(name)
                self._changed(f"topic:{name}")
                return False  # stop watching; a re-created topic gets a fresh watch
            config = TopicConfig.decode(data)
            with self._lock:
                route = self._topics.get(name)
                reborn = route is not None and route.config.created_ms != config.created_ms
                if route is None or reborn:
                    # Deleted and created again while we were not looking (a pause): the old
                    # partition states must go, not be mixed with the new config, and the
                    # new states be read afresh (an event for one could have been dropped
                    # as older than the old state's version).
                    self._topics[name] = TopicRoute(name, config)
                else:
                    route.config = config
                if reborn:
                    self._forget_partitions(name)
            self._watch_partitions(name, config.partitions)
            self._changed(f"topic:{name}")
            return None

        return topic_data


ZK_WORK_QUEUE_MAX = 1_000  # ZooKeeper jobs waiting for the worker before submit() refuses more


class Worker:
    """Runs blocking ZooKeeper work off an event loop, and hands the results back to it.

    The loop calls ``submit(job, done)``: ``job()`` runs on this worker's thread (it may make
    bounded ZooKeeper calls); ``done(result, error)`` runs later on the loop's own thread,
    when the loop calls ``run_completions()``, so it may touch loop-owned state. ``wake`` is
    called after each job (the node posts to its inproc wake socket). The queue is bounded
    (ZK_WORK_QUEUE_MAX): a full queue refuses at once rather than growing; ``stop()`` ends
    the thread within ``timeout_s`` plus the job it is in (each call is bounded).
    """

    def __init__(self, wake: Callable[[], None], name: str = "zk-worker", queue_max: int = ZK_WORK_QUEUE_MAX) -> None:
        import queue

        self._jobs: queue.Queue[tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]] | None] = (
            queue.Queue(maxsize=queue_max))
        self._done: list[tuple[Callable[[Any, BaseException | None], None], Any, BaseException | None]] = []
        self._done_lock = threading.Lock()
        self._wake = wake
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def submit(self, job: Callable[[], Any], done: Callable[[Any, BaseException | None], None]) -> None:
        """Queue ``job``; raises NodeNotReadyError (retriable) if the queue is full."""
        import queue

        try:
            self._jobs.put_nowait((job, done))
        except queue.Full:
            raise errors.NodeNotReadyError(
                f"{self._jobs.maxsize} ZooKeeper operations already queued (ZK_WORK_QUEUE_MAX); try again"
            ) from None

    def run_completions(self) -> int:
        """On the loop's thread: call ``done`` for every finished job. Returns how many."""
        with self._done_lock:
            finished, self._done = self._done, []
        for done, result, error in finished:
            done(result, error)
        return len(finished)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = job()
            except Exception as exc:  # handed to the loop, which decides what it means
                error = exc
            with self._done_lock:
                self._done.append((done, result, error))
            self._wake()

    def stop(self, timeout_s: float = ZK_OP_TIMEOUT_S) -> None:
        import queue

        while True:  # make room for the sentinel: queued jobs are dropped, their callers gone
            try:
                self._jobs.put_nowait(None)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._jobs.get_nowait()
        self._thread.join(timeout_s)
