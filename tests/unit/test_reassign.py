"""Reassignment decisions (nodes/reassign.py), the catch-up throttle, and the partition
state's reassignment fields, as pure functions."""

from __future__ import annotations

import dataclasses

import pytest

from fabric import errors
from fabric.zk import PartitionState, TopicConfig
from nodes.follower import REPLICA_FETCH_BYTES_MAX, FollowerReplica, fetch_allowance
from nodes.leader import LeaderReplica
from nodes.reassign import (
    begin,
    cancel,
    catch_up_throttle,
    complete,
    grow_internal,
    grown_internal_config,
)

STATE = PartitionState(0, (1, 2, 3), 1, 5, (1, 2, 3), version=7)
REGISTERED = {1, 2, 3, 4}


def test_begin_adds_first_and_removes_nothing_yet() -> None:
    moving = begin(STATE, (4, 2, 3), 1_000_000, REGISTERED, min_insync=2)
    assert moving is not None
    assert moving.replicas == (4, 2, 3, 1) and moving.adding == (4,) and moving.removing == (1,)
    assert moving.leader == 1 and moving.leader_epoch == 5 and moving.isr == (1, 2, 3)
    assert moving.throttle_bytes_per_s == 1_000_000 and moving.version == 7


def test_begin_refuses_bad_targets_and_a_second_move() -> None:
    with pytest.raises(errors.InvalidRequestError):
        begin(STATE, (), 0, REGISTERED, 2)
    with pytest.raises(errors.InvalidRequestError):
        begin(STATE, (4, 4, 2), 0, REGISTERED, 2)
    with pytest.raises(errors.InvalidRequestError):
        begin(STATE, (9, 2, 3), 0, REGISTERED, 2)  # not a registered node
    with pytest.raises(errors.InvalidReplicationFactorError):
        begin(STATE, (4,), 0, REGISTERED, 2)  # fewer than min_insync
    with pytest.raises(errors.InvalidRequestError):
        begin(STATE, (4, 2, 3), 10, REGISTERED, 2)  # a throttle too small to be meant
    moving = begin(STATE, (4, 2, 3), 0, REGISTERED, 2)
    assert moving is not None
    assert begin(moving, (4, 2, 3), 0, REGISTERED, 2) is None  # the same move again: nothing changes
    faster = begin(moving, (4, 2, 3), 5_000_000, REGISTERED, 2)  # the same move with a new throttle
    assert faster is not None and faster.throttle_bytes_per_s == 5_000_000 and faster.replicas == moving.replicas
    with pytest.raises(errors.ReassignmentInProgressError):
        begin(moving, (2, 3, 1), 0, REGISTERED, 2)


def test_begin_with_nothing_to_copy() -> None:
    assert begin(STATE, (1, 2, 3), 0, REGISTERED, 2) is None
    reordered = begin(STATE, (3, 2, 1), 0, REGISTERED, 2)
    assert reordered is not None and reordered.replicas == (3, 2, 1) and not reordered.reassigning


def test_complete_waits_for_the_new_replica_in_the_isr_then_moves_the_leader() -> None:
    moving = begin(STATE, (4, 2, 3), 0, REGISTERED, 2)
    assert moving is not None
    assert complete(moving, REGISTERED) is None  # node 4 is not in sync yet
    in_sync = dataclasses.replace(moving, isr=(1, 2, 3, 4))
    done = complete(in_sync, REGISTERED)
    assert done is not None
    assert done.replicas == (4, 2, 3) and done.isr == (2, 3, 4) and not done.reassigning
    assert done.leader == 4 and done.leader_epoch == 6  # the leader was removed: a new term fences it
    assert complete(done, REGISTERED) is None


def test_complete_keeps_a_leader_that_stays() -> None:
    moving = begin(STATE, (1, 2, 4), 0, REGISTERED, 2)
    assert moving is not None and moving.removing == (3,)
    done = complete(dataclasses.replace(moving, isr=(1, 2, 4)), REGISTERED)
    assert done is not None and done.leader == 1 and done.leader_epoch == 5 and done.isr == (1, 2, 4)


def test_complete_waits_while_no_new_replica_can_lead() -> None:
    moving = dataclasses.replace(begin(STATE, (4,), 0, REGISTERED, 1) or STATE, isr=(1, 4))
    assert complete(moving, {1, 2, 3}) is None  # node 4 is in sync but not live
    assert complete(dataclasses.replace(moving, leader=-1), REGISTERED) is None  # offline: elect first


def test_partition_state_round_trips_the_move_and_reads_old_znodes() -> None:
    moving = begin(STATE, (4, 2, 3), 2048, REGISTERED, 2)
    assert moving is not None
    assert PartitionState.decode(0, moving.encode(), 7) == moving
    assert b"adding" not in STATE.encode()  # a partition at rest reads as it always did
    assert PartitionState.decode(0, STATE.encode(), 7) == STATE


def test_only_adding_replicas_are_throttled() -> None:
    moving = begin(STATE, (4, 2, 3), 100_000, REGISTERED, 2)
    assert catch_up_throttle(moving, 4) == 100_000
    assert catch_up_throttle(moving, 2) == 0 and catch_up_throttle(None, 4) == 0


def test_fetch_allowance_is_a_token_bucket() -> None:
    f = FollowerReplica(1, 5)
    assert fetch_allowance(f, 0, 10.0) == REPLICA_FETCH_BYTES_MAX
    rate = 1_000_000
    first = fetch_allowance(f, rate, 10.0)
    assert 0 < first <= rate
    f.throttle_credit_bytes -= 3 * rate  # a reply larger than the credit: pay by waiting
    assert fetch_allowance(f, rate, 11.0) == 0
    assert fetch_allowance(f, rate, 13.5) > 0
    assert fetch_allowance(f, rate, 100.0) == rate  # idle time banks at most one second
    f.throttle_credit_bytes -= 50 * rate  # unthrottled fetches meanwhile ...
    assert fetch_allowance(f, 0, 101.0) == REPLICA_FETCH_BYTES_MAX
    assert fetch_allowance(f, rate, 102.0) > 0  # ... leave no debt for a throttle set later


