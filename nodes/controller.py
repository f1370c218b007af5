"""Controller decisions: pure functions from (partition state, live nodes) to a new state.

One node is the controller (it holds the ephemeral ``/fabric/controller`` znode). When a
leader's ephemeral node disappears, or an offline partition's ISR member comes back, the
controller writes a new partition state with a version-checked set: a deposed controller
(or a leader acting on old state) fails its write instead of overwriting a newer decision.
"""

from __future__ import annotations

import dataclasses
import logging

from fabric.zk import PartitionState

log = logging.getLogger("fabric.controller")


def elect(state: PartitionState, live: set[int], *, unclean: bool = False) -> PartitionState | None:
    """The state after electing a leader if the current one is gone; None if nothing changes.

    Clean election: the first live replica (in preferred order) that is in the ISR. The
    dead leader leaves the ISR. If no ISR member is alive, the partition goes offline
    (leader -1) and keeps its ISR, so the first of those members to return is elected and
    nothing it acknowledged is lost. Unclean election (per topic, off by default) picks
    any live replica instead and may lose acknowledged writes; it is logged as an error.
    """
    if state.leader >= 0 and state.leader in live:
        return None
    candidates = [r for r in state.replicas if r in state.isr and r in live]
    if candidates:
        leader = candidates[0]
        isr = tuple(r for r in state.isr if r in live)
        return dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=isr)
    if unclean:
        live_replicas = [r for r in state.replicas if r in live]
        if live_replicas:
            leader = live_replicas[0]
            log.error(
                "UNCLEAN leader election of partition %d: node %d was not in the ISR %s; "
                "acknowledged writes may be lost",
                state.partition, leader, list(state.isr),
            )
            return dataclasses.replace(state, leader=leader, leader_epoch=state.leader_epoch + 1, isr=(leader,))
    if state.leader >= 0:
        return dataclasses.replace(state, leader=-1, leader_epoch=state.leader_epoch + 1)
    return None


def prefer(state: PartitionState, live: set[int]) -> PartitionState | None:
    """Move leadership to the first replica if it is alive and in the ISR."""
    preferred = state.replicas[0]
    if state.leader == preferred or preferred not in state.isr or preferred not in live:
        return None
    return dataclasses.replace(state, leader=preferred, leader_epoch=state.leader_epoch + 1)
