"""Admin and metadata answers: metadata, describe, list offsets, API versions, topic admin,
producer ids. Each handler takes the node state and one request and returns the body."""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any

from fabric import errors
from fabric import zk as zkl
from fabric.limits import NAMES_PER_REQUEST_MAX
from fabric.protocol import apis
from nodes.state import Envelope, NodeState


def _partition_state_body(state: zkl.PartitionState, live: Container[int] | None = None) -> dict[str, Any]:
    """``live``: the node ids a METADATA answer lists; a leader not among them is answered
    as -1 (none). Its ZooKeeper session has expired and the controller has not yet elected
    another: a client can reach no node by that id, and took it for a reachable leader
    (a QueueConsumer polled nobody for good). DESCRIBE_TOPICS reports ZooKeeper's state as is."""
    return {
        "partition": state.partition,
        "error": 0,
        "leader": state.leader if live is None or state.leader in live else -1,
        "leader_epoch": state.leader_epoch,
        "replicas": list(state.replicas),
        "isr": list(state.isr),
    }


def check_names(names: list[str], field: str) -> None:
    """Refuse a request naming more than NAMES_PER_REQUEST_MAX topics or groups, before any
    work: each is looked up and answered on the node's one loop."""
    if len(names) > NAMES_PER_REQUEST_MAX:
        raise errors.InvalidRequestError(f"{len(names):,} {field} in one request, above "
                                         f"NAMES_PER_REQUEST_MAX={NAMES_PER_REQUEST_MAX:,}: ask in parts")


def handle_metadata(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any]:
    node.check_routing_current()
    names: list[str] = request.body["topics"]
    check_names(names, "topics")
    topics = node.routing.topics()
    live = node.routing.nodes()  # read after the topics: a node that joined since is listed
    wanted = list(dict.fromkeys(names)) if names else sorted(topics)  # a name asked for twice is answered once
    out = []
    for name in wanted:
        route = topics.get(name)
        if route is None or len(route.partitions) < route.config.partitions:
            # Not yet known, or known only in part: the config and the partition states
            # reach this node's cache by separate watches, and an answer with some of the
            # partitions and error 0 made a client hash keys over the wrong count.
            code = (errors.UnknownTopicOrPartitionError if route is None else errors.LeaderNotAvailableError).code
            out.append({"error": code, "name": name, "strict_order": 0, "message_bytes_max": 0, "partitions": []})
            continue
        out.append({
            "error": 0,
            "name": name,
            "strict_order": int(route.config.strict_order),
            "message_bytes_max": route.config.message_bytes_max,
            "partitions": [_partition_state_body(route.partitions[p], live) for p in sorted(route.partitions)],
        })
    nodes = [{"node_id": n.node_id, "address": n.address} for n in sorted(live.values(), key=lambda n: n.node_id)]
    return {"controller_id": node.routing.controller_id, "nodes": nodes, "topics": out}


def handle_describe_topics(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any]:
    node.check_routing_current()
    names: list[str] = request.body["names"]
    check_names(names, "names")
    topics = node.routing.topics()
    out = []
    # A name asked for twice is answered once, as by METADATA: 100,000 copies of one name
    # (a 600 KB request) made a node build 58 MB of answer and stall its loop for 9-11 s.
    for name in dict.fromkeys(names) if names else sorted(topics):
        route = topics.get(name)
        if route is None:
            out.append({"error": errors.UnknownTopicOrPartitionError.code, "name": name, "configs": [], "partitions": []})
            continue
        out.append({
            "error": 0,
            "name": name,
            "configs": [{"key": k, "value": v} for k, v in sorted(route.config.as_strings().items())],
            "partitions": [_partition_state_body(route.partitions[p]) for p in sorted(route.partitions)],
        })
    return {"topics": out}


def handle_list_offsets(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any]:
    out = []
    for p in request.body["partitions"]:
        result = {"topic": p["topic"], "partition": p["partition"], "error": 0, "timestamp": -1, "offset": -1}
        try:
            plog, _leader, _config = node.leader_log(p["topic"], p["partition"])
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


