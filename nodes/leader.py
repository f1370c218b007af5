"""The leader side of replication: follower progress, the ISR, the high watermark.

Pure rules first (``LeaderReplica``, no sockets, no clock of its own): follower progress,
the in-sync replica set as committed in ZooKeeper, the high watermark (HW = the lowest
log end among the ISR, the leader included), and the ISR shrink/expand decision. Then
what the node does with them: publish each appended batch on the replication stream,
answer followers' REPLICA_ACK and OFFSETS_FOR_LEADER_EPOCH, count a follower's fetch as
an ack, and write ISR changes to ZooKeeper (version-checked) before using them, so an
acknowledgement never rests on an ISR the controller has not seen.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import zmq
from kazoo.exceptions import BadVersionError

from fabric import errors, logs
from fabric import zk as zkl
from fabric.protocol import apis
from fabric.transport import send_multipart_nowait
from fabric.zk import PartitionState
from nodes.log import partition_key
from nodes.state import Envelope, NodeState, TopicPartition

log = logging.getLogger("fabric.node")


def replica_log(tp: TopicPartition, epoch: int) -> logs.ContextAdapter:
    """The logger for a line about one replica: topic, partition and epoch travel as fields
    (``--log-format json``), the node id is stamped by ``logs.setup``."""
    return logs.replica_logger(log, topic=tp[0], partition=tp[1], epoch=epoch)

ISR_CHECK_INTERVAL_S = 0.1
# The replication stream's frames are [partition key, STREAM_META, batch bytes]; the
# meta frame lets a follower ignore a deposed leader's stream.
STREAM_META = struct.Struct("<ii")  # leader epoch, leader node id


# -- pure rules ----------------------------------------------------------------------------
@dataclass
class FollowerProgress:
    """What the leader knows of one follower."""

    log_end_offset: int = -1  # -1: not heard from since this leader's epoch began
    caught_up_at_s: float = 0.0  # last time its log end reached the leader's
    last_ack_at_s: float = 0.0
    leader_end_at_last_ack: int = 0


@dataclass
class LeaderReplica:
    node_id: int
    epoch: int
    epoch_start_offset: int
    isr: set[int]
    followers: dict[int, FollowerProgress] = field(default_factory=dict)

    @classmethod
    def start(cls, node_id: int, state: PartitionState, log_end_offset: int, now_s: float) -> LeaderReplica:
        followers = {r: FollowerProgress(caught_up_at_s=now_s, last_ack_at_s=now_s) for r in state.replicas if r != node_id}
        return cls(node_id, state.leader_epoch, log_end_offset, set(state.isr) | {node_id}, followers)

    def record_follower(self, replica_id: int, log_end_offset: int, leader_end: int, now_s: float) -> None:
        """A follower reported (by ack or fetch) that it holds everything below ``log_end_offset``.

        Caught-up time follows Kafka: if the follower reached the leader's log end as it was
        at the follower's previous report, it was caught up at that previous report.
        """
        progress = self.followers.get(replica_id)
        if progress is None:
            return
        # Never more than the leader has: a report past its log end is not a follower's (a
        # plaintext client can send REPLICA_ACK or a replica FETCH), and taken as is it made
        # acks=all writes count a follower that held none of them.
        log_end_offset = min(log_end_offset, leader_end)
        if log_end_offset >= leader_end:
            progress.caught_up_at_s = now_s
        elif log_end_offset >= progress.leader_end_at_last_ack:
            progress.caught_up_at_s = max(progress.caught_up_at_s, progress.last_ack_at_s)
        # The latest report, not the largest: an overstated one (above) or a follower that
        # lost its data (a replaced disk) would otherwise count for the rest of the term. A
        # report overtaken by a later one only understates, which delays an ack, never a loss.
        progress.log_end_offset = log_end_offset
        progress.last_ack_at_s = now_s
        progress.leader_end_at_last_ack = leader_end

    def set_replicas(self, replicas: tuple[int, ...], now_s: float) -> None:
        """The replica list changed within this term (a reassignment): follow the new
        replicas from not-yet-heard (they join the ISR by catching up), forget removed ones."""
        for r in replicas:
            if r != self.node_id and r not in self.followers:
                self.followers[r] = FollowerProgress(caught_up_at_s=now_s, last_ack_at_s=now_s)
        for r in [r for r in self.followers if r not in replicas]:
            del self.followers[r]

    def high_watermark(self, leader_end: int) -> int:
        hw = leader_end
        for replica in self.isr:
            if replica == self.node_id:
                continue
            progress = self.followers.get(replica)
            hw = min(hw, progress.log_end_offset if progress is not None else -1)
        return hw

    def isr_change(self, leader_end: int, high_watermark: int, now_s: float, lag_max_s: float,
                   live: set[int] | None = None, listening_since_s: float = 0.0) -> set[int] | None:
        """The ISR this leader wants now, or None if it is fine as it is.

        ``live``: the replicas registered in ZooKeeper now. One that is not (it stopped, or
        its session ended) leaves the ISR at once rather than after ``lag_max_s``, as Kafka's
        controller removes a dead broker: acks=all writes stop waiting for a replica that
        cannot answer, which is most of what a rolling restart used to stall on.

        ``listening_since_s``: when this leader last came back from a stall of its own
        (SIGSTOP, a swapped-out host). A follower's lag counts only from then: while the
        leader was stopped it neither sent the follower its newest batches nor read its
        acks, and a pause longer than ``lag_max_s`` shrank the ISR to the leader alone on
        waking, which refused acks=all writes under ``min_insync`` and made them be sent
        again (a fault hunt with the C producer, 2.7 s pauses at a 1.5 s lag bound).
        """
        wanted = {self.node_id}
        for replica, progress in self.followers.items():
            if live is not None and replica not in live:
                continue
            if replica in self.isr:
                if now_s - max(progress.caught_up_at_s, listening_since_s) <= lag_max_s:
                    wanted.add(replica)
            elif (
                progress.log_end_offset >= 0
                and progress.log_end_offset >= high_watermark
                and progress.log_end_offset >= self.epoch_start_offset
                and now_s - progress.caught_up_at_s <= lag_max_s
            ):
                wanted.add(replica)  # caught up again: back in
        return None if wanted == self.isr else wanted


def epoch_error(leader: LeaderReplica | None, epoch: int) -> int:
    """The error code for a follower's request at ``epoch`` (0 if it may proceed)."""
    if leader is None:
        return errors.NotLeaderError.code
    if epoch < leader.epoch:
        return errors.FencedLeaderEpochError.code
    if epoch > leader.epoch:
        return errors.UnknownLeaderEpochError.code
    return 0


