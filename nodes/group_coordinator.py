"""Group coordination on a storage node: the leader of partition ``crc32(group) % N`` of
``__consumer_offsets`` coordinates the group.

The coordinator is a client of its own node. It writes group records with an ordinary
PRODUCE (acks=all) to its own address and rebuilds state after a leadership change with
ordinary FETCHes of the partition, so it needs nothing from the node's internals: the
routing map (to know what it leads), a way to send a reply, and a turn of the loop
(``tick``). That also means every byte it keeps goes through the tested replication path.

Answers wait for durability. A heartbeat or commit that changed state is answered only
after its record is committed (acks=all); an answer that changed nothing waits behind the
writes already in flight on that partition, so no client ever acts on state that a
failover could forget. If a write fails, the partition's state is thrown away and read
again from the log (which holds exactly what was committed).

Everything here runs on the node's loop thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

import zmq

from fabric import errors
from fabric import zk as zkl
from fabric.auth.curve import ClientSecurity
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol import groups as gp
from fabric.protocol.apis import ApiKey
from fabric.transport import Connections
from nodes import group_cleanup, group_records, group_retention
from nodes.group_admin_apis import GroupAdminApis
from nodes.group_records import ACTIVE, LOADING, Partition, Write
from nodes.group_state import GroupState, MayDescribe

log = logging.getLogger("fabric.groups")

GROUP_APIS: Final[frozenset[int]] = frozenset(key for key, _ in gp.SCHEMAS)
WRITE_TIMEOUT_MS: Final[int] = 10_000  # acks=all wait for one group record
LOAD_FETCH_BYTES_MAX: Final[int] = 4 * 1024 * 1024
EXPIRE_INTERVAL_S: Final[float] = 0.1
RETRY_INTERVAL_S: Final[float] = 0.2  # a failed load fetch or topic creation is retried after this
REQUEST_TIMEOUT_S: Final[float] = 15.0  # a request to our own node unanswered this long is abandoned
PENDING_ANSWERS_MAX: Final[int] = 10_000  # answers parked behind writes, per partition
Send = Callable[[list[Any], list[Any]], object]


class GroupCoordinator(GroupAdminApis):
    def __init__(self, node_id: int, address: str, routing: zkl.RoutingCache, send: Send,
                 context: zmq.Context[Any], poller: zmq.Poller, *, serving: Callable[[], bool] = lambda: True,
                 routing_current: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic, security: ClientSecurity | None = None,
                 caller: Callable[[], tuple[str, MayDescribe]] | None = None,
                 delete_below: Callable[[tuple[str, int], int], int] | None = None,
                 offsets_retention_ms: int = group_retention.OFFSETS_RETENTION_MS_DEFAULT) -> None:
        self.node_id = node_id
        self.address = address
        self.routing = routing
        self._send = send
        self._serving = serving  # False while the node is unsure of its ZooKeeper session
        # True only while connected to ZooKeeper with a session we hold: offsets of deleted
        # topics are deleted only then (nodes/group_cleanup.py).
        self._routing_current = routing_current
        self._topics_seen = group_cleanup.TopicsSeen()
        self._clock = clock
        # Requests to our own node share the node's poller, so their replies wake its loop.
        # ``security``: the node's own key on a secure cluster (its own socket takes only
        # CURVE); never a user's key from the environment. Without it, every request to
        # the node itself failed its handshake and no group worked on a secure cluster.
        self._conns = Connections(context, poller=poller, security=security)
        self._secure_caller = caller  # secure cluster: who sent the request now, and the ACL check
        self._delete_below = delete_below  # our node's log, below a restatement (group_records)
        self._partitions: dict[int, Partition] = {}
        self._requests: dict[int, tuple[float, Callable[[apis.Message | None], None]]] = {}
        self._creating_topic_until = 0.0
        self._last_expire_s = 0.0
        self._offsets_retention_ms = offsets_retention_ms  # empty groups go after this (group_retention)
        self._next_retention_s = 0.0

    # -- the node's hooks ------------------------------------------------------------------
    @staticmethod
    def handles(api_key: int) -> bool:
        return api_key in GROUP_APIS

    def handle(self, envelope: list[Any], request: apis.Message) -> None:
        """Answer a group API request now or once the writes it depends on are committed."""
        api = request.header.api_key
        body = request.body
        try:
            if api == ApiKey.FIND_COORDINATOR:
                self._reply(envelope, request, self._find_coordinator(body["group_id"]))
            elif api == ApiKey.LIST_GROUPS:
                self._reply(envelope, request, self._list_groups())
            elif api == ApiKey.DESCRIBE_GROUPS:
                self._reply(envelope, request, self._describe_groups(body["group_ids"]))
            elif api == ApiKey.DELETE_GROUPS:
                self._delete_groups(envelope, request)
            elif api == ApiKey.CONSUMER_GROUP_HEARTBEAT:
                self._heartbeat(envelope, request)
            elif api == ApiKey.OFFSET_COMMIT:
                self._offset_commit(envelope, request)
            elif api == ApiKey.OFFSET_FETCH:
                self._offset_fetch(envelope, request)
            else:
                raise errors.UnknownApiError(f"api {api} is not a group api")
        except errors.FabricError as exc:
            self._send(envelope, apis.encode_error_response(request.header, exc.code, exc.message))

    def tick(self) -> None:
        """One loop turn: take replies from our own node, follow leadership, load, expire."""
        now = self._clock()
        for _address, frames in self._conns.drain():
            try:
                message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
            except errors.FabricError as exc:
                log.warning("undecodable reply from our own node: %s", exc)
                continue
            entry = self._requests.pop(message.header.correlation_id, None)
            if entry is not None:
                entry[1](message)
        for correlation_id, (sent, callback) in list(self._requests.items()):
            if now - sent > REQUEST_TIMEOUT_S:
                del self._requests[correlation_id]
                self._conns.drop(self.address)
                callback(None)
        self._follow_leadership()
        for part in list(self._partitions.values()):
            if part.mode == LOADING and not part.load_in_flight and now >= part.next_load_s:
                self._load_step(part)
            elif part.mode == ACTIVE and part.written >= part.restate_at and not part.writes:
                self._restate(part)
        if now - self._last_expire_s >= EXPIRE_INTERVAL_S:
            self._last_expire_s = now
            self._expire_members()
            self._forget_deleted_topics()
        if now >= self._next_retention_s:
            self._next_retention_s = now + group_retention.check_interval_ms(self._offsets_retention_ms) / 1000
            self._expire_groups()

    def close(self) -> None:
        self._conns.close()

    # -- leadership and loading --------------------------------------------------------------
    def _follow_leadership(self) -> None:
        route = self.routing.topic(gp.OFFSETS_TOPIC)
        led: dict[int, int] = {}
        if route is not None and self._serving():
            led = {p: s.leader_epoch for p, s in route.partitions.items() if s.leader == self.node_id}
        for p, part in list(self._partitions.items()):
            if led.get(p) != part.leader_epoch:
                self._drop_partition(part, "leadership moved")
        for p, epoch in led.items():
            if p not in self._partitions:
                self._partitions[p] = Partition(p, epoch)
                log.info("coordinating %s/%d (epoch %d): loading", gp.OFFSETS_TOPIC, p, epoch)

    def _drop_partition(self, part: Partition, why: str) -> None:
        self._partitions.pop(part.partition, None)
        log.info("stopped coordinating %s/%d: %s", gp.OFFSETS_TOPIC, part.partition, why)
        for write in part.writes:
            for callback in write.on_done:
                callback(errors.NotCoordinatorError.code, why)
        part.writes.clear()

    def _reload(self, part: Partition, why: str) -> None:
        """Forget memory and read the log again: it holds exactly what was committed."""
        log.warning("reloading %s/%d: %s", gp.OFFSETS_TOPIC, part.partition, why)
        self._drop_partition(part, why)
        self._partitions[part.partition] = Partition(part.partition, part.leader_epoch,
                                                      next_load_s=self._clock() + RETRY_INTERVAL_S)

    def _load_step(self, part: Partition) -> None:
        body = {"replica_id": apis.CONSUMER_REPLICA_ID, "max_wait_ms": 0, "min_bytes": 0,
                "max_bytes": LOAD_FETCH_BYTES_MAX,
                "partitions": [{"topic": gp.OFFSETS_TOPIC, "partition": part.partition,
                                "fetch_offset": part.load_offset, "partition_bytes_max": LOAD_FETCH_BYTES_MAX,
                                "current_leader_epoch": part.leader_epoch}]}
        part.load_in_flight = True

        def on_reply(message: apis.Message | None) -> None:
            part.load_in_flight = False
            if self._partitions.get(part.partition) is not part:
                return
            if message is None or message.header.error_code:
                part.next_load_s = self._clock() + RETRY_INTERVAL_S
                return
            result = message.body["partitions"][0]
            if result["error"] == errors.OffsetOutOfRangeError.code and part.load_offset < result["log_start_offset"]:
                part.load_offset = result["log_start_offset"]
                return
            if result["error"]:
                part.next_load_s = self._clock() + RETRY_INTERVAL_S  # e.g. the role is not applied yet
                return
            now_ms = self._now_ms()
            for buf in message.batches:
                decoded = batch_format.decode_batch(buf)
                base = decoded.header.base_offset
                for i, (key, value) in enumerate(zip(decoded.keys, decoded.values, strict=True)):
                    if base + i >= part.load_offset and key is not None:
                        group_records.apply(part.groups, key, value, now_ms, decoded.timestamps[i])
                        part.written += 1
                part.load_offset = max(part.load_offset, decoded.header.next_offset)
            # Done when we have read everything and everything we read is committed: a new
            # leader's high watermark can lag its log for a moment after an election.
            if part.load_offset >= result["log_end_offset"] and result["high_watermark"] >= result["log_end_offset"]:
                part.mode, part.log_end = ACTIVE, part.load_offset
                log.info("coordinating %s/%d: loaded %d groups up to offset %d", gp.OFFSETS_TOPIC,
                         part.partition, len(part.groups), part.load_offset)
            elif not message.batches:
                part.next_load_s = self._clock() + 0.02  # waiting for the high watermark

        self._request(ApiKey.FETCH, body, on_reply)

    # -- writing -------------------------------------------------------------------------
    def _write(self, part: Partition, records: list[tuple[bytes, bytes | None]],
               on_done: Callable[[int, str], None], *, restating: bool = False,
               timestamps_ms: list[int] | None = None) -> None:
        """Append records to our partition with acks=all; ``on_done(error, message)`` after."""
        part.written += 0 if restating else len(records)
        timestamps_ms = timestamps_ms or [int(time.time() * 1000)] * len(records)
        batch = batch_format.encode_batch(timestamps_ms, [k for k, _ in records], [v for _, v in records])
        write = Write([on_done])
        part.writes.append(write)
        body = {"acks": -1, "timeout_ms": WRITE_TIMEOUT_MS,
                "entries": [{"topic": gp.OFFSETS_TOPIC, "partition": part.partition}]}

        def on_reply(message: apis.Message | None) -> None:
            if self._partitions.get(part.partition) is not part:
                return  # dropped: its callbacks were already told NOT_COORDINATOR
            if message is None:
                code, text = errors.RequestTimedOutError.code, "group record write timed out"
            elif message.header.error_code:
                code, text = message.header.error_code, message.body.get("message", "")
            else:
                result = message.body["results"][0]
                code, text = result["error"], result["message"]
                if not code:
                    part.log_end = max(part.log_end, result["base_offset"] + len(records))
            # Writes complete in log order; a failed one means memory is ahead of the log.
            while part.writes:
                done = part.writes.popleft()
                for callback in done.on_done:
                    callback(code, text)
                if done is write:
                    break
            if code:
                self._reload(part, f"group record write failed: {text or code}")

        # The node's version: it may write __consumer_offsets (apis.INTERNAL_VERSION).
        self._request(ApiKey.PRODUCE, body, on_reply, batches=[batch], api_version=apis.INTERNAL_VERSION)

    def _restate(self, part: Partition) -> None:
        """Compact the partition (nodes/group_records.py) once enough was written since the
        last time. Only with no write in flight: memory is then exactly the log."""
        part.restate_at = max(group_records.RESTATE_AFTER_RECORDS_MIN, 2 * group_records.live_count(part.groups))
        if part.written < part.restate_at:
            return  # a large live state: wait until the writes since outgrow it
        below, writes = part.log_end, group_records.restatement_timed(part.groups, int(time.time() * 1000))
        part.written, pending, failed = 0, [len(writes)], [False]

        def one_done(code: int, _text: str) -> None:  # a failed write reloads the partition
            pending[0] -= 1
            failed[0] = failed[0] or code != 0
            if not pending[0] and not failed[0] and self._partitions.get(part.partition) is part and self._delete_below:
                deleted = self._delete_below((gp.OFFSETS_TOPIC, part.partition), below)
                log.info("compacted %s/%d: %d writes restated its live records, %d records below %d deleted",
                         gp.OFFSETS_TOPIC, part.partition, len(writes), deleted, below)

        for records in writes:  # all now, in order: no other write falls between them
            self._write(part, [(k, v) for k, v, _ in records], one_done, restating=True,
                        timestamps_ms=[t for _, _, t in records])
        if not writes:  # nothing live: all of it goes
            pending[0] = 1
            one_done(0, "")

    def _after_writes(self, part: Partition, callback: Callable[[int, str], None]) -> None:
        """Run ``callback`` once every write in flight on ``part`` is committed (now if none)."""
        if not part.writes:
            callback(0, "")
            return
        if sum(len(w.on_done) for w in part.writes) >= PENDING_ANSWERS_MAX:
            raise errors.CoordinatorLoadInProgressError("too many answers waiting for group writes; retry")
        part.writes[-1].on_done.append(callback)

    def _request(self, api_key: int, body: dict[str, Any], callback: Callable[[apis.Message | None], None], *,
                 batches: list[bytes] | None = None, api_version: int = 0) -> None:
        correlation_id = self._conns.next_id()
        try:
            frames = apis.encode_request(api_key, body, correlation_id, api_version=api_version, batches=batches)
            self._conns.send(self.address, frames, wait_connect_ms=0)
        except errors.FabricError:
            callback(None)
            return
        self._requests[correlation_id] = (self._clock(), callback)

    # -- API handlers -----------------------------------------------------------------------
    def _reply(self, envelope: list[Any], request: apis.Message, body: dict[str, Any]) -> None:
        try:
            frames = apis.encode_response(request.header, body)
        except (ValueError, OverflowError) as exc:  # sent from the loop's duties too: must not end the loop
            frames = apis.encode_error_response(request.header, errors.UnknownServerError.code, f"unencodable answer: {exc}")
        self._send(envelope, frames)

    def _reply_after(self, part: Partition, envelope: list[Any], request: apis.Message, body: dict[str, Any],
                     error_body: Callable[[int, str], dict[str, Any]]) -> None:
        def answer(code: int, text: str) -> None:
            self._reply(envelope, request, body if code == 0 else error_body(code, text))
        self._after_writes(part, answer)

    def _find_coordinator(self, group_id: str) -> dict[str, Any]:
        gp.check_group_id(group_id)
        partition = gp.coordinator_partition(group_id)
        route = self.routing.topic(gp.OFFSETS_TOPIC)
        if route is None:
            self._create_offsets_topic()
            return {"error": errors.CoordinatorNotAvailableError.code, "message": "creating the offsets topic",
                    "node_id": -1, "address": "", "partition": partition}
        state = route.partitions.get(partition)
        node = self.routing.nodes().get(state.leader) if state is not None else None
        if node is None:
            return {"error": errors.CoordinatorNotAvailableError.code, "message": "no leader for the group's partition",
                    "node_id": -1, "address": "", "partition": partition}
        return {"error": 0, "message": "", "node_id": node.node_id, "address": node.address, "partition": partition}

    def _create_offsets_topic(self) -> None:
        now = self._clock()
        if now < self._creating_topic_until:
            return
        self._creating_topic_until = now + 1.0
        replicas = max(1, min(apis.INTERNAL_REPLICATION_FACTOR, len(self.routing.nodes())))
        body = {"name": gp.OFFSETS_TOPIC, "partitions": gp.OFFSETS_TOPIC_PARTITIONS, "replication_factor": replicas,
                "configs": [{"key": "retention_ms", "value": "-1"},
                            {"key": "min_insync", "value": str(min(2, replicas))}]}

        def on_reply(message: apis.Message | None) -> None:
            if message is not None and not message.header.error_code and message.body["error"] not in (
                    0, errors.TopicAlreadyExistsError.code):
                log.warning("creating %s failed: %s", gp.OFFSETS_TOPIC, message.body["message"])

        self._request(ApiKey.CREATE_TOPIC, body, on_reply, api_version=apis.INTERNAL_VERSION)

    def _partition_for(self, group_id: str) -> Partition:
        gp.check_group_id(group_id)
        part = self._partitions.get(gp.coordinator_partition(group_id))
        if part is None:
            raise errors.NotCoordinatorError(f"node {self.node_id} does not coordinate group {group_id!r}")
        if part.mode != ACTIVE:
            raise errors.CoordinatorLoadInProgressError(f"node {self.node_id} is still loading group {group_id!r}")
        return part

    def _topic_partitions(self) -> dict[str, int]:
        return {name: len(route.partitions) for name, route in self.routing.topics().items()}

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _heartbeat(self, envelope: list[Any], request: apis.Message) -> None:
        body = request.body
        part = self._partition_for(body["group_id"])
        group = part.groups.get(body["group_id"]) or GroupState(body["group_id"])
        principal, may_describe = self._caller()
        result = group.heartbeat(body, self._now_ms(), self._topic_partitions(), principal=principal,
                                 may_describe=may_describe)
        if result.changed or group.members:  # offsets retention counts from the last member (a refusal is none)
            group.active_ms = int(time.time() * 1000)
        if result.changed:
            part.groups[group.group_id] = group

        def error_body(code: int, text: str) -> dict[str, Any]:
            return {"error": code, "message": text, "member_id": body["member_id"], "member_epoch": -1,
                    "heartbeat_interval_ms": 0, "assignment": []}

        if result.changed:
            self._write(part, [(gp.group_key(group.group_id), group.to_record())], lambda _c, _t: None)
        self._reply_after(part, envelope, request, result.response, error_body)

    def _offset_commit(self, envelope: list[Any], request: apis.Message) -> None:
        body = request.body
        part = self._partition_for(body["group_id"])
        group = part.groups.get(body["group_id"]) or GroupState(body["group_id"])
        tps = [(o["topic"], o["partition"]) for o in body["offsets"]]
        codes = group.check_commit(body["member_id"], body["member_epoch"], tps)
        records: list[tuple[bytes, bytes | None]] = []
        commit_ms = int(time.time() * 1000)
        results = []
        for entry, code in zip(body["offsets"], codes, strict=True):
            tp = (entry["topic"], entry["partition"])
            route = self.routing.topic(entry["topic"])
            if code == 0 and (route is None or not 0 <= entry["partition"] < len(route.partitions)):
                code = errors.UnknownTopicOrPartitionError.code
            if code == 0 and (entry["offset"] < 0 or len(entry["metadata"].encode()) > gp.OFFSET_METADATA_BYTES_MAX):
                code = errors.InvalidRequestError.code
            if code == 0 and route is not None:  # never stamped before the topic's creation (fetch_offsets)
                group.offsets[tp] = (entry["offset"], entry["metadata"], max(commit_ms, route.config.created_ms))
                self._topics_seen.saw(tp[0])
                records.append((gp.offset_key(group.group_id, *tp), gp.encode_offset_value(*group.offsets[tp])))
            results.append({"topic": tp[0], "partition": tp[1], "error": code})
        response = {"error": 0, "message": "", "results": results}

        def error_body(code: int, text: str) -> dict[str, Any]:
            return {"error": code, "message": text, "results": [dict(r, error=code) for r in results]}

        if records:
            part.groups[group.group_id] = group  # not before: a wholly refused commit makes no group
            self._write(part, records, lambda _c, _t: None)
        self._reply_after(part, envelope, request, response, error_body)

    def _offset_fetch(self, envelope: list[Any], request: apis.Message) -> None:
        body = request.body
        part = self._partition_for(body["group_id"])
        group = part.groups.get(body["group_id"]) or GroupState(body["group_id"])
        principal, may_describe = self._caller()
        created = {name: route.config.created_ms for name, route in self.routing.topics().items()}
        offsets = group.fetch_offsets([(p["topic"], p["partition"]) for p in body["partitions"]], principal, may_describe,
                                      created)
        self._reply_after(part, envelope, request, {"error": 0, "message": "", "offsets": offsets},
                          lambda code, text: {"error": code, "message": text, "offsets": []})

    def _caller(self) -> tuple[str, MayDescribe | None]:
        """Who sent the request being handled, and the ACL check, on a secure cluster."""
        return self._secure_caller() if self._secure_caller is not None else ("", None)

    def committed(self) -> Iterator[tuple[str, str, int, int]]:
        """(group, topic, partition, offset) committed here (metrics), not on a deleted topic of the same name."""
        created = {name: route.config.created_ms for name, route in self.routing.topics().items()}
        return ((g.group_id, tp[0], tp[1], entry[0]) for part in list(self._partitions.values()) if part.mode == ACTIVE
                for g in list(part.groups.values()) for tp, entry in list(g.offsets.items()) if entry[2] >= created.get(tp[0], -1))

    def _expire_members(self) -> None:
        now_ms = self._now_ms()
        for part in list(self._partitions.values()):
            if part.mode != ACTIVE:
                continue
            for group in list(part.groups.values()):
                gone = group.expire(now_ms)
                if gone:
                    group.active_ms = int(time.time() * 1000)
                    log.info("group %s: session expired for %s", group.group_id, ", ".join(gone))
                    self._write(part, [(gp.group_key(group.group_id), group.to_record())], lambda _c, _t: None)

    def _expire_groups(self) -> None:
        """Delete groups empty past their retention (nodes/group_retention.py), in one write
        per partition of at most GROUPS_EXPIRED_PER_CHECK_MAX groups (the rest next time)."""
        wall_ms = int(time.time() * 1000)
        for part in [p for p in self._partitions.values() if p.mode == ACTIVE]:
            gone = group_retention.expired(part.groups, wall_ms, self._offsets_retention_ms)
            gone = gone[:group_retention.GROUPS_EXPIRED_PER_CHECK_MAX]
            if gone:
                self._write(part, [r for g in gone for r in group_retention.tombstones(part.groups.pop(g))],
                            lambda _c, _t: None)
                log.info("%s/%d: %d groups empty past their retention deleted (%s)", gp.OFFSETS_TOPIC,
                         part.partition, len(gone), ", ".join(gone[:5]) + (", ..." if len(gone) > 5 else ""))

    def _forget_deleted_topics(self) -> None:
        """Tombstone (and forget) the offsets of topics seen deleted (nodes/group_cleanup.py),
        only while the routing map is current, at most OFFSETS_DELETED_PER_WRITE_MAX per
        partition per look; a partition is looked at again when the map's topics change."""
        if not (self._serving() and self._routing_current() and not self.routing.needs_resync):
            return
        seen = self._topics_seen
        seen.observe(self.routing.generation, self.routing.incarnations)
        for part in [p for p in self._partitions.values() if p.mode == ACTIVE and p.topics_swept != seen.epoch]:
            stale = group_cleanup.stale_offsets(part.groups, seen.incarnations or {}, seen.deleted)
            if len(stale) < group_cleanup.OFFSETS_DELETED_PER_WRITE_MAX:
                part.topics_swept = seen.epoch  # else the rest at the next look
            for group_id, tp in stale:
                del part.groups[group_id].offsets[tp]
            if stale:
                self._write(part, [(gp.offset_key(g, *tp), None) for g, tp in stale], lambda _c, _t: None)
                log.info("%s/%d: %d committed offsets of deleted topics deleted (%s)", gp.OFFSETS_TOPIC,
                         part.partition, len(stale), ", ".join(sorted({tp[0] for _, tp in stale})[:5]))
