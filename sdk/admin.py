"""Topic administration through any node (the node writes ZooKeeper with version checks)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq

from fabric import errors
from fabric.auth.curve import ClientSecurity
from fabric.limits import PARTITIONS_MAX, REPLICATION_FACTOR_MAX
from fabric.protocol.apis import ApiKey
from fabric.transport import FROM_ENV
from sdk._arguments import I32_MAX, I64_MAX, int_arg, names_arg, str_arg
from sdk._client import (
    METADATA_CONNECT_MS,
    METADATA_QUICK_CONNECT_MS,
    METADATA_TIMEOUT_MS,
    Bootstrap,
    Connections,
    MetadataClient,
    PartitionMetadata,
)
from sdk._group_admin import GroupAdmin
from sdk._queue_admin import QueueAdmin

TOPIC_READY_TIMEOUT_S = 30.0
DESCRIBE_REPLICAS_TIMEOUT_MS = 3_000  # per node: a hung node costs describe this much, not 30 s


@dataclass(frozen=True)
class TopicDescription:
    name: str
    configs: dict[str, str]
    partitions: tuple[PartitionMetadata, ...]


def _topic_configs(name: object, partitions: object, replication_factor: object, config: object,
                   strict_order: bool) -> list[dict[str, str]]:
    """CREATE_TOPIC's arguments checked (the node's own rules for the ranges, fabric/zk.py
    ``TopicConfig.build``) and its configs as wire strings."""
    str_arg("name", name)
    int_arg("partitions", partitions, 1, PARTITIONS_MAX, high_name="PARTITIONS_MAX",
             error=errors.InvalidPartitionsError)
    int_arg("replication_factor", replication_factor, 1, REPLICATION_FACTOR_MAX,
             high_name="REPLICATION_FACTOR_MAX", error=errors.InvalidReplicationFactorError)
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict of config name to value, got {type(config).__name__} {config!r:.60}")
    merged: dict[Any, Any] = dict(config or {})
    if strict_order:
        given = merged.get("strict_order", True)
        if str(given).lower() not in ("true", "1"):
            raise errors.InvalidConfigError(
                f"strict_order=True and config strict_order={given!r} disagree; give one of them")
        merged["strict_order"] = True
    for key in merged:
        str_arg("each config name", key)
    return [{"key": k, "value": _config_value(v)} for k, v in merged.items()]


def _config_value(value: object) -> str:
    """A config value as the wire carries it: booleans as true/false, numbers and strings as
    str(). Anything else (None, a list) went as its str(), ``'None'``, which the node
    refused far from the call: a TypeError names it here."""
    if isinstance(value, bool):
        return str(value).lower()
    if not isinstance(value, (int, float, str)):
        raise TypeError(f"a config value is an int, bool, float or str, not {type(value).__name__} {value!r:.60}")
    return str(value)


class Admin(GroupAdmin, QueueAdmin):  # groups: sdk/_group_admin.py; queues: sdk/_queue_admin.py
    """The cluster's administration through any node: topics, leaders and replicas, nodes,
    consumer groups and queues.

    ``bootstrap``: ``zk://HOST:PORT[/chroot]`` (ZooKeeper) or ``tcp://HOST:PORT,...`` (nodes);
    None: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded (ConfigError if neither,
    fabric/bootstrap.py). An empty string is a ValueError, never "find one".
    """

    def __init__(self, bootstrap: str | None = None, *, request_timeout_ms: int = 30_000, context: zmq.Context[Any] | None = None,
                 security: ClientSecurity | None = None) -> None:
        # Checked before a socket is opened (sdk/_arguments.py has the shared checks).
        self.request_timeout_ms = int_arg("request_timeout_ms", request_timeout_ms, 1, I32_MAX)
        meta_bootstrap = Bootstrap(bootstrap)
        # security: CURVE keys for a secure cluster; None reads $FABRIC_KEY_FILE/$FABRIC_SERVER_KEY.
        self._conns = Connections(context, security=security or FROM_ENV)
        self._meta = MetadataClient(meta_bootstrap, self._conns)

    def _call(self, api_key: int, body: dict[str, Any], *, read_only: bool = False) -> dict[str, Any]:
        """The first node that answers. Each gets a short connect wait first, as in a
        metadata refresh: a node that died and is still in the map must not cost every
        call a whole connect wait before the next node is asked. Nodes that took nothing
        (not connected) are then given the patient wait; one the request went out to is
        not sent it again. A node that did not answer is asked last for a while (as by
        metadata refreshes). ``read_only``: any node answers it alike, so each node gets a
        metadata request's timeout, not ``request_timeout_ms``: a paused node (a stopped
        process, a frozen VM) then costs a describe 5 s instead of 30. A change keeps the
        whole timeout on the node it reached: sent again elsewhere while the first node
        may still carry it out, a create would come back "already exists"."""
        last: Exception | None = None
        timeout_ms = min(self.request_timeout_ms, METADATA_TIMEOUT_MS) if read_only else self.request_timeout_ms
        unreached = self._meta.candidates()
        for wait_connect_ms in (METADATA_QUICK_CONNECT_MS, METADATA_CONNECT_MS):
            addresses, unreached = unreached, []
            for address in addresses:
                try:
                    answer = self._conns.request(address, api_key, body, timeout_ms=timeout_ms,
                                                 wait_connect_ms=wait_connect_ms).body
                except (errors.NodeNotReadyError, errors.RequestTimedOutError) as exc:
                    last = exc
                    if exc.fields.get("sent") is False:
                        unreached.append(address)
                    else:
                        self._meta.unanswered(address)
                    continue
                self._meta.answered(address)
                return answer
        raise errors.NoBrokersAvailableError(f"no node answered {ApiKey(api_key).name}: {last}")

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        config: dict[str, Any] | None = None,
        *,
        strict_order: bool = False,
        wait: bool = True,
    ) -> None:
        """Create a topic; with ``wait`` return only once every partition has a serving leader.

        ``strict_order=True``: every record gets a global ID from the sequencer and
        ``sdk.OrderedConsumer`` reads all partitions in one total order.

        ``partitions`` (1..PARTITIONS_MAX) and ``replication_factor``
        (1..REPLICATION_FACTOR_MAX) out of range raise InvalidPartitionsError and
        InvalidReplicationFactorError before anything is sent, as the node would."""
        configs = _topic_configs(name, partitions, replication_factor, config, strict_order)
        body = self._call(ApiKey.CREATE_TOPIC, {"name": name, "partitions": partitions,
                                                "replication_factor": replication_factor, "configs": configs})
        errors.raise_for_code(body["error"], body["message"])
        if wait:
            self.wait_for_topic(name, partitions)

    def create_partitions(self, name: str, total: int, *, wait: bool = True) -> None:
        """Grow ``name`` to ``total`` partitions (never shrinks). Keys hash over the new
        count from then on, as in Kafka: per-key order holds only within a partition."""
        str_arg("name", name)
        int_arg("total", total, 1, PARTITIONS_MAX, high_name="PARTITIONS_MAX", error=errors.InvalidPartitionsError)
        body = self._call(ApiKey.CREATE_PARTITIONS, {"name": name, "partitions": total})
        errors.raise_for_code(body["error"], body["message"])
        if wait:
            self.wait_for_topic(name, total)

    def alter_topic_config(self, name: str, config: Mapping[str, str | int | bool]) -> None:
        """Set some of ``name``'s configs, leaving the others as they are (Kafka's
        incrementalAlterConfigs). Returns once ZooKeeper holds them; each node acts on them
        as its watch fires (retention at its next check, producers at their next metadata).
        Alterable: retention_ms, retention_bytes, message_bytes_max, min_insync,
        unclean_leader_election, strict_order_tick_ms, and a queue's visibility_timeout_ms,
        max_deliveries, message_ttl_ms, max_messages, max_bytes; the others are fixed at
        creation (InvalidConfigError), as are partitions (create_partitions grows them)."""
        str_arg("name", name)
        if not isinstance(config, Mapping) or not config:
            raise TypeError(f"config must be a non-empty dict of config name to value, got {config!r:.60}")
        entries = [{"key": str_arg("each config name", key), "value": _config_value(value)}
                   for key, value in config.items()]
        body = self._call(ApiKey.ALTER_TOPIC_CONFIGS, {"name": name, "configs": entries})
        errors.raise_for_code(body["error"], body["message"])

    def wait_for_topic(self, name: str, partitions: int | None = None, timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
        """Block until every partition has a leader that answers LIST_OFFSETS for it."""
        str_arg("name", name)
        if partitions is not None:
            int_arg("partitions", partitions, 1, PARTITIONS_MAX, high_name="PARTITIONS_MAX")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                meta = self._meta.refresh([name]).topics.get(name)
                if (meta is not None and (partitions is None or meta.partition_count == partitions)
                        and all(self._leader_serves(name, p.partition) for p in meta.partitions)
                        and self._every_node_knows(name, meta.partition_count)):
                    return
            except errors.RetriableError:
                pass
            if time.monotonic() > deadline:
                raise errors.LeaderNotAvailableError(f"topic {name!r} not ready within {timeout_s} s")
            time.sleep(0.05)

    def _every_node_knows(self, name: str, partitions: int) -> bool:
        # So that a client bootstrapping from any node finds the topic right away.
        for address in self._meta.metadata.nodes.values():
            reply = self._conns.request(address, ApiKey.METADATA, {"topics": [name]}, timeout_ms=self.request_timeout_ms)
            topic = reply.body["topics"][0]
            if topic["error"] != 0 or len(topic["partitions"]) != partitions:
                return False
        return True

    def _leader_serves(self, topic: str, partition: int) -> bool:
        address = self._meta.metadata.leader_address(topic, partition)
        if address is None:
            return False
        body = self._conns.request(address, ApiKey.LIST_OFFSETS, {"partitions": [
            {"topic": topic, "partition": partition, "timestamp": -1}]}, timeout_ms=self.request_timeout_ms).body
        return bool(body["partitions"][0]["error"] == 0)

    def delete_topic(self, name: str, *, wait: bool = True, timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
        """Delete a topic; with ``wait`` return once no live node lists it any more."""
        str_arg("name", name)
        body = self._call(ApiKey.DELETE_TOPIC, {"name": name})
        errors.raise_for_code(body["error"], body["message"])
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        pending = set(self._meta.refresh().nodes.values())
        while pending:
            for address in list(pending):
                try:
                    reply = self._conns.request(address, ApiKey.METADATA, {"topics": [name]},
                                                timeout_ms=self.request_timeout_ms).body
                except errors.RetriableError:
                    continue
                # Gone from that node; LEADER_NOT_AVAILABLE is a node that has dropped the
                # partitions but not yet the topic (the deletion half seen), so still listed.
                if reply["topics"][0]["error"] not in (0, errors.LeaderNotAvailableError.code):
                    pending.discard(address)
            if pending:
                if time.monotonic() > deadline:
                    raise errors.RequestTimedOutError(f"nodes {sorted(pending)} still list topic {name!r}")
                time.sleep(0.05)

    def list_topics(self) -> list[str]:
        return sorted(self._meta.refresh().topics)

    def describe_topics(self, names: list[str] | None = None) -> list[TopicDescription]:
        """The named topics (a list; None or empty: all), in that order."""
        names = [] if names is None else names_arg("names", names)
        body = self._call(ApiKey.DESCRIBE_TOPICS, {"names": names}, read_only=True)
        out = []
        for t in body["topics"]:
            errors.raise_for_code(t["error"], f"topic {t['name']!r}")
            out.append(TopicDescription(
                t["name"],
                {c["key"]: c["value"] for c in t["configs"]},
                tuple(PartitionMetadata(p["partition"], p["leader"], p["leader_epoch"], tuple(p["replicas"]), tuple(p["isr"]))
                      for p in t["partitions"]),
            ))
        if names:
            # The names asked, in that order, matched by name: an answer that left one out
            # or named another (a buggy or version-skewed node) made describe_topic(),
            # describe_queue() and the queue settings raise a bare IndexError, or describe
            # a topic other than the one asked for.
            by_name = {d.name: d for d in out}
            missing = [n for n in names if n not in by_name]
            if missing:
                raise errors.UnknownServerError(f"the DESCRIBE_TOPICS answer left out {missing[:10]}")
            return [by_name[n] for n in dict.fromkeys(names)]  # a name asked twice is answered once
        return out

    def describe_topic(self, name: str) -> TopicDescription:
        return self.describe_topics([str_arg("name", name)])[0]

    def elect_preferred_leaders(self, topics: list[str] | None = None, *, timeout_s: float = TOPIC_READY_TIMEOUT_S) -> int:
        """Move each partition's leadership back to its first replica where that replica is
        alive and in sync (after restarts leave leaders piled on a few nodes). Returns how
        many partitions moved."""
        topics = [] if topics is None else names_arg("topics", topics)
        return int(self._ask_controller(ApiKey.ELECT_LEADERS, {"topics": topics}, timeout_s)["moved"])

    def reassign_partition(self, topic: str, partition: int, replicas: list[int], *,
                           throttle_bytes_per_s: int = 0, timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
        """Start moving one partition to ``replicas`` (node ids, the first preferred for
        leadership). The new replicas copy the log, their catch-up fetches held to
        ``throttle_bytes_per_s`` (0: no limit); each joins the ISR once caught up, and only
        then are the old ones removed (docs/OPERATIONS.md, "Moving partitions"). Returns
        once the controller has accepted the move; ``describe_replicas`` or
        ``wait_reassigned`` show when it is done. The same move again changes nothing
        but the throttle; a different one while it runs raises ``ReassignmentInProgressError``."""
        str_arg("topic", topic)
        int_arg("partition", partition, 0, I32_MAX)
        if isinstance(replicas, (str, bytes)) or not isinstance(replicas, (list, tuple)):
            raise TypeError(f"replicas must be a list of node ids, got {type(replicas).__name__}")
        for node_id in replicas:
            int_arg("each node id of replicas", node_id, 0, I32_MAX)
        int_arg("throttle_bytes_per_s", throttle_bytes_per_s, 0, I64_MAX)
        if not replicas:  # on the wire an empty list cancels: say so rather than cancel by accident
            raise errors.InvalidRequestError("replicas: give at least one node id (cancel_reassignment stops a move)")
        body = {"topic": topic, "partition": partition, "replicas": list(replicas),
                "throttle_bytes_per_s": throttle_bytes_per_s}
        self._ask_controller(ApiKey.REASSIGN_PARTITION, body, timeout_s)

    def cancel_reassignment(self, topic: str, partition: int, *, timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
        """Stop a running move: the replicas being added go (their partial copies are
        deleted), the ones being removed stay. InvalidRequestError if nothing is moving."""
        str_arg("topic", topic)
        int_arg("partition", partition, 0, I32_MAX)
        body = {"topic": topic, "partition": partition, "replicas": [], "throttle_bytes_per_s": 0}
        self._ask_controller(ApiKey.REASSIGN_PARTITION, body, timeout_s)

    def wait_reassigned(self, topic: str, partition: int, replicas: list[int] | None = None, *,
                        timeout_s: float = TOPIC_READY_TIMEOUT_S) -> None:
        """Wait until the partition's move is finished; TimeoutError if it is still moving
        after ``timeout_s`` (a throttled copy of a big log takes a while).

        Give ``replicas``, the target passed to ``reassign_partition``: then finished means
        the cluster's metadata lists exactly those replicas and the leader is acting on no
        move. Without it, only the second is checked, and a move the nodes have not yet
        heard of (``reassign_partition`` returns once the controller accepted it) looks
        finished too. The replaced copies are deleted right after, asynchronously."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self.describe_replicas([topic]).get((topic, partition), [])
            leaders = [r for r in rows if r["role"] == "leader"]
            done = bool(leaders) and not any(r["adding"] or r["removing"] for r in leaders)
            if done and replicas is not None:
                current = [p for p in self.describe_topic(topic).partitions if p.partition == partition]
                done = bool(current) and list(current[0].replicas) == list(replicas)
            if done:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}/{partition} is still moving after {timeout_s:g} s")
            time.sleep(0.2)

    def describe_replicas(self, topics: list[str] | None = None, *,
                          timeout_ms: int = DESCRIBE_REPLICAS_TIMEOUT_MS) -> dict[tuple[str, int], list[dict[str, Any]]]:
        """Every live node's copy of each partition (DESCRIBE_REPLICAS): role, log start and
        end, high watermark, size on disk, and the reassignment it is acting on. Keyed by
        (topic, partition); each row carries ``node_id``. A node that does not answer
        within ``timeout_ms`` (or refuses) is left out."""
        topics = [] if topics is None else names_arg("topics", topics)
        out: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for node_id, address in sorted(self._meta.refresh().nodes.items()):
            try:
                body = self._conns.request(address, ApiKey.DESCRIBE_REPLICAS, {"topics": topics},
                                           timeout_ms=min(timeout_ms, self.request_timeout_ms)).body
            except errors.FabricError:
                continue  # down, refused (an older node, an ACL): its copies are left out
            for row in body["partitions"]:
                out.setdefault((row["topic"], row["partition"]), []).append({**row, "node_id": node_id})
        return out

    def _ask_controller(self, api_key: int, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send to the controller, retrying retriable errors (no controller yet, a new one)."""
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = self._meta.refresh()
            address = metadata.nodes.get(metadata.controller_id)
            try:
                if address is None:
                    raise errors.NotControllerError("no controller elected yet")
                answer = self._conns.request(address, api_key, body, timeout_ms=self.request_timeout_ms).body
                errors.raise_for_code(answer["error"], answer["message"])
                return answer
            except errors.RetriableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def drain_node(self, node_id: int) -> int:
        """Controlled shutdown of one node (as SIGTERM does): its leaderships move to other
        in-sync replicas, then it exits. Returns how many partitions it led when the drain
        began; it has not necessarily exited yet when this returns."""
        int_arg("node_id", node_id, 0, I32_MAX)
        address = self._meta.refresh().nodes.get(node_id)
        if address is None:
            raise errors.InvalidRequestError(f"node {node_id} is not registered (already stopped or draining?)")
        body = self._conns.request(address, ApiKey.DRAIN_NODE, {"node_id": node_id},
                                   timeout_ms=self.request_timeout_ms).body
        errors.raise_for_code(body["error"], body["message"])
        return int(body["leaderships"])

    def nodes(self) -> dict[int, str]:
        return dict(self._meta.refresh().nodes)

    def close(self) -> None:
        self._conns.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