# -- the node's leader duties --------------------------------------------------------------
def publish(node: NodeState, tp: TopicPartition, data: bytes) -> None:
    """Send one stamped batch to the followers' SUB sockets (best effort: they detect gaps)."""
    leader = node.leaders.get(tp)
    if leader is None or not leader.followers:
        return
    try:
        send_multipart_nowait(node.sockets.pub, [partition_key(*tp), STREAM_META.pack(leader.epoch, node.node_id), data])
    except zmq.Again:
        pass  # PUB is full; followers see the gap and fetch


def update_high_watermark(node: NodeState, tp: TopicPartition) -> bool:
    """Move the HW of a partition this node leads; True if it moved."""
    leader = node.leaders.get(tp)
    if leader is None:
        return False
    plog = node.logs[tp]
    hw = min(leader.high_watermark(plog.log_end_offset), plog.log_end_offset)
    if hw > plog.high_watermark:
        plog.high_watermark = hw
        return True
    return False


def record_replica_fetch(node: NodeState, body: dict[str, Any]) -> None:
    """A follower's fetch offset is its log end: count it like an ack."""
    now = time.monotonic()
    changed: set[TopicPartition] = set()
    for p in body["partitions"]:
        tp = (p["topic"], p["partition"])
        leader = node.leaders.get(tp)
        if leader is None or p["current_leader_epoch"] != leader.epoch:
            continue
        leader.record_follower(body["replica_id"], p["fetch_offset"], node.logs[tp].log_end_offset, now)
        if update_high_watermark(node, tp):
            changed.add(tp)
    node.partitions_changed(changed)


REPLICA_ACK_ONE_WAY_VERSION = 1  # the follower's ack right after a write: no answer wanted
REPLICA_ACK_LOG_START_VERSION = 2  # the periodic ack: its answer carries the leader's log start too


