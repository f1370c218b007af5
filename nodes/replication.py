"""Replica roles of one partition on one node, and the rules that move them.

A node is, per partition, the LEADER, a FOLLOWER of some leader at some epoch, or
nothing. ``decide_role`` maps the partition state from ZooKeeper to the role; the node
applies the result in one place (``Node._apply_roles``), so a role change is never made
piecemeal by whichever message happened to arrive.

Leader side (``LeaderReplica``): follower progress, the in-sync replica set as committed
in ZooKeeper, the high watermark (HW = the lowest log end among the ISR, the leader
included), and the ISR shrink/expand decisions. An ISR change is always written to
ZooKeeper (version-checked) before the leader uses it, so an acknowledgement never rests
on an ISR the controller has not seen.

Follower side (``FollowerReplica``): a small state machine::

    TRUNCATING --(leader says where our last epoch ends; truncate)--> FETCHING
    FETCHING   --(a fetch returned nothing new: level with the leader)--> STREAMING
    STREAMING  --(gap in the PUB stream, or no progress while the leader is ahead)--> FETCHING
    any        --(new leader or epoch)--> TRUNCATING

The leader publishes each appended batch on PUB; PUB/SUB drops silently (slow joiner,
high-water mark, reconnects), so a follower checks that every batch starts exactly at its
log end and falls back to FETCH over DEALER/ROUTER otherwise (the Clone pattern).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric.zk import PartitionState

LEADER = "leader"
FOLLOWER = "follower"
NONE = "none"

TRUNCATING = "truncating"
FETCHING = "fetching"
STREAMING = "streaming"


def decide_role(state: PartitionState, node_id: int) -> str:
    if state.leader == node_id:
        return LEADER
    if node_id in state.replicas and state.leader >= 0:
        return FOLLOWER
    return NONE


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
        if log_end_offset >= leader_end:
            progress.caught_up_at_s = now_s
        elif log_end_offset >= progress.leader_end_at_last_ack:
            progress.caught_up_at_s = max(progress.caught_up_at_s, progress.last_ack_at_s)
        progress.log_end_offset = max(progress.log_end_offset, log_end_offset) if progress.log_end_offset >= 0 else log_end_offset
        progress.last_ack_at_s = now_s
        progress.leader_end_at_last_ack = leader_end

    def high_watermark(self, leader_end: int) -> int:
        hw = leader_end
        for replica in self.isr:
            if replica == self.node_id:
                continue
            progress = self.followers.get(replica)
            hw = min(hw, progress.log_end_offset if progress is not None else -1)
        return hw

    def isr_change(self, leader_end: int, high_watermark: int, now_s: float, lag_max_s: float) -> set[int] | None:
        """The ISR this leader wants now, or None if it is fine as it is."""
        wanted = {self.node_id}
        for replica, progress in self.followers.items():
            if replica in self.isr:
                if now_s - progress.caught_up_at_s <= lag_max_s:
                    wanted.add(replica)
            elif (
                progress.log_end_offset >= 0
                and progress.log_end_offset >= high_watermark
                and progress.log_end_offset >= self.epoch_start_offset
                and now_s - progress.caught_up_at_s <= lag_max_s
            ):
                wanted.add(replica)  # caught up again: back in
        return None if wanted == self.isr else wanted


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
