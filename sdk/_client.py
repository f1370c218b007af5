"""Connections, bootstrap and the client's view of the routing map.

Each SDK object owns its sockets and uses them from one thread (ZeroMQ sockets are not
thread-safe): the producer from its sender thread, the consumer and admin from the
caller's thread.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from fabric import errors
from fabric.bootstrap import resolve_bootstrap
from fabric.limits import NAMES_PER_REQUEST_MAX
from fabric.protocol.apis import ApiKey
from fabric.transport import DEFAULT_REQUEST_TIMEOUT_MS, Connections

log = logging.getLogger("fabric.client")

__all__ = ["DEFAULT_REQUEST_TIMEOUT_MS", "Bootstrap", "ClusterMetadata", "Connections", "MetadataClient",
           "PartitionMetadata", "TopicMetadata", "TopicPartition"]

METADATA_TIMEOUT_MS = 5_000
# The session of the short-lived ZooKeeper client that reads the live nodes from a zk://
# bootstrap: its connect attempts last a third of it (fabric.zk.make_client).
BOOTSTRAP_SESSION_S = METADATA_TIMEOUT_MS / 1000
# A node that did not answer is asked last for this long: a killed node stays in the
# routing map until its session expires, and asking it first cost every refresh a wait.
UNANSWERED_LAST_S = 30.0
METADATA_QUICK_CONNECT_MS = 100  # the first pass of a refresh: how long one node may take to accept
# ... and to answer: a live node answers METADATA in milliseconds, while a stopped one
# (SIGSTOP, a frozen VM) still accepts connections (the kernel does) and never answers; a
# producer's leader recheck asked such a follower first and held its sender thread for the
# whole METADATA_TIMEOUT_MS, stalling every acknowledgement (tests/fault/test_more_faults.py).
METADATA_QUICK_ANSWER_MS = 500
METADATA_CONNECT_MS = 1_000  # the later passes (Connections.send's own default)
# Once every address known has failed to answer, a client asks the bootstrap where the
# nodes are now at most this often: with every node down (not moved), each refresh would
# otherwise open a ZooKeeper session.
REDISCOVER_INTERVAL_S = 2.0
# A partition just added reaches each node by that node's own ZooKeeper watch, so the node
# asked for metadata may not have heard of it yet while another node (or describe_topic)
# already lists it: a client asks again for this long before it calls the partition
# unknown (Kafka's producer waits up to max.block.ms for the same reason).
PARTITION_LEARN_WAIT_MS = 3_000
PARTITION_LEARN_PAUSE_S = 0.05  # between those asks


@dataclass(frozen=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


@dataclass(frozen=True)
class PartitionMetadata:
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: tuple[PartitionMetadata, ...]
    message_bytes_max: int
    strict_order: bool = False

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass
class ClusterMetadata:
    nodes: dict[int, str] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    controller_id: int = -1
    fetched_at: float = 0.0  # monotonic seconds

    def leader_address(self, topic: str, partition: int) -> str | None:
        meta = self.topics.get(topic)
        # Not ``partition >= len``: a negative partition (from a node's answer, such as an
        # OFFSET_FETCH or an assignment) indexed from the end, or raised IndexError.
        if meta is None or not 0 <= partition < len(meta.partitions):
            return None
        return self.nodes.get(meta.partitions[partition].leader)


def host_port(address: str, *, chroot: bool = False) -> tuple[str, int]:
    """(host, port) of one bootstrap address, its scheme (``zk://``, ``tcp://``) left out;
    with ``chroot`` a ZooKeeper chroot path after the port is dropped. Pure: ValueError
    naming the address when it is not HOST:PORT (the CLI says the same, fabric/cli/_common.py)."""
    rest = address.rpartition("://")[2]
    if chroot:
        rest = rest.split("/", 1)[0]
    host, colon, port = rest.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT (zk://HOST:PORT or tcp://HOST:PORT)")
    return host.strip("[]"), int(port)


class Bootstrap:
    """``tcp://h:p,tcp://h:p`` (or ``h:p,h:p``): node addresses; ``zk://h:p[/chroot]``:
    ZooKeeper, from which the live nodes' addresses are read. ``None``: ``$FABRIC_BOOTSTRAP``,
    else the cluster ``fabric up`` recorded (fabric/bootstrap.py; ConfigError if neither)."""

    def __init__(self, spec: str | Iterable[str] | None = None) -> None:
        if spec is None:
            found, origin = resolve_bootstrap(None)
            try:
                self._parse(found)
            except ValueError as exc:  # the caller wrote no address: say where this one came from
                raise ValueError(f"{exc} (from {origin})") from None
        else:
            self._parse(spec)

    def _parse(self, spec: str | Iterable[str]) -> None:
        if isinstance(spec, str):
            parts = [p.strip() for p in spec.split(",") if p.strip()]
        elif isinstance(spec, Iterable) and not isinstance(spec, bytes):
            parts = []
            for p in spec:
                if not isinstance(p, str):
                    raise TypeError(f"each bootstrap address must be a str, got {type(p).__name__} {p!r:.60}")
                if p.strip():
                    parts.append(p.strip())
        else:
            raise TypeError(f"bootstrap must be a str such as 'zk://HOST:PORT', got {type(spec).__name__} {spec!r:.60}")
        if not parts:
            raise ValueError("bootstrap is empty: give node addresses or zk://host:port")
        # The addresses as one string: what clients made from this one are given (sdk.Client's
        # producers), so that they reach the cluster it found even if the environment changes.
        self.text = ",".join(parts)
        self.zk: str | None = None
        self.addresses: list[str] = []
        is_zk = parts[0].startswith("zk://")
        for index, part in enumerate(parts):
            # Checked here, where every client starts: ZeroMQ would otherwise raise a bare
            # ZMQError ("Invalid argument") on the first connect, far from the cause.
            scheme = part.rpartition("://")[0]
            if is_zk and scheme not in ("zk", ""):
                raise ValueError(f"bootstrap {part!r}: give either ZooKeeper (zk://) or node addresses, not both")
            if not is_zk and scheme not in ("tcp", "ipc", "inproc", ""):
                raise ValueError(f"bootstrap {part!r}: use zk://HOST:PORT for ZooKeeper or tcp://HOST:PORT for nodes")
            if scheme in ("ipc", "inproc"):
                continue  # a path or a name, not HOST:PORT
            try:
                host_port(part, chroot=is_zk and index == len(parts) - 1)
            except ValueError as exc:
                raise ValueError(f"bootstrap {exc}") from None
        if is_zk:
            self.zk = ",".join(p.removeprefix("zk://") for p in parts)
        else:
            self.addresses = [p if "://" in p else f"tcp://{p}" for p in parts]

    def node_addresses(self, deadline_s: float | None = None) -> list[str]:
        """The live nodes' addresses, read from ZooKeeper within METADATA_TIMEOUT_MS (and
        by ``deadline_s``, ``time.monotonic()``, when given) plus one connect attempt
        (BOOTSTRAP_SESSION_S / 3); NoBrokersAvailableError if ZooKeeper does not answer."""
        if self.zk is None:
            return list(self.addresses)
        from kazoo.exceptions import KazooException, NoNodeError

        from fabric import zk as zkl

        wait_s = METADATA_TIMEOUT_MS / 1000
        if deadline_s is not None:
            wait_s = min(wait_s, deadline_s - time.monotonic())
            if wait_s <= 0:  # a client would still wait out a connect attempt in its stop()
                raise errors.NoBrokersAvailableError(f"no time left to ask ZooKeeper {self.zk} for the live nodes")
        # Fabric's client (its connect attempts last a third of its session), not kazoo's
        # default: a start that times out stops the client, which waits for the connect
        # attempt under way, and kazoo's default attempt with ZooKeeper paused lasted its
        # whole 10 s session: every refresh that asked the bootstrap took 15 s, and a
        # producer's close() waited 10 s for its sender thread and left it running.
        client = zkl.make_client(self.zk, session_timeout_s=BOOTSTRAP_SESSION_S)
        try:
            with warnings.catch_warnings():  # kazoo warns of a missing chroot; said below instead
                warnings.simplefilter("ignore", UserWarning)
                client.start(timeout=wait_s)
        except Exception as exc:
            zkl.close_client(client)  # a client left running would retry in the background
            raise errors.NoBrokersAvailableError(
                f"ZooKeeper {self.zk} did not answer within {wait_s:.1f} s: {exc or 'timed out'}") from exc
        try:
            return [n.address for _, n in sorted(zkl.live_nodes(client).items())]
        except NoNodeError:
            raise errors.NoBrokersAvailableError(
                f"no Fabric cluster at zk://{self.zk}: ZooKeeper has no {zkl.NODES} there (a mistyped chroot? "
                "`fabric up` prints the bootstrap address)") from None
        except (KazooException, errors.RequestTimedOutError) as exc:
            # Gone between the connect and the reads: an outage, as above (a raw kazoo
            # error here is no FabricError, and killed the producer's sender thread).
            raise errors.NoBrokersAvailableError(f"ZooKeeper {self.zk} did not answer: {exc!r}") from exc
        finally:
            zkl.close_client(client)


# While a request stays unanswered, ask where its partitions are led this often: a dead
# leader is replaced one ZooKeeper session timeout after it died, and each interval between
# rechecks adds to a failover.
LEADER_RECHECK_INTERVAL_S = 0.25
# A request to a node whose connection dropped (it stopped or died) is suspect at once, not
# after the usual wait, for this long after the drop.
DROPPED_SUSPECT_S = 5.0


class DroppedNodes:
    """Node addresses whose connection dropped recently, from the sockets' monitors.

    A node that stops or dies closes its end at once (the kernel does it for a killed
    process), long before a request to it times out: producers and consumers use this to
    look for a new leader right away."""

    def __init__(self) -> None:
        self._dropped_at: dict[str, float] = {}

    def update(self, conns: Connections, now: float) -> dict[str, float]:
        for address in conns.take_disconnected():
            self._dropped_at[address] = now
        if self._dropped_at:
            self._dropped_at = {a: t for a, t in self._dropped_at.items() if now - t < DROPPED_SUSPECT_S}
        return self._dropped_at


class MetadataClient:
    """Fetches the routing map from any reachable node, trying bootstrap addresses in turn."""

    def __init__(self, bootstrap: Bootstrap, connections: Connections) -> None:
        self.bootstrap = bootstrap
        self.connections = connections
        self.metadata = ClusterMetadata()
        # Topics the last METADATA answer listing them listed with an error (their wire
        # code), until one lists them without: ``topic()`` raises that error for a topic
        # it has no map of, rather than calling every one of them unknown.
        self.topic_errors: dict[str, int] = {}
        self._known: list[str] = []
        self._unanswered: dict[str, float] = {}  # address -> when it last failed to answer
        self._rediscovered_s = -math.inf

    @property
    def denied(self) -> set[str]:
        """Topics a secure cluster refused to describe to us (AUTHORIZATION_FAILED)."""
        return {name for name, code in self.topic_errors.items() if code == errors.AuthorizationFailedError.code}

    def candidates(self, avoid: Iterable[str] = (), deadline_s: float | None = None) -> list[str]:
        """Addresses to ask, those that recently failed to answer (or are in ``avoid``) last;
        the bootstrap is read (by ``deadline_s``) when none is known yet."""
        seen = list(dict.fromkeys([*self.metadata.nodes.values(), *self._known]))
        if not seen:
            if self._bootstrap_read_recently():
                return []  # it listed no node just now (every node down): not a session per refresh
            self._known = self._read_bootstrap(deadline_s)
            seen = list(self._known)
        now = time.monotonic()
        suspects = set(avoid) | {a for a, t in self._unanswered.items() if now - t < UNANSWERED_LAST_S}
        return sorted(seen, key=lambda a: a in suspects)  # stable: the map's order otherwise

    def unanswered(self, address: str) -> None:
        """``address`` failed to answer: ask it last for UNANSWERED_LAST_S."""
        self._unanswered[address] = time.monotonic()

    def answered(self, address: str) -> None:
        self._unanswered.pop(address, None)

    def all_unanswered(self) -> bool:
        """Whether every address known failed to answer within UNANSWERED_LAST_S (the nodes
        may all have moved: ``rediscover_if_lost`` asks the bootstrap)."""
        now = time.monotonic()
        known = set(self.metadata.nodes.values()) | set(self._known)
        return bool(known) and all(now - self._unanswered.get(a, -math.inf) < UNANSWERED_LAST_S for a in known)

    def _bootstrap_read_recently(self) -> bool:
        return time.monotonic() - self._rediscovered_s < REDISCOVER_INTERVAL_S

    def _read_bootstrap(self, deadline_s: float | None) -> list[str]:
        """``bootstrap.node_addresses``, counted for REDISCOVER_INTERVAL_S only when there
        was time left to ask: a re-read whose bound the stale addresses had used up
        (its last pass) raised at once, yet counted, so the next re-read did not ask
        first either, and members of a five-node cluster went on asking dead addresses
        for 30 s after every node restarted (until those addresses stopped counting as
        failed)."""
        if deadline_s is None or deadline_s > time.monotonic():
            self._rediscovered_s = time.monotonic()
        return self.bootstrap.node_addresses(deadline_s)

    def rediscover_if_lost(self, deadline_s: float | None = None) -> bool:
        """Once every address known has failed to answer, the live nodes' addresses from the
        bootstrap (by ``deadline_s``, at most every REDISCOVER_INTERVAL_S) replace them;
        whether that happened. Every node may have restarted elsewhere (``port = 0``, new
        hosts): a refresh asks the bootstrap only after two passes over the known
        addresses (a connect wait of up to a second each), and a call's bound (a poll's
        timeout plus POLL_WORK_MS) did not reach that pass with five stale addresses, so a
        consumer asked the same dead addresses for ever."""
        if not self.all_unanswered() or self._bootstrap_read_recently():
            return False
        try:
            self._rediscover(deadline_s)
        except errors.FabricError:
            return False  # ZooKeeper away too: the addresses known are still the best there are
        return True

    def refresh(self, topics: list[str] | None = None, *, timeout_ms: int = METADATA_TIMEOUT_MS,
                avoid: Iterable[str] = (), deadline_s: float | None = None) -> ClusterMetadata:
        """The routing map from the first node that answers; ``avoid``: addresses suspected
        dead (a leader that stopped answering), asked only if no other node answers.
        ``deadline_s`` (``time.monotonic()``) bounds the whole refresh, every pass and node
        included: a producer's sender thread must get back to its delivery timeouts, and
        without it a cluster that accepts connections but never answers (paused nodes, a
        partition) held it for about 3 passes x 3 nodes x ``timeout_ms``."""
        last: Exception | None = None
        # More topics than a node answers by name (NAMES_PER_REQUEST_MAX): ask for them all.
        asked = list(topics) if topics and len(topics) <= NAMES_PER_REQUEST_MAX else []
        self.rediscover_if_lost(deadline_s)
        # Any live node can answer, so the first pass gives each one only a short while to
        # take the request and answer it: a dead or stopped node (the usual reason for a
        # refresh) must not cost a whole wait before the next one is asked. Then the
        # patient passes.
        passes = ((lambda: self.candidates(avoid, deadline_s), METADATA_QUICK_CONNECT_MS,
                   min(timeout_ms, METADATA_QUICK_ANSWER_MS)),
                  (lambda: self.candidates(avoid, deadline_s), METADATA_CONNECT_MS, timeout_ms),
                  (lambda: [] if self._bootstrap_read_recently() else self._rediscover(deadline_s),
                   METADATA_CONNECT_MS, timeout_ms))
        for candidates_of, wait_connect_ms, answer_ms in passes:
            if deadline_s is not None and time.monotonic() >= deadline_s:
                break  # before _rediscover too, which waits for ZooKeeper
            for address in candidates_of():
                request_ms, connect_ms = answer_ms, wait_connect_ms
                if deadline_s is not None:
                    left_ms = math.ceil((deadline_s - time.monotonic()) * 1000)
                    if left_ms <= 0:
                        last = errors.RequestTimedOutError("metadata refresh ran out of its time")
                        break
                    request_ms, connect_ms = min(request_ms, left_ms), min(connect_ms, left_ms)
                try:
                    message = self.connections.request(
                        address, ApiKey.METADATA, {"topics": asked}, timeout_ms=request_ms,
                        wait_connect_ms=connect_ms,
                    )
                except errors.FabricError as exc:
                    last = exc
                    self.unanswered(address)
                    continue
                self.answered(address)
                self.metadata = self._parse(message.body, asked)
                return self.metadata
        if isinstance(last, (errors.AuthenticationFailedError, errors.AuthorizationFailedError)):
            raise last  # a refusal, not an outage: say so (docs/SECURITY.md)
        if last is None:  # nobody was asked: say why rather than "(last error: None)"
            why = ("the call's time ran out before any node was asked"
                   if deadline_s is not None and time.monotonic() >= deadline_s
                   else "no node address is known: the bootstrap lists none and none is cached")
            raise errors.NoBrokersAvailableError(f"no node answered a metadata request ({why})")
        raise errors.NoBrokersAvailableError(f"no node answered a metadata request (last error: {last})")

    def _rediscover(self, deadline_s: float | None = None) -> list[str]:
        # Forget the cached node addresses only once the bootstrap answered: while
        # ZooKeeper is away, the routing map we have is the best there is. Every read of
        # the bootstrap counts for REDISCOVER_INTERVAL_S: once every node's registration
        # expired it lists none, and each refresh (every poll, every producer retry) then
        # opened a ZooKeeper session of its own, three per refresh, dozens a second.
        known = self._read_bootstrap(deadline_s)
        if not known and (self.metadata.nodes or self._known):
            # None registered (every node down past its session, or all re-registering
            # after a ZooKeeper pause expired their sessions): an empty map would only
            # send every refresh back to the bootstrap; the addresses known may answer.
            return list(dict.fromkeys([*self.metadata.nodes.values(), *self._known]))
        # A new object, not the old one cleared: readers cache what they derived from
        # ``self.metadata`` for as long as it is the same object (the consumer's fetch plan).
        self.metadata = replace(self.metadata, nodes={})
        self._known = known
        return list(self._known)

    def _parse(self, body: dict[str, Any], asked: list[str]) -> ClusterMetadata:
        """The map from a METADATA answer to a request for ``asked`` (every topic: empty)."""
        nodes = {n["node_id"]: n["address"] for n in body["nodes"]}
        merge = bool(asked)
        topics = dict(self.metadata.topics) if merge else {}
        # A topic the answer does not list (an answer for every topic lists only those the
        # node knows, and a secure cluster's only those the principal may describe) has no
        # error of its own any more: unknown.
        listed = {t["name"] for t in body["topics"]}
        for name in [n for n in (asked if merge else list(self.topic_errors)) if n not in listed]:
            self.topic_errors.pop(name, None)
        for t in body["topics"]:
            known = self.metadata.topics.get(t["name"])
            if t["error"]:
                self.topic_errors[t["name"]] = t["error"]
            if t["error"] and errors.error_for_code(t["error"]).retriable:
                # A passing state (an election, a node still learning a topic just created
                # or grown, a node starting): the map known is kept, and a topic without
                # one waits (a consumer's assign(), a producer's max_block_ms).
                if known is not None:
                    topics[t["name"]] = known
                continue
            numbers = [p["partition"] for p in t["partitions"]]
            if not t["error"] and (not numbers or numbers != list(range(len(numbers)))):
                # Partitions are looked up by position (leader_address), and a topic has at
                # least one: an answer listing none (a producer's partitioner divided by
                # zero), or out of order, with gaps or twice, would route records to the
                # wrong leaders. Not trusted: as a node still learning the topic.
                log.warning("metadata answer lists topic %r with partitions %s: ignored", t["name"], numbers[:20])
                if known is not None:
                    topics[t["name"]] = known
                else:
                    topics.pop(t["name"], None)
                continue
            if t["error"]:
                # Not retriable (no such topic, a principal refused it, ...): the topic is
                # forgotten, and ``topic()`` raises that error (``topic_error``).
                topics.pop(t["name"], None)
                continue
            self.topic_errors.pop(t["name"], None)
            topics[t["name"]] = TopicMetadata(
                t["name"],
                tuple(
                    PartitionMetadata(p["partition"], p["leader"], p["leader_epoch"], tuple(p["replicas"]), tuple(p["isr"]))
                    for p in t["partitions"]
                ),
                t["message_bytes_max"],
                bool(t["strict_order"]),
            )
        return ClusterMetadata(nodes, topics, body["controller_id"], time.monotonic())

    def topic(self, name: str, *, refresh_if_missing: bool = True) -> TopicMetadata:
        """The map of topic ``name``, asked for when the map has none (``refresh_if_missing``).
        Without one, the error METADATA listed the topic with (``topic_error``): callers
        that may wait ask again on a retriable one (LEADER_NOT_AVAILABLE, NODE_NOT_READY)."""
        meta = self.metadata.topics.get(name)
        if meta is None and refresh_if_missing:
            self.refresh([name])
            meta = self.metadata.topics.get(name)
        if meta is None:
            raise self.topic_error(name)
        return meta

    def topic_error(self, name: str) -> errors.FabricError:
        """Why the map has no topic ``name``: the error the last METADATA answer listing it
        gave (docs/PROTOCOL.md section 7's class: AuthorizationFailedError for a principal
        refused it, LeaderNotAvailableError, ...); UnknownTopicOrPartitionError for a topic
        no node knows, or one listed without an error but with partitions not usable."""
        code = self.topic_errors.get(name, errors.UnknownTopicOrPartitionError.code)
        if code == errors.UnknownTopicOrPartitionError.code:
            return errors.UnknownTopicOrPartitionError(f"unknown topic {name!r}", topic=name)
        if code == errors.AuthorizationFailedError.code:
            return errors.AuthorizationFailedError(
                f"this principal may not describe topic {name!r} (docs/SECURITY.md)", topic=name)
        cls = errors.error_for_code(code)
        # A code this client does not know is UnknownServerError: the number says which.
        said = cls.name if cls.code == code else f"error code {code}"
        return cls(f"metadata lists topic {name!r} with {said}: {cls.description}", topic=name)