def handle_replica_ack(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
    """Record a follower's log end and move the HW. Versions 0 and 2 are answered with the
    HW and our log end (version 2 with our log start too: what a follower's periodic ack,
    every ``REPLICA_ACK_INTERVAL_S``, sends); version 1 is not answered: it is the ack a
    follower sends right after applying stream batches, on every acks=all write's path,
    and an answer to it cost a send here and a wake-up and a decode there for news the
    next periodic ack brings anyway."""
    body = request.body
    now = time.monotonic()
    changed: set[TopicPartition] = set()
    out = []
    for p in body["partitions"]:
        tp = (p["topic"], p["partition"])
        result = {"topic": tp[0], "partition": tp[1], "error": 0, "high_watermark": -1, "log_end_offset": -1,
                  "log_start_offset": -1}  # the last only in version 2's answer
        leader = node.leaders.get(tp)
        result["error"] = epoch_error(leader, p["leader_epoch"])
        if leader is not None and not result["error"]:
            plog = node.logs[tp]
            leader.record_follower(body["replica_id"], p["log_end_offset"], plog.log_end_offset, now)
            if update_high_watermark(node, tp):
                changed.add(tp)
            result["high_watermark"] = plog.high_watermark
            result["log_end_offset"] = plog.log_end_offset
            result["log_start_offset"] = plog.log_start_offset
        out.append(result)
    node.partitions_changed(changed)
    return None if request.header.api_version == REPLICA_ACK_ONE_WAY_VERSION else {"partitions": out}


def handle_offsets_for_leader_epoch(node: NodeState, _envelope: Envelope, request: apis.Message) -> dict[str, Any]:
    out = []
    for p in request.body["partitions"]:
        tp = (p["topic"], p["partition"])
        result = {"topic": tp[0], "partition": tp[1], "error": 0, "leader_epoch": -1, "end_offset": -1,
                  "log_start_offset": -1}
        leader = node.leaders.get(tp)
        result["error"] = epoch_error(leader, p["current_leader_epoch"])
        if leader is not None and not result["error"]:
            plog = node.logs[tp]
            result["leader_epoch"], result["end_offset"] = plog.end_offset_for_epoch(p["leader_epoch"])
            result["log_start_offset"] = plog.log_start_offset
        out.append(result)
    return {"partitions": out}


def check_isr(node: NodeState, now: float) -> None:
    """Shrink the ISR by lag and grow it by catch-up, writing ZooKeeper before acting."""
    if not node.session_ok():
        return  # without ZooKeeper the ISR cannot change: acks=all waits for all of it
    if node.draining_since:
        # Draining, we take no writes, and our followers, which no longer find us among the
        # live nodes, stop acking: shrinking to ourselves would leave the partitions the
        # controller has not moved yet with no live ISR member once we stop, i.e. offline
        # (169 of 667 did, at 2,000 partitions: docs/BENCHMARKS.md, "Many partitions").
        return
    lag_max_s = node.config.replica_lag_max_ms / 1000.0
    live = set(node.routing.nodes())
    changes: list[tuple[TopicPartition, int, PartitionState, int]] = []  # tp, epoch, new state, incarnation
    for tp, leader in list(node.leaders.items()):
        if tp in node.isr_jobs:
            continue
        plog = node.logs[tp]
        wanted = leader.isr_change(plog.log_end_offset, plog.high_watermark, now, lag_max_s, live,
                                   node.listening_since_s)
        if wanted is None:
            continue
        state = node.states[tp]
        # replace(): a reassignment's fields ride along unchanged.
        changes.append((tp, leader.epoch, dataclasses.replace(state, isr=tuple(r for r in state.replicas if r in wanted)),
                        plog.incarnation))
    if not changes:
        return
    # One job for all of them, its writes pipelined (zk.write_partition_states): one job per
    # partition, each two round trips in turn, took a follower's restart at 2,000
    # partitions 30 s to reach a full ISR (docs/BENCHMARKS.md, "Many partitions").
    writes = [(tp[0], new_state, incarnation) for tp, _epoch, new_state, incarnation in changes]
    try:
        node.zk_worker.submit(functools.partial(zkl.write_partition_states, node.zk, writes),
                              functools.partial(_isrs_written, node, [(tp, epoch) for tp, epoch, _s, _i in changes]))
    except errors.NodeNotReadyError:
        return
    node.isr_jobs.update(tp for tp, _epoch, _state, _incarnation in changes)


def _isrs_written(node: NodeState, written_for: list[tuple[TopicPartition, int]], results: Any,
                  error: BaseException | None) -> None:
    """Back on the loop: each partition's write, as ``_isr_written`` takes one."""
    for i, (tp, epoch) in enumerate(written_for):
        result = None if error is not None else results[i]
        failed = error if error is not None else (result if isinstance(result, Exception) else None)
        _isr_written(node, tp, epoch, None if failed is not None else result, failed)


def _isr_written(node: NodeState, tp: TopicPartition, epoch: int, written: Any, error: BaseException | None) -> None:
    """Back on the loop: use the new ISR only now that ZooKeeper has it."""
    node.isr_jobs.discard(tp)
    if isinstance(error, BadVersionError):
        # Someone (the controller) changed this partition: re-read before acting.
        node.routing_dirty = True
        node.resync_soon()
        return
    if error is not None:  # connection trouble: the next check tries again
        replica_log(tp, epoch).warning("ISR update of %s/%d failed: %s: %s", *tp, type(error).__name__, error)
        return
    leader = node.leaders.get(tp)
    if leader is None or leader.epoch != epoch:
        return  # we moved on meanwhile; the routing map will show what was written
    replica_log(tp, epoch).info("ISR of %s/%d: %s -> %s", *tp, sorted(leader.isr), sorted(written.isr))
    node.states[tp] = written
    node.routing.apply_partition_state(tp[0], written)
    leader.isr = set(written.isr) | {node.node_id}
    # An acks=all wait completes only once the HW passes it, so nothing new can be
    # answered unless the HW moved (a shrink can move it; the count of in-sync
    # replicas is read when the wait completes).
    if update_high_watermark(node, tp):
        node.partitions_changed({tp})