def handle_api_versions(_node: NodeState, _envelope: Envelope, _request: apis.Message, *,
                        served: frozenset[int]) -> dict[str, Any]:
    """The versions of the APIs this node serves (``served``: its dispatch table's keys). The
    protocol declares more (ALLOCATE_IDS is the sequencer's): a client that asks before
    using an API must not be told a node serves what it refuses."""
    return {
        "apis": [
            {"api_key": k, "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(apis.supported_versions().items()) if k in served
        ]
    }


def handle_init_producer_id(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    # Ids come from ZooKeeper in blocks, so two nodes never hand out the same one; a new
    # block is reserved on the ZooKeeper worker, never in the loop.
    if node.producer_ids_next < node.producer_ids_end:
        return _take_producer_id(node)

    def with_block(block: tuple[int, int]) -> dict[str, Any]:
        if node.producer_ids_next >= node.producer_ids_end:
            node.producer_ids_next, node.producer_ids_end = block
        return _take_producer_id(node)

    node.answer_later(envelope, request.header, lambda: zkl.allocate_producer_id_block(node.zk), with_block)
    return None


def _take_producer_id(node: NodeState) -> dict[str, Any]:
    producer_id = node.producer_ids_next
    node.producer_ids_next += 1
    return {"error": 0, "producer_id": producer_id, "producer_epoch": 0}


def _admin_result(action: Callable[[], object]) -> dict[str, Any]:
    """Topic admin answers carry their error in the body, not in the response header."""
    try:
        action()
    except errors.FabricError as exc:
        return {"error": exc.code, "message": exc.message}
    return {"error": 0, "message": ""}


# Topic changes are ZooKeeper transactions: they run on the ZooKeeper worker and are
# answered when it is done (refused at once, retriably, while ZooKeeper is away).
def _refuse_internal(name: str, action: str) -> dict[str, Any] | None:
    """The answer refusing ``action`` on an internal topic (apis.INTERNAL_TOPIC_PREFIX), or None."""
    if not apis.is_internal_topic(name):
        return None
    return {"error": errors.InvalidTopicError.code,
            "message": f"topic {name!r}: names starting with {apis.INTERNAL_TOPIC_PREFIX!r} are Fabric's internal "
                       f"topics, which clients may not {action}"}


def _config_map(entries: list[dict[str, str]]) -> dict[str, str] | str:
    """The request's configs as a dict, or why not: a key given twice is refused rather than
    one of its values silently winning (the caller meant one of them; which, it must say)."""
    configs: dict[str, str] = {}
    for entry in entries:
        if entry["key"] in configs:
            return f"config {entry['key']!r} is given more than once"
        configs[entry["key"]] = entry["value"]
    return configs


def handle_create_topic(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    body = request.body
    if request.header.api_version < apis.INTERNAL_VERSION:
        refused = _refuse_internal(body["name"], "create")
        if refused is not None:
            return refused
    configs = _config_map(body["configs"])
    if isinstance(configs, str):
        return {"error": errors.InvalidConfigError.code, "message": configs}
    node.answer_later(envelope, request.header, lambda: _admin_result(
        lambda: zkl.create_topic(node.zk, body["name"], body["partitions"], body["replication_factor"], configs)))
    return None


def handle_delete_topic(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    name = request.body["name"]
    refused = _refuse_internal(name, "delete")  # the coordinators' state: never deleted
    if refused is not None:
        return refused
    # A queue's dead-letter topic is refused by zkl.delete_topic, which reads ZooKeeper
    # itself: this node's watched copy of the topics lags behind a queue just created.
    node.answer_later(envelope, request.header, lambda: _admin_result(lambda: zkl.delete_topic(node.zk, name)))
    return None


def handle_alter_topic_configs(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    body = request.body
    refused = _refuse_internal(body["name"], "alter")  # the coordinators' state: their settings are theirs
    if refused is not None:
        return refused
    configs = _config_map(body["configs"])
    if isinstance(configs, str):
        return {"error": errors.InvalidConfigError.code, "message": configs}
    node.answer_later(envelope, request.header, lambda: _admin_result(
        lambda: zkl.alter_topic_config(node.zk, body["name"], configs)))
    return None


def handle_create_partitions(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    body = request.body
    refused = _refuse_internal(body["name"], "add partitions to")  # their partitioning is fixed by the coordinators
    if refused is not None:
        return refused
    node.answer_later(envelope, request.header, lambda: _admin_result(
        lambda: zkl.add_partitions(node.zk, body["name"], body["partitions"])))
    return None


# Topic administration, for the node's dispatch table (nodes/server.py).
TOPIC_APIS: dict[int, Callable[[NodeState, Envelope, apis.Message], dict[str, Any] | None]] = {
    apis.ApiKey.CREATE_TOPIC: handle_create_topic,
    apis.ApiKey.DELETE_TOPIC: handle_delete_topic,
    apis.ApiKey.CREATE_PARTITIONS: handle_create_partitions,
    apis.ApiKey.ALTER_TOPIC_CONFIGS: handle_alter_topic_configs,
}
