"""The node's Prometheus endpoint (``prometheus_client``).

Two kinds of series, collected two ways, because the loop thread alone owns the node's
state:

- **Events** (requests, errors, bytes) are counted by the loop as they happen:
  ``observe_request`` is a few counter increments, cheap enough for every request.
- **State** (per-partition offsets, ISR, lag, leader count) is copied by the loop into an
  immutable ``Snapshot`` every ``SNAPSHOT_INTERVAL_S`` (a duty of the loop); the HTTP
  thread only reads the latest snapshot when Prometheus scrapes. Nothing here reads
  the node's dictionaries from another thread.

Series (names per the Prometheus conventions: ``_total`` counters, ``_seconds``,
``_bytes``; labels ``api``, ``error``, ``topic``, ``partition``, ``follower``)::

    fabric_node_info{node,address}                       1
    fabric_requests_total{api}                           requests answered or parked
    fabric_request_errors_total{api,error}               error responses by wire error name
    fabric_request_duration_seconds{api}                 histogram: loop time spent on a request
    fabric_received_bytes_total / fabric_sent_bytes_total   record-batch bytes in, response bytes out
    fabric_partition_log_start_offset{topic,partition}   each hosted replica
    fabric_partition_log_end_offset{topic,partition}
    fabric_partition_high_watermark{topic,partition}
    fabric_partition_size_bytes{topic,partition}         stored batch bytes (compressed)
    fabric_partition_leader{topic,partition}             1 where this node leads
    fabric_partition_leader_epoch{topic,partition}
    fabric_partition_isr_size{topic,partition}           leaders only
    fabric_partition_replicas{topic,partition}           leaders only (a move's copying replicas not counted)
    fabric_partition_under_replicated{topic,partition}   leaders only: ISR < replicas
    fabric_partition_below_min_insync{topic,partition}   leaders only: acks=all refused
    fabric_replica_lag_messages{topic,partition,follower}   leaders only: leader end - follower end
    fabric_group_lag_messages{group,topic,partition}     coordinator: high watermark - committed offset
    fabric_leader_partitions / fabric_under_replicated_partitions   per-node totals
    fabric_offline_partitions                            controller only: no live leader
    fabric_parked_fetches / fabric_pending_produces      requests waiting on this node
    fabric_rocksdb_size_bytes                            files under the node's RocksDB dir
    fabric_controller                                    1 on the controller
    fabric_queue_messages{queue,partition,group,state}   queue partitions this node leads: visible,
                                                         in_flight, delayed (docs/QUEUES.md); group
                                                         "" for a partition no group reads yet
    fabric_queue_finished_total{queue,partition,group,outcome}   dead_lettered, dropped, deduplicated

The endpoint's address is registered in the node's ZooKeeper znode (``metrics_address``),
which is how ``fabric status`` and a Prometheus file-SD script find every node's endpoint.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fabric import errors
from fabric.metrics_http import MetricsEndpoint
from fabric.protocol.apis import ApiKey
from nodes.queue_share import COUNTING

SNAPSHOT_INTERVAL_S = 1.0
# From a cached fetch (sub-millisecond) to a full long-poll (FETCH_WAIT_MS_MAX is 60 s).
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                     1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STOP_CHECK_INTERVAL_S = 1.0  # the stop watcher's wait on the node's stopping flag


UNKNOWN_API = "UNKNOWN"  # the ``api`` label of every key this node does not know


def api_name(api_key: int) -> str:
    # One label for all unknown keys: a refused request echoes the client's api key (a wrong
    # protocol version, too many frames), and a label per key let a client add a series for
    # each of the 65,536 (20,000 requests made 20,000 error series, 3.5 MB per scrape).
    try:
        return ApiKey(api_key).name
    except ValueError:
        return UNKNOWN_API


@dataclass(frozen=True)
class PartitionSample:
    topic: str
    partition: int
    leader: bool
    leader_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size_bytes: int
    replicas: int = 0  # the rest: only where this node leads
    isr_size: int = 0
    min_insync: int = 0
    follower_lag: tuple[tuple[int, int], ...] = ()  # (follower id, messages behind the leader)


@dataclass(frozen=True)
class Snapshot:
    partitions: tuple[PartitionSample, ...] = ()
    offline_partitions: int | None = None  # None: this node is not the controller
    parked_fetches: int = 0
    pending_produces: int = 0
    is_controller: bool = False
    queues: tuple[tuple[str, int, str, tuple[tuple[str, int], ...]], ...] = ()  # (queue, partition, group, counts)
    # (group, topic, partition, messages behind the high watermark) for the groups this node
    # coordinates, where it also holds the partition (its copy's high watermark).
    group_lag: tuple[tuple[str, str, int, int], ...] = ()


def snapshot(node: Any) -> Snapshot:
    """Copy what the series need out of a ``NodeState``. Loop thread only."""
    samples = []
    for (topic, partition), plog in list(node.logs.items()):
        state = node.states.get((topic, partition))
        leader = node.leaders.get((topic, partition))
        config = node.configs.get(topic)
        # size_bytes: the log keeps the total; summing its batches every second, for every
        # partition, cost time in proportion to all the data the node holds.
        common = dict(topic=topic, partition=partition, leader=leader is not None,
                      leader_epoch=state.leader_epoch if state is not None else -1,
                      log_start_offset=plog.log_start_offset, log_end_offset=plog.log_end_offset,
                      high_watermark=plog.high_watermark, size_bytes=plog.total_bytes)
        if leader is None:
            samples.append(PartitionSample(**common))
            continue
        lag = tuple(sorted((follower_id, max(0, plog.log_end_offset - max(progress.log_end_offset, 0)))
                           for follower_id, progress in leader.followers.items()))
        samples.append(PartitionSample(
            # A move's new replicas (still copying) do not count as missing from the ISR.
            **common, replicas=len(state.replicas) - len(state.adding) if state is not None else len(leader.followers) + 1,
            isr_size=len(leader.isr), min_insync=config.min_insync if config is not None else 1, follower_lag=lag))
    offline = None
    if node.is_controller:
        live = set(node.routing.nodes())
        offline = sum(1 for route in node.routing.topics().values() for state in route.partitions.values()
                      if state.leader < 0 or state.leader not in live)
    queues = tuple((q, p, g, tuple(sorted(counts.items())))
                   for q, p, g, counts in (node.queues.counts() if node.queues is not None else []))
    group_lag = []
    if node.groups is not None:
        for group, topic, partition, offset in node.groups.committed():
            plog = node.logs.get((topic, partition))
            if plog is not None:
                group_lag.append((group, topic, partition, max(0, plog.high_watermark - offset)))
    return Snapshot(tuple(samples), offline, len(node.parked), len(node.pending), bool(node.is_controller), queues,
                    tuple(group_lag))


def response_error_codes(body: dict[str, Any]) -> list[int]:
    """The error codes a response carries: its own and its items' (a produce refused with
    NOT_ENOUGH_REPLICAS answers per partition, in ``results``; fetches in ``partitions``)."""
    codes = [body["error"]] if body.get("error") else []
    for key in ("partitions", "topics", "results"):
        for item in body.get(key) or ():
            if isinstance(item, dict) and item.get("error"):
                codes.append(int(item["error"]))
    return codes


def frames_bytes(frames: list[Any]) -> int:
    return sum(len(frame) for frame in frames)


def serve(node: Any) -> NodeMetrics | None:
    """The node's metrics with their endpoint started (None with ``metrics_port`` -1). A
    watcher thread stops the endpoint when the node stops."""
    config = node.config
    if config.metrics_port < 0:
        return None
    metrics = NodeMetrics(config.node_id, os.path.join(config.data_dir, "rocksdb"))
    metrics.client_address = node.address
    metrics.start_http(config.metrics_host or config.host, config.metrics_port, reachable_host=config.host)

    def stop_with_the_node() -> None:
        while not node.stopping.wait(STOP_CHECK_INTERVAL_S):
            pass
        metrics.stop()

    threading.Thread(target=stop_with_the_node, name="metrics-stop", daemon=True).start()
    return metrics


def instrument(handlers: dict[int, Any]) -> dict[int, Any]:
    """The dispatch table with each handler timed and counted: a plain handler around its
    call, a group commit around its ``stage`` (the write itself is shared by the turn)."""

    def timed(run: Any) -> Any:
        def call(node: Any, *args: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(node, *args)
            finally:
                if node.metrics is not None:
                    request = args[-1]
                    node.metrics.observe_request(request.header.api_key, time.perf_counter() - started,
                                                 frames_bytes(request.batches))
        return call

    def wrap(handler: Any) -> Any:
        if hasattr(handler, "stage"):  # a GroupCommit (a frozen dataclass)
            return dataclasses.replace(handler, stage=timed(handler.stage))
        return timed(handler)

    return {key: wrap(handler) for key, handler in handlers.items()}


def snapshot_duty(node: Any, now_s: float) -> None:
    """A duty of the node's loop: refresh the state series."""
    if node.metrics is not None:
        node.metrics.take_snapshot(node, now_s)