def test_leader_follows_new_replicas_and_forgets_removed_ones() -> None:
    leader = LeaderReplica.start(1, STATE, 100, 0.0)
    leader.set_replicas((1, 2, 3, 4), 1.0)
    assert set(leader.followers) == {2, 3, 4} and leader.followers[4].log_end_offset == -1
    assert leader.high_watermark(100) == min(p.log_end_offset for r, p in leader.followers.items() if r in leader.isr)
    leader.set_replicas((1, 2, 4), 2.0)
    assert set(leader.followers) == {2, 4}


def test_cancel_keeps_the_old_replicas_and_drops_the_new() -> None:
    with pytest.raises(errors.InvalidRequestError):
        cancel(STATE, REGISTERED)  # nothing is moving
    moving = begin(STATE, (4, 2, 3), 1_000_000, REGISTERED, 2)
    assert moving is not None
    back = cancel(dataclasses.replace(moving, isr=(1, 2, 3, 4)), REGISTERED)
    assert back.replicas == (2, 3, 1) and back.isr == (1, 2, 3)  # the order of the union, less the new
    assert not back.reassigning and back.leader == 1 and back.leader_epoch == 5 and back.throttle_bytes_per_s == 0


def test_cancel_moves_leadership_off_a_new_replica_or_refuses() -> None:
    moving = begin(STATE, (4, 2, 5), 0, REGISTERED | {5}, 2)
    assert moving is not None and moving.adding == (4, 5)
    led_by_new = dataclasses.replace(moving, leader=4, leader_epoch=6, isr=(4, 2))
    back = cancel(led_by_new, REGISTERED | {5})
    assert back.leader == 2 and back.leader_epoch == 7 and set(back.replicas) == {1, 2, 3} and back.isr == (2,)
    with pytest.raises(errors.InvalidRequestError):
        cancel(dataclasses.replace(led_by_new, isr=(4,)), REGISTERED | {5})


def test_grow_internal_adds_the_least_loaded_live_nodes_then_completes_as_a_move() -> None:
    small = PartitionState(0, (1,), 1, 5, (1,), version=3)
    grown = grow_internal(small, {1, 2, 3, 4}, load={2: 10, 3: 1, 4: 5}, factor=3)
    assert grown is not None
    assert grown.replicas == (1, 3, 4) and grown.adding == (3, 4) and grown.removing == ()
    assert grown.leader == 1 and grown.leader_epoch == 5  # no leader change: nothing fenced
    assert complete(dataclasses.replace(grown, isr=(1, 3, 4)), {1, 3, 4}) is not None
    assert grow_internal(small, {1}, load={}, factor=3) is None  # nobody to add yet
    assert grow_internal(grown, {1, 2, 3, 4}, load={}, factor=3) is None  # already moving
    assert grow_internal(STATE, {1, 2, 3, 4}, load={}, factor=3) is None  # three copies already
    assert grow_internal(dataclasses.replace(small, leader=-1), {1, 2}, load={}, factor=3) is None  # no leader
    two = grow_internal(small, {1, 2}, load={}, factor=3)
    assert two is not None and two.replicas == (1, 2)  # what the live nodes allow, more later


def test_a_grown_internal_topic_gets_the_min_insync_its_copies_allow() -> None:
    """Made on one node (replication factor 1, min_insync 1), __consumer_offsets kept
    min_insync 1 after the controller gave it three copies: acks=all group commits were
    acknowledged by one replica. Once every partition has its copies for good, the config
    says so; a user's topic keeps what its user set."""
    made = TopicConfig.build(2, 1, {"retention_ms": "-1", "min_insync": "1"}, 0)
    one = PartitionState(0, (1,), 1, 5, (1,))
    grown = grow_internal(one, {1, 2, 3}, load={}, factor=3)
    assert grown is not None
    three = complete(dataclasses.replace(grown, isr=(1, 2, 3)), {1, 2, 3})
    assert three is not None and three.replicas == (1, 2, 3)
    other = dataclasses.replace(three, partition=1)

    raised = grown_internal_config("__consumer_offsets", made, [three, other])
    assert raised is not None and (raised.replication_factor, raised.min_insync) == (3, 2)
    assert dataclasses.replace(raised, replication_factor=1, min_insync=1) == made  # nothing else changes
    assert grown_internal_config("__queue_state", made, [three, other]) == raised
    assert grown_internal_config("__consumer_offsets", raised, [three, other]) is None  # already raised
    # Not while a partition is still copying (its ISR may be the one old replica), nor
    # while one is missing from the states read.
    assert grown_internal_config("__consumer_offsets", made, [three, dataclasses.replace(grown, partition=1)]) is None
    assert grown_internal_config("__consumer_offsets", made, [three]) is None
    # Two copies: min_insync 2, as creation on two nodes would set it.
    two = PartitionState(1, (1, 2), 1, 5, (1, 2))
    assert grown_internal_config("__consumer_offsets", made, [three, two]) == \
        dataclasses.replace(made, replication_factor=2, min_insync=2)
    # Never lowered; a user's topic is never touched.
    assert grown_internal_config("__consumer_offsets", raised, [one, other]) is None
    assert grown_internal_config("events", made, [three, other]) is None
