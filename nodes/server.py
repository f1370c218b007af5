"""The storage node: one event loop on a zmq.Poller serves every request.

All partition state is owned by the loop thread. Kazoo's watch thread never touches it:
it marks the routing map dirty and wakes the loop through an inproc socket, and the loop
decides what to host (``_sync_hosting``), in one place.

Per loop turn the node drains up to ``DRAIN_MESSAGES_MAX`` client messages, stages every
produced batch into one RocksDB WriteBatch (group commit), writes it once, answers the
producers, and then wakes the long-poll fetches parked on the partitions it touched.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

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
from nodes.log import PartitionLog, Store
from nodes.producer_state import DUPLICATE

log = logging.getLogger("fabric.node")

DRAIN_MESSAGES_MAX = 256  # client messages handled per loop turn before writing
POLL_INTERVAL_MS_MAX = 100  # the loop wakes at least this often to check stop and timers
REGISTER_WAIT_S = 30.0  # how long a restarted node waits for its old session's znode to expire


@dataclass
class NodeConfig:
    node_id: int
    zk: str
    data_dir: str
    host: str = "127.0.0.1"
    port: int = 0  # 0 picks a free port and publishes it in ZooKeeper
    fsync: str = "none"
    fsync_interval_ms: int = FSYNC_INTERVAL_MS_DEFAULT
    retention_check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS_DEFAULT
    session_timeout_ms: int = 6_000


@dataclass
class ParkedFetch:
    envelope: list[Any]
    header: Header
    body: dict[str, Any]
    deadline: float  # monotonic seconds
    keys: set[tuple[str, int]] = field(default_factory=set)


class Node:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.node_id = config.node_id
        self.ctx: zmq.Context[Any] = zmq.Context.instance()
        self.store = Store(os.path.join(config.data_dir, "rocksdb"), fsync=config.fsync)
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.known_topics: set[str] = set()
        self.parked: list[ParkedFetch] = []
        self._stopping = threading.Event()
        self._routing_dirty = True
        self._wake_lock = threading.Lock()
        self._zk_ok = threading.Event()
        self._reregister = False
        self._producer_ids_next = 0
        self._producer_ids_end = 0
        self.address = ""
        self.zk = KazooClient(hosts=config.zk, timeout=config.session_timeout_ms / 1000.0)
        self.routing = zkl.RoutingCache(self.zk, on_change=self._on_routing_change)
        self._bind()

    # -- setup ----------------------------------------------------------------------------
    def _bind(self) -> None:
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.RCVHWM, 10_000)
        self.router.setsockopt(zmq.SNDHWM, 10_000)
        self.router.setsockopt(zmq.MAXMSGSIZE, 256 * 1024 * 1024)
        if self.config.port:
            self.router.bind(f"tcp://{self.config.host}:{self.config.port}")
            port = self.config.port
        else:
            port = self.router.bind_to_random_port(f"tcp://{self.config.host}")
        self.address = f"tcp://{self.config.host}:{port}"
        wake_endpoint = f"inproc://node-wake-{id(self)}"
        self._wake_pull = self.ctx.socket(zmq.PULL)
        self._wake_pull.bind(wake_endpoint)
        self._wake_push = self.ctx.socket(zmq.PUSH)
        self._wake_push.setsockopt(zmq.LINGER, 0)
        self._wake_push.connect(wake_endpoint)

    def _wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_push.send(b"w", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # a wake is already queued, or we are closing

    def _on_routing_change(self, what: str) -> None:
        self._routing_dirty = True
        self._wake()

    def _on_zk_state(self, state: str) -> None:
        # Runs on kazoo's thread: only flip flags and wake the loop.
        if state == KazooState.CONNECTED:
            self._zk_ok.set()
        else:
            self._zk_ok.clear()
            if state == KazooState.LOST:
                self._reregister = True
        self._wake()

    def _register(self) -> None:
        info = zkl.NodeInfo(
            node_id=self.node_id,
            address=self.address,
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

    # -- hosting ---------------------------------------------------------------------------
    def _sync_hosting(self) -> None:
        self._routing_dirty = False
        topics = self.routing.topics()
        for name, route in topics.items():
            for p, state in route.partitions.items():
                if self.node_id in state.replicas and (name, p) not in self.logs:
                    self.logs[(name, p)] = PartitionLog(self.store, name, p, route.config.created_ms)
        for gone in self.known_topics - set(topics):
            for key in [k for k in self.logs if k[0] == gone]:
                log.info("topic %s deleted: wiping %s/%d", gone, *key)
                self.logs.pop(key).wipe()
        self.known_topics = set(topics)

    def _leader_log(self, topic: str, partition: int) -> tuple[PartitionLog, zkl.PartitionState, zkl.TopicConfig]:
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
        if state.leader != self.node_id:
            raise errors.NotLeaderError(f"node {self.node_id} does not lead {topic}/{partition} (leader {state.leader})")
        plog = self.logs.get((topic, partition))
        if plog is None:
            raise errors.NodeNotReadyError(f"{topic}/{partition} is not open on node {self.node_id} yet")
        return plog, state, route.config

    def high_watermark(self, plog: PartitionLog) -> int:
        return plog.log_end_offset

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        self.zk.add_listener(self._on_zk_state)
        self.zk.start(timeout=30)
        self._zk_ok.set()
        zkl.ensure_layout(self.zk)
        self._reconcile_local_data()
        self.routing.start()
        self._register()
        self._sync_hosting()
        log.info("node %d serving on %s", self.node_id, self.address)
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._wake_pull, zmq.POLLIN)
        now = time.monotonic()
        next_retention = now + self.config.retention_check_interval_ms / 1000.0
        next_fsync = now + self.config.fsync_interval_ms / 1000.0
        try:
            while not self._stopping.is_set():
                timeout_ms = self._poll_timeout_ms(min(next_retention, next_fsync))
                events = dict(poller.poll(timeout_ms))
                if self._wake_pull in events:
                    while True:
                        try:
                            self._wake_pull.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                if self._reregister and self._zk_ok.is_set():
                    self._reregister = False
                    self._register()
                if self._routing_dirty:
                    self._sync_hosting()
                if self.router in events:
                    self._drain_requests()
                now = time.monotonic()
                self._expire_parked(now)
                if now >= next_retention:
                    self._apply_retention()
                    next_retention = now + self.config.retention_check_interval_ms / 1000.0
                if now >= next_fsync:
                    if self.config.fsync == "interval":
                        self.store.sync_wal()
                    next_fsync = now + self.config.fsync_interval_ms / 1000.0
        finally:
            self._shutdown()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()

    def _shutdown(self) -> None:
        log.info("node %d stopping", self.node_id)
        self.routing.close()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:  # already gone; nothing to clean
            pass
        for sock in (self.router, self._wake_pull, self._wake_push):
            sock.close(linger=0)
        self.store.close()

    def _poll_timeout_ms(self, timer_deadline: float) -> int:
        deadline = timer_deadline
        for parked in self.parked:
            deadline = min(deadline, parked.deadline)
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
        pending_replies: list[tuple[list[Any], list[Any]]] = []
        touched: set[tuple[str, int]] = set()
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
                reply = self._handle_produce(request, wb, touched)
                if reply is not None:
                    pending_replies.append((envelope, reply))
                continue
            if wb is not None:
                # Reads and admin calls must see what earlier requests in this turn wrote.
                self._commit(wb, pending_replies, touched)
                wb, pending_replies, touched = None, [], set()
            self._handle_other(envelope, request)
        if wb is not None:
            self._commit(wb, pending_replies, touched)

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

    def _commit(self, wb: Any, replies: list[tuple[list[Any], list[Any]]], touched: set[tuple[str, int]]) -> None:
        try:
            self.store.write(wb)
        except errors.StorageError:
            log.critical("storage write failed; stopping the node so nothing is acknowledged from memory")
            self._stopping.set()
            raise
        for envelope, frames in replies:
            self._send(envelope, frames)
        if touched:
            self._wake_parked(touched)

    # -- produce ---------------------------------------------------------------------------
    def _handle_produce(self, request: apis.Message, wb: Any, touched: set[tuple[str, int]]) -> list[Any] | None:
        body = request.body
        acks = body["acks"]
        if acks not in (0, 1, -1):
            return apis.encode_error_response(request.header, errors.InvalidRequestError.code, f"acks={acks} must be 0, 1 or -1 (all)")
        if not 0 <= body["timeout_ms"] <= PRODUCE_TIMEOUT_MS_MAX:
            return apis.encode_error_response(
                request.header, errors.InvalidRequestError.code, f"timeout_ms={body['timeout_ms']} outside [0, {PRODUCE_TIMEOUT_MS_MAX}]"
            )
        now_ms = int(time.time() * 1000)
        results = []
        for entry, frame in zip(body["entries"], request.batches, strict=False):
            topic, partition = entry["topic"], entry["partition"]
            result = {"topic": topic, "partition": partition, "error": 0, "base_offset": -1, "log_start_offset": -1, "message": ""}
            try:
                plog, state, config = self._leader_log(topic, partition)
                header = batch_format.validate(frame, config.message_bytes_max)
                verdict, original_offset = plog.producers.check(
                    header.producer_id, header.producer_epoch, header.base_sequence, header.record_count
                )
                if verdict == DUPLICATE:
                    # A retry of a batch we already have: answer as the first time, write nothing.
                    result["base_offset"] = original_offset
                else:
                    result["base_offset"] = plog.append(wb, bytearray(frame), header, state.leader_epoch, now_ms)
                    touched.add((topic, partition))
                result["log_start_offset"] = plog.log_start_offset
            except errors.FabricError as exc:
                result["error"] = exc.code
                result["message"] = exc.message
            results.append(result)
        if acks == 0:
            return None
        return apis.encode_response(request.header, {"results": results})

    # -- everything else -------------------------------------------------------------------
    def _handle_other(self, envelope: list[Any], request: apis.Message) -> None:
        api = request.header.api_key
        try:
            if api == ApiKey.FETCH:
                self._handle_fetch(envelope, request)
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
                plog, _state, _config = self._leader_log(p["topic"], p["partition"])
                ts = p["timestamp"]
                if ts == apis.LATEST_TIMESTAMP:
                    result["offset"] = self.high_watermark(plog)
                elif ts == apis.EARLIEST_TIMESTAMP:
                    result["offset"] = plog.log_start_offset
                elif ts < 0:
                    raise errors.InvalidRequestError(f"timestamp {ts}: use -1 (latest), -2 (earliest) or ms >= 0")
                else:
                    offset, found_ts = plog.offset_for_timestamp(ts)
                    if offset >= self.high_watermark(plog):
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
        fetch = ParkedFetch(
            envelope,
            request.header,
            body,
            time.monotonic() + body["max_wait_ms"] / 1000.0,
            {(p["topic"], p["partition"]) for p in body["partitions"]},
        )
        if not self._try_answer_fetch(fetch, final=body["max_wait_ms"] == 0):
            if len(self.parked) >= PARKED_FETCHES_MAX:
                self._try_answer_fetch(fetch, final=True)
            else:
                self.parked.append(fetch)

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
                      "log_start_offset": -1, "log_end_offset": -1, "batch_count": 0}
            try:
                plog, state, _config = self._leader_log(p["topic"], p["partition"])
                epoch = p["current_leader_epoch"]
                if epoch != apis.ANY_LEADER_EPOCH and epoch != state.leader_epoch:
                    if epoch < state.leader_epoch:
                        raise errors.FencedLeaderEpochError(f"epoch {epoch} < {state.leader_epoch}")
                    raise errors.UnknownLeaderEpochError(f"epoch {epoch} > {state.leader_epoch}")
                hw = self.high_watermark(plog)
                result["high_watermark"] = hw
                result["log_start_offset"] = plog.log_start_offset
                result["log_end_offset"] = plog.log_end_offset
                limit = hw if body["replica_id"] == apis.CONSUMER_REPLICA_ID else plog.log_end_offset
                if p["fetch_offset"] > limit and p["fetch_offset"] <= plog.log_end_offset:
                    batches: list[bytes] = []  # above the HW but inside the log: wait
                else:
                    room = min(p["partition_bytes_max"], budget - total) if total < budget else 0
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

    # -- retention -------------------------------------------------------------------------
    def _apply_retention(self) -> None:
        topics = self.routing.topics()
        now_ms = int(time.time() * 1000)
        for (topic, partition), plog in self.logs.items():
            route = topics.get(topic)
            if route is None:
                continue
            deleted = plog.apply_retention(route.config.retention_ms, route.config.retention_bytes, now_ms)
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