def directory_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass  # compacted away while we walked
    return total


class _StateCollector(Collector):
    """Turns the latest snapshot into gauge families at scrape time (HTTP thread)."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        snap = m.latest
        tp = ["topic", "partition"]

        def family(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        info = family("fabric_node_info", "This node's id and client address (value 1).", ["node", "address"])
        info.add_metric([str(m.node_id), m.client_address], 1)
        yield info
        per_partition = {
            "log_start_offset": family("fabric_partition_log_start_offset", "First offset still stored.", tp),
            "log_end_offset": family("fabric_partition_log_end_offset", "Offset the next batch gets.", tp),
            "high_watermark": family("fabric_partition_high_watermark", "Offsets below it are committed.", tp),
            "size_bytes": family("fabric_partition_size_bytes", "Stored batch bytes (as compressed).", tp),
            "leader": family("fabric_partition_leader", "1 where this node leads the partition.", tp),
            "leader_epoch": family("fabric_partition_leader_epoch", "Current leader epoch.", tp),
        }
        led = {
            "isr_size": family("fabric_partition_isr_size", "In-sync replicas (leader's view).", tp),
            "replicas": family("fabric_partition_replicas", "Assigned replicas (a move's new ones once it completes).", tp),
            "under": family("fabric_partition_under_replicated", "1 when ISR < replicas (leader's view).", tp),
            "below": family("fabric_partition_below_min_insync", "1 when acks=all writes are refused.", tp),
        }
        lag = family("fabric_replica_lag_messages", "Messages a follower is behind the leader's log end.",
                     [*tp, "follower"])
        leaders = under = 0
        for s in snap.partitions:
            labels = [s.topic, str(s.partition)]
            for key, fam in per_partition.items():
                fam.add_metric(labels, float(getattr(s, key)))
            if not s.leader:
                continue
            leaders += 1
            under += s.isr_size < s.replicas
            led["isr_size"].add_metric(labels, s.isr_size)
            led["replicas"].add_metric(labels, s.replicas)
            led["under"].add_metric(labels, float(s.isr_size < s.replicas))
            led["below"].add_metric(labels, float(s.isr_size < s.min_insync))
            for follower_id, behind in s.follower_lag:
                lag.add_metric([*labels, str(follower_id)], behind)
        yield from per_partition.values()
        yield from led.values()
        yield lag
        group_lag = family("fabric_group_lag_messages", "Messages a consumer group is behind the high watermark "
                           "(on the node coordinating the group, for partitions it holds).",
                           ["group", "topic", "partition"])
        for group, topic, partition, behind in snap.group_lag:
            group_lag.add_metric([group, topic, str(partition)], behind)
        yield group_lag
        totals = [
            ("fabric_leader_partitions", "Partitions this node leads.", leaders),
            ("fabric_under_replicated_partitions", "Led partitions with ISR < replicas.", under),
            ("fabric_parked_fetches", "Long-poll fetches waiting on this node.", snap.parked_fetches),
            ("fabric_pending_produces", "acks=all produces waiting for the ISR.", snap.pending_produces),
            ("fabric_controller", "1 on the elected controller.", float(snap.is_controller)),
            ("fabric_rocksdb_size_bytes", "Bytes of files under the node's RocksDB dir (SST, WAL, manifest).",
             directory_bytes(m.rocksdb_dir) if m.rocksdb_dir else 0),
        ]
        if snap.offline_partitions is not None:
            totals.append(("fabric_offline_partitions", "Partitions without a live leader (controller's view).",
                           snap.offline_partitions))
        for name, doc, value in totals:
            fam = family(name, doc)
            fam.add_metric([], float(value))
            yield fam
        yield from queue_families(snap)


def queue_families(snap: Snapshot) -> Iterator[Metric]:
    """Queue depth per queue partition this node leads, and how messages left other than by ack."""
    depth = GaugeMetricFamily("fabric_queue_messages", "Messages of a queue partition by state, per group.",
                              labels=["queue", "partition", "group", "state"])
    # A counter (exported as fabric_queue_finished_total): it only grows while this node
    # leads the partition; a new leader starts from the partition's state, a reset that
    # rate() and increase() handle.
    finished = CounterMetricFamily("fabric_queue_finished",
                                   "Messages that left a queue partition without an ack, per group and outcome.",
                                   labels=["queue", "partition", "group", "outcome"])
    for queue, partition, group, items in snap.queues:
        counts = dict(items)
        for state in ("visible", "in_flight", "delayed"):
            depth.add_metric([queue, str(partition), group, state], float(counts.get(state, 0)))
        if group == COUNTING:
            # Only its depth: what counting decides (a TTL's drop) is written nowhere and starts
            # again at each leader, and nothing it counts is dead-lettered.
            continue
        for outcome in ("dead_lettered", "dropped", "deduplicated"):
            finished.add_metric([queue, str(partition), group, outcome], float(counts.get(outcome, 0)))
    yield depth
    yield finished


class NodeMetrics:
    """One node's registry, its event counters, and its HTTP endpoint."""

    def __init__(self, node_id: int, rocksdb_dir: str = "") -> None:
        self.node_id = node_id
        self.rocksdb_dir = rocksdb_dir
        self.address = ""  # this endpoint's URL, once serving
        self.client_address = ""  # the node's client endpoint, set by the node
        self.latest = Snapshot()
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("fabric_requests", "Requests answered or parked, by API.", ["api"],
                                registry=self.registry)
        self.request_errors = Counter("fabric_request_errors", "Error responses by API and wire error name "
                                      "(refusals such as NOT_ENOUGH_REPLICAS included).", ["api", "error"],
                                      registry=self.registry)
        self.request_seconds = Histogram("fabric_request_duration_seconds", "Time the node's loop spent on a "
                                         "request, by API.", ["api"], buckets=LATENCY_BUCKETS_S,
                                         registry=self.registry)
        self.received_bytes = Counter("fabric_received_bytes", "Record-batch bytes received in client "
                                      "requests (replication traffic is not counted).", registry=self.registry)
        self.sent_bytes = Counter("fabric_sent_bytes", "Response bytes sent.", registry=self.registry)
        self._per_api: dict[int, tuple[Any, Any]] = {}  # api key -> (requests, request_seconds) children
        self.registry.register(_StateCollector(self))
        self.endpoint = MetricsEndpoint(self.registry)
        self._next_snapshot_s = 0.0

    # -- loop thread ----------------------------------------------------------------------
    def observe_request(self, api_key: int, seconds: float, request_bytes: int) -> None:
        # The labelled children are looked up once per API: labels() builds a key and takes
        # a lock on every call, and this runs for every request the loop handles.
        children = self._per_api.get(api_key)
        if children is None:
            name = api_name(api_key)
            children = self._per_api[api_key] = (self.requests.labels(name), self.request_seconds.labels(name))
        children[0].inc()
        children[1].observe(seconds)
        self.received_bytes.inc(request_bytes)

    def observe_response(self, api_key: int, error_codes: list[int], response_bytes: int) -> None:
        self.sent_bytes.inc(response_bytes)
        for code in error_codes:
            if code:
                self.request_errors.labels(api_name(api_key), errors.error_for_code(code).name).inc()

    def take_snapshot(self, node: Any, now_s: float | None = None) -> None:
        """The loop's duty: refresh the state series at most every SNAPSHOT_INTERVAL_S."""
        now_s = time.monotonic() if now_s is None else now_s
        if now_s >= self._next_snapshot_s:
            self.latest = snapshot(node)
            self._next_snapshot_s = now_s + SNAPSHOT_INTERVAL_S - 0.001  # the duty's own interval is the same

    # -- endpoint -------------------------------------------------------------------------
    def start_http(self, host: str, port: int, *, reachable_host: str = "") -> str:
        """Serve /metrics on host:port (0: a free port); returns the endpoint's URL, which
        names ``reachable_host`` if ``host`` is a wildcard (MetricsEndpoint.start)."""
        try:
            self.address = self.endpoint.start(host, port, reachable_host=reachable_host)
        except OSError as exc:  # name the endpoint: "Address already in use" alone reads like the client port
            raise OSError(f"metrics endpoint {host}:{port}: {exc.strerror or exc}") from exc
        return self.address

    def stop(self) -> None:
        self.endpoint.stop()
