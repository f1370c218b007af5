"""The follower side of replication: the leader's stream, catch-up fetches, truncation.

Each followed partition runs a small state machine (``FollowerReplica.mode``)::

    TRUNCATING --(leader says where our last epoch ends; truncate)--> FETCHING
    FETCHING   --(a fetch brought us level with the leader)--> STREAMING
    FETCHING   --(fetched batch does not continue our log)--> TRUNCATING
    STREAMING  --(gap in the PUB stream, or no progress while the leader is ahead)--> FETCHING
    any        --(new leader or epoch: nodes/roles.py makes a new FollowerReplica)--> TRUNCATING

The leader publishes each appended batch on PUB; PUB/SUB drops silently (slow joiner,
high-water mark, reconnects), so a follower checks that every batch starts exactly at its
log end and falls back to FETCH over DEALER/ROUTER otherwise (the Clone pattern).
Requests to the leader go through ``node.sockets.replica_conns``, on the loop's poller;
their replies come back through ``handle_replies``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import zmq

from fabric import errors
from fabric.protocol import apis
from fabric.protocol import batch as batch_format
from fabric.protocol.apis import ApiKey
from fabric.transport import readable, recv_if_ready
from fabric.zk import NodeInfo
from nodes import leader as leader_side
from nodes.leader import STREAM_META, replica_log
from nodes.log import PartitionLog
from nodes.reassign import catch_up_throttle
from nodes.state import NodeState, TopicPartition

log = logging.getLogger("fabric.node")

TRUNCATING = "truncating"
FETCHING = "fetching"
STREAMING = "streaming"

SUB_MESSAGES_MAX = 512  # replicated batches applied per loop turn before acking
REPLICA_ACK_INTERVAL_S = 0.1  # followers report their log end at least this often ...
REPLICA_IDLE_ACK_INTERVAL_S = 1.0  # ... a quiet partition level with its leader this often (<= lag max / 4)
REPLICA_STALL_S = 0.3  # no stream progress this long while the leader is ahead: fetch instead
REPLICA_REQUEST_TIMEOUT_S = 2.0  # a truncation or fetch request to the leader is resent after this
REPLICA_RETRY_S = 0.2  # ... or after this, when the leader answered it with an error
REPLICA_FETCH_BYTES_MAX = 8 * 1024 * 1024
THROTTLE_FETCH_BYTES_MIN = 64 * 1024  # a throttled fetch waits until it may ask for this much
THROTTLE_FIRST_CREDIT_S = 0.1  # a throttled catch-up starts with this many seconds of credit


@dataclass
class FollowerReplica:
    leader_id: int
    epoch: int
    mode: str = TRUNCATING
    request_in_flight: int = 0  # correlation id of the truncation or fetch request, 0 = none
    request_sent_s: float = 0.0
    leader_log_end: int = -1
    last_progress_s: float = 0.0
    acked_log_end: int = -1  # what we last told the leader
    acked_at_s: float = 0.0  # when an ack last carried this partition
    # A reassignment's catch-up throttle (nodes/reassign.py): a token bucket of fetch bytes.
    throttle_credit_bytes: float = 0.0
    throttle_at_s: float = 0.0


def fetch_allowance(f: FollowerReplica, throttle_bytes_per_s: int, now: float) -> int:
    """How many bytes the next catch-up fetch may ask for (0: wait). Unthrottled: the
    usual maximum. Throttled: a token bucket holding at most one second of the rate; the
    bytes a reply brings are taken off afterwards (``spend``), so one fetch larger than
    the credit (a fetch returns at least one whole batch) is paid for by waiting longer."""
    if throttle_bytes_per_s <= 0:
        f.throttle_at_s = 0.0  # a throttle set later starts a fresh bucket, not this one's debt
        return REPLICA_FETCH_BYTES_MAX
    if f.throttle_at_s:
        f.throttle_credit_bytes = min(float(throttle_bytes_per_s),
                                      f.throttle_credit_bytes + throttle_bytes_per_s * (now - f.throttle_at_s))
    else:
        f.throttle_credit_bytes = throttle_bytes_per_s * THROTTLE_FIRST_CREDIT_S
    f.throttle_at_s = now
    if f.throttle_credit_bytes < min(THROTTLE_FETCH_BYTES_MIN, throttle_bytes_per_s):
        return 0
    return int(min(f.throttle_credit_bytes, REPLICA_FETCH_BYTES_MAX))


def periodic_ack_due(f: FollowerReplica, log_end_offset: int, now: float, idle_ack_interval_s: float) -> bool:
    """Whether this round of periodic (answered) acks carries the partition. A partition
    that is quiet (no progress for ``idle_ack_interval_s``) and level with its leader (as
    its last answer had it, and as last told) goes only every ``idle_ack_interval_s``: its
    ack says nothing new, and at 2,000 partitions acking every one of them ten times a
    second kept each idle node at a quarter of a core (docs/BENCHMARKS.md, "Many
    partitions"). The interval stays well inside the leader's ``replica_lag_max_ms``, so
    the ack still keeps it in the ISR. The price: a stream batch dropped on a quiet
    partition is noticed (the stall check reads the leader's log end from these answers)
    up to that much later."""
    level = f.leader_log_end <= log_end_offset and f.acked_log_end == log_end_offset
    quiet = now - f.last_progress_s >= idle_ack_interval_s
    return not (level and quiet) or now - f.acked_at_s >= idle_ack_interval_s


def idle_ack_interval_s(replica_lag_max_ms: int) -> float:
    """A quarter of the lag the leader tolerates, so three lost acks in a row still keep us in sync."""
    return min(REPLICA_IDLE_ACK_INTERVAL_S, replica_lag_max_ms / 1000.0 / 4)


def set_mode(tp: TopicPartition, f: FollowerReplica, mode: str, why: str) -> None:
    if f.mode != mode:
        replica_log(tp, f.epoch).info("follower of %s/%d (leader %d epoch %d): %s -> %s: %s",
                                      *tp, f.leader_id, f.epoch, f.mode, mode, why)
        f.mode = mode


def _leader_addresses(node: NodeState, leader_id: int, nodes: dict[int, NodeInfo] | None = None) -> tuple[str, str] | None:
    """``nodes``: the routing map's live nodes, when the caller already holds a copy (the
    tick asks once per followed partition: a copy each time was 6 % of an idle node)."""
    info = (node.routing.nodes() if nodes is None else nodes).get(leader_id)
    if info is None:
        return None
    if info.replication_address and info.replication_address not in node.sub_connected:
        if info.replication_address in node.sub_disconnect_pending:
            node.sub_disconnect_pending.discard(info.replication_address)  # never disconnected
        else:
            node.sockets.sub.connect(info.replication_address)
        node.sub_connected.add(info.replication_address)
    return info.address, info.replication_address


def _request(node: NodeState, address: str, api_key: int, body: dict[str, Any], kind: str | None, context: Any,
             *, api_version: int = 0) -> int:
    """Send a request to a leader; ``kind`` None: no answer is awaited (a one-way ack,
    answered only if refused, and a refusal needs no action)."""
    conns = node.sockets.replica_conns
    correlation_id = conns.next_id()
    try:
        conns.send(address, apis.encode_request(api_key, body, correlation_id, api_version=api_version),
                   wait_connect_ms=0)
    except errors.FabricError:
        return 0
    if kind is not None:
        node.replica_requests[correlation_id] = (kind, context)
    return correlation_id


def tick(node: NodeState, now: float) -> None:
    """A loop duty: time out requests, start truncation or fetches, and ack the leaders."""
    acks: dict[int, list[dict[str, Any]]] = {}
    nodes = node.routing.nodes()
    periodic = now - node.last_ack_sent_s >= REPLICA_ACK_INTERVAL_S
    idle_interval_s = idle_ack_interval_s(node.config.replica_lag_max_ms)
    for tp, f in node.followers.items():
        if f.mode == STREAMING and not periodic and not f.request_in_flight:
            # Nothing to do for it between periodic rounds: its appends are acked as they
            # happen (ack_appended), its stall and lag checks count in tenths of a second.
            # Walking all 1,333 followed partitions on every loop turn, dozens a second, was
            # a sixth of an idle node at 2,000 partitions (docs/BENCHMARKS.md, "Many partitions").
            continue
        plog = node.logs[tp]
        if f.request_in_flight and now - f.request_sent_s > REPLICA_REQUEST_TIMEOUT_S:
            node.replica_requests.pop(f.request_in_flight, None)
            f.request_in_flight = 0
        addresses = _leader_addresses(node, f.leader_id, nodes)
        if addresses is None:
            continue
        address = addresses[0]
        if f.mode == TRUNCATING and not f.request_in_flight:
            last_epoch = plog.latest_epoch()
            if last_epoch < 0:
                set_mode(tp, f, FETCHING, "empty log: nothing to truncate")
            else:
                body = {"replica_id": node.node_id, "partitions": [
                    {"topic": tp[0], "partition": tp[1], "current_leader_epoch": f.epoch, "leader_epoch": last_epoch}]}
                f.request_in_flight = _request(node, address, ApiKey.OFFSETS_FOR_LEADER_EPOCH, body, "epoch", (tp, f.epoch))
                f.request_sent_s = now
        if f.mode == STREAMING and f.leader_log_end > plog.log_end_offset and now - f.last_progress_s > REPLICA_STALL_S:
            set_mode(tp, f, FETCHING, f"stream stalled below the leader's end {f.leader_log_end}")
        allowance = fetch_allowance(f, catch_up_throttle(node.states.get(tp), node.node_id), now) \
            if f.mode == FETCHING and not f.request_in_flight else 0
        if allowance:
            body = {"replica_id": node.node_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": allowance,
                    "partitions": [{"topic": tp[0], "partition": tp[1], "fetch_offset": plog.log_end_offset,
                                    "partition_bytes_max": allowance, "current_leader_epoch": f.epoch}]}
            f.request_in_flight = _request(node, address, ApiKey.FETCH, body, "fetch", (tp, f.epoch))
            f.request_sent_s = now
        if f.mode == STREAMING and (plog.log_end_offset != f.acked_log_end or (
                periodic and periodic_ack_due(f, plog.log_end_offset, now, idle_interval_s))):
            _queue_ack(acks, tp, f, plog, now)
    # The periodic ack asks for an answer (the leader's HW and log end, which the stall
    # check reads); the ack right after a write does not (leader.handle_replica_ack).
    _send_acks(node, acks, answered=periodic, nodes=nodes)
    if periodic:
        node.last_ack_sent_s = now


def _queue_ack(acks: dict[int, list[dict[str, Any]]], tp: TopicPartition, f: FollowerReplica,
               plog: PartitionLog, now: float) -> None:
    """Add ``tp``'s log end to the ack for its leader; counted as told from now on."""
    acks.setdefault(f.leader_id, []).append(
        {"topic": tp[0], "partition": tp[1], "leader_epoch": f.epoch, "log_end_offset": plog.log_end_offset})
    f.acked_log_end = plog.log_end_offset
    f.acked_at_s = now


def _send_acks(node: NodeState, acks: dict[int, list[dict[str, Any]]], *, answered: bool,
               nodes: dict[int, NodeInfo] | None = None) -> None:
    """One REPLICA_ACK per leader: version 2 (answered, with the leader's log start) or
    version 1 (one-way)."""
    for leader_id, partitions in acks.items():
        addresses = _leader_addresses(node, leader_id, nodes)
        if addresses is not None:
            body = {"replica_id": node.node_id, "partitions": partitions}
            if answered:
                _request(node, addresses[0], ApiKey.REPLICA_ACK, body, "ack", None,
                         api_version=leader_side.REPLICA_ACK_LOG_START_VERSION)
            else:
                _request(node, addresses[0], ApiKey.REPLICA_ACK, body, None, None,
                         api_version=leader_side.REPLICA_ACK_ONE_WAY_VERSION)


def drain_stream(node: NodeState) -> None:
    """Apply batches from leaders' PUB streams that continue our logs exactly."""
    wb = None
    appended: set[TopicPartition] = set()
    now = time.monotonic()
    now_ms = int(time.time() * 1000)
    for _ in range(SUB_MESSAGES_MAX):
        if not readable(node.sockets.sub):
            break
        frames = recv_if_ready(node.sockets.sub)
        if frames is None:
            break
        if len(frames) != 3:
            continue  # not from a Fabric leader
        pkey, meta, data = (frame.bytes for frame in frames)
        tp = node.pkeys.get(pkey)
        if tp is None:
            continue
        f = node.followers.get(tp)
        if f is None or f.mode != STREAMING or len(meta) != STREAM_META.size:
            continue
        epoch, leader_id = STREAM_META.unpack(meta)
        if epoch != f.epoch or leader_id != f.leader_id:
            continue  # fenced: not the leader we follow
        plog = node.logs[tp]
        try:
            header = batch_format.read_header(data)
        except errors.FabricError:
            continue
        if header.next_offset <= plog.log_end_offset:
            continue  # already have it
        if header.base_offset != plog.log_end_offset:
            set_mode(tp, f, FETCHING, f"gap in the stream: batch at {header.base_offset}, log end {plog.log_end_offset}")
            continue
        try:
            # contents=False: the leader checked the records; the CRC shows these are its bytes.
            batch_format.validate(data, len(data), contents=False)
        except errors.FabricError as exc:
            set_mode(tp, f, FETCHING, f"bad batch from leader {leader_id}: {exc}")
            continue
        if wb is None:
            wb = node.store.new_write_batch()
        plog.append(wb, data, header, header.leader_epoch, now_ms, stamp=False)
        f.last_progress_s = now
        appended.add(tp)
    disconnect_streams(node)
    if wb is not None:
        node.store.write(wb)
        ack_appended(node, appended)  # at once: the leader's HW waits on us


def ack_appended(node: NodeState, tps: set[TopicPartition]) -> None:
    """One-way REPLICA_ACKs for the partitions a drain just appended, one per leader. Not
    the whole ``tick``: that walks every followed partition, on the acks=all path, and
    runs later in the same loop turn anyway (it acks the rest, and periodically asks for
    answers)."""
    acks: dict[int, list[dict[str, Any]]] = {}
    nodes = node.routing.nodes()
    now = time.monotonic()
    for tp in tps:
        f = node.followers.get(tp)
        plog = node.logs.get(tp)
        if f is None or plog is None or f.mode != STREAMING or plog.log_end_offset == f.acked_log_end:
            continue
        if _leader_addresses(node, f.leader_id, nodes) is not None:  # (else the tick tries again)
            _queue_ack(acks, tp, f, plog, now)
    _send_acks(node, acks, answered=False, nodes=nodes)


def disconnect_streams(node: NodeState) -> None:
    """Disconnect the SUB from replication streams of processes that are gone.

    Only here, right after the drain has received whatever the last poll pre-read:
    polling a SUB reads the first frame of its next message ahead (libzmq's
    ``xsub_t::xhas_in``), and disconnecting that message's pipe before its other frames
    are read makes libzmq abort the whole process (``Assertion failed: !_more
    (src/fq.cpp:80)``; reproduced with bare pyzmq 27.3 / libzmq 4.3.5). A node that
    disconnected in ``apply_roles`` between its poll and its drain died that way when a
    peer's session expired (tests/unit/test_stream_disconnect.py).
    """
    for address in node.sub_disconnect_pending:
        try:
            node.sockets.sub.disconnect(address)
        except zmq.ZMQError:
            pass
    node.sub_disconnect_pending.clear()


def handle_replies(node: NodeState) -> None:
    """Route the leaders' replies to our truncation, fetch and ack requests."""
    for _address, frames in node.sockets.replica_conns.drain():
        try:
            message = apis.decode_response([f.bytes if i < 2 else f.buffer for i, f in enumerate(frames)])
        except errors.FabricError as exc:
            log.warning("undecodable reply from a leader: %s", exc)
            continue
        request = node.replica_requests.pop(message.header.correlation_id, None)
        if request is None:
            continue
        kind, context = request
        if kind == "ack":
            if not message.header.error_code:
                _on_ack_reply(node, message.body)
            continue
        tp, epoch = context
        f = node.followers.get(tp)
        if f is None or f.epoch != epoch or f.request_in_flight != message.header.correlation_id:
            continue
        if message.header.error_code:
            # Refused (the leader is not ready yet, say, just after its own new session): ask
            # again after a short pause rather than the whole request timeout.
            f.request_sent_s = min(f.request_sent_s, time.monotonic() - REPLICA_REQUEST_TIMEOUT_S + REPLICA_RETRY_S)
            continue
        f.request_in_flight = 0
        if kind == "epoch":
            _on_epoch_reply(node, tp, f, message.body["partitions"][0])
        elif kind == "fetch":
            _on_fetch_reply(node, tp, f, message.body["partitions"][0], message.batches)


def _on_ack_reply(node: NodeState, body: dict[str, Any]) -> None:
    for p in body["partitions"]:
        tp = (p["topic"], p["partition"])
        f = node.followers.get(tp)
        if f is None or p["error"]:
            continue
        f.leader_log_end = p["log_end_offset"]
        plog = node.logs[tp]
        plog.high_watermark = max(plog.high_watermark, min(p["high_watermark"], plog.log_end_offset))
        _follow_log_start(tp, f, plog, p.get("log_start_offset", -1))


def _follow_log_start(tp: TopicPartition, f: FollowerReplica, plog: PartitionLog, leader_start: int) -> None:
    if leader_start > plog.log_start_offset:
        deleted = plog.delete_below(leader_start)
        if deleted:
            # Debug: a queue's leader deletes what its groups finished every second.
            replica_log(tp, f.epoch).debug("%s/%d: deleted %d records below the leader's log start %d",
                                           *tp, deleted, leader_start)


def truncation_target(leader_epoch: int, leader_end: int, our_end_for_that_epoch: int, log_start_offset: int) -> int:
    """Where a follower cuts its log (KIP-101/279): never the high watermark.

    ``leader_epoch``/``leader_end``: the leader's answer for our last epoch (its largest
    epoch not above ours, and where that epoch ends in its log). ``our_end_for_that_epoch``:
    where that epoch ends in our own log (-1 if we never had it).
    """
    if leader_epoch < 0:
        return log_start_offset  # the leader has nothing as old as our history
    # Cut at the end of the last epoch both logs share, as it is in ours.
    return min(leader_end, our_end_for_that_epoch) if our_end_for_that_epoch >= 0 else log_start_offset


def _on_epoch_reply(node: NodeState, tp: TopicPartition, f: FollowerReplica, result: dict[str, Any]) -> None:
    if result["error"]:
        return  # the leader does not know its epoch yet, or moved on: ask again later
    plog = node.logs[tp]
    leader_epoch, leader_end = result["leader_epoch"], result["end_offset"]
    our_end = plog.end_offset_for_epoch(leader_epoch)[1] if leader_epoch >= 0 else -1
    target = truncation_target(leader_epoch, leader_end, our_end, plog.log_start_offset)
    if target < plog.log_end_offset:
        replica_log(tp, f.epoch).warning("truncating %s/%d from %d to %d (leader %d epoch %d)",
                                         *tp, plog.log_end_offset, target, f.leader_id, f.epoch)
        plog.truncate_to(target)
    if plog.log_end_offset < result["log_start_offset"]:
        plog.reset_to(result["log_start_offset"])
    set_mode(tp, f, FETCHING, f"truncation done at {plog.log_end_offset}")


def _on_fetch_reply(node: NodeState, tp: TopicPartition, f: FollowerReplica, result: dict[str, Any], batches: list[Any]) -> None:
    plog = node.logs[tp]
    error = result["error"]
    if error == errors.OffsetOutOfRangeError.code:
        if plog.log_end_offset < result["log_start_offset"]:
            plog.reset_to(result["log_start_offset"])
        elif plog.log_end_offset > result["log_end_offset"] >= 0:
            set_mode(tp, f, TRUNCATING, "we hold more than the leader: find the divergence again")
        return
    if error:
        return
    f.leader_log_end = result["log_end_offset"]
    _follow_log_start(tp, f, plog, result["log_start_offset"])
    wb = None
    now_ms = int(time.time() * 1000)
    for data in batches:
        raw = bytes(data)
        f.throttle_credit_bytes -= len(raw)  # only read while throttled (fetch_allowance)
        header = batch_format.read_header(raw)
        if header.next_offset <= plog.log_end_offset:
            continue
        if header.base_offset != plog.log_end_offset:
            set_mode(tp, f, TRUNCATING, f"fetched batch at {header.base_offset}, log end {plog.log_end_offset}")
            return
        batch_format.validate(raw, len(raw), contents=False)  # the leader checked the records
        if wb is None:
            wb = node.store.new_write_batch()
        plog.append(wb, raw, header, header.leader_epoch, now_ms, stamp=False)
    if wb is not None:
        node.store.write(wb)
        f.last_progress_s = time.monotonic()
    plog.high_watermark = max(plog.high_watermark, min(result["high_watermark"], plog.log_end_offset))
    if plog.log_end_offset >= result["log_end_offset"]:
        # Level with the leader as of this reply: the stream carries us from here. (Not
        # "an empty fetch": under steady writes a fetch is never empty. Anything the
        # leader published meanwhile is queued on our SUB socket, or, if it was
        # dropped, shows up as a gap and sends us back to fetching.)
        set_mode(tp, f, STREAMING, f"level with the leader at {plog.log_end_offset}")
        f.last_progress_s = time.monotonic()
        f.acked_log_end = -1  # report our log end right away
