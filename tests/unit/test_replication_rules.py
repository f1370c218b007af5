"""Controller elections and leader-side ISR/high-watermark rules, fed states and events."""

from __future__ import annotations

from fabric.zk import PartitionState
from nodes import controller
from nodes.leader import LeaderReplica
from nodes.roles import FOLLOWER, LEADER, NONE, decide_role


def state(leader: int, isr: tuple[int, ...], replicas: tuple[int, ...] = (1, 2, 3), epoch: int = 4) -> PartitionState:
    return PartitionState(0, replicas, leader, epoch, isr, version=9)


def test_alive_leader_is_left_alone() -> None:
    assert controller.elect(state(1, (1, 2, 3)), live={1, 2, 3}) is None


def test_dead_leader_replaced_by_first_live_isr_member() -> None:
    new = controller.elect(state(1, (1, 3)), live={2, 3})
    assert new is not None
    assert (new.leader, new.leader_epoch, new.isr, new.version) == (3, 5, (3,), 9)  # version: the fence


def test_no_live_isr_member_goes_offline_keeping_the_isr() -> None:
    new = controller.elect(state(1, (1,)), live={2, 3})
    assert new is not None and new.leader == -1 and new.isr == (1,)
    back = controller.elect(new, live={1, 2, 3})
    assert back is not None and back.leader == 1 and back.leader_epoch == 6


def test_unclean_election_only_when_enabled() -> None:
    assert controller.elect(state(-1, (1,)), live={2, 3}) is None
    new = controller.elect(state(-1, (1,)), live={2, 3}, unclean=True)
    assert new is not None and new.leader == 2 and new.isr == (2,)


def test_preferred_replica_takes_leadership_back_only_when_in_sync() -> None:
    assert controller.prefer(state(2, (2, 3)), live={1, 2, 3}) is None
    new = controller.prefer(state(2, (1, 2, 3)), live={1, 2, 3})
    assert new is not None and new.leader == 1 and new.leader_epoch == 5


def test_roles() -> None:
    assert decide_role(state(1, (1, 2, 3)), 1) == LEADER
    assert decide_role(state(1, (1, 2, 3)), 2) == FOLLOWER
    assert decide_role(state(-1, (1,)), 2) == NONE
    assert decide_role(state(1, (1, 2), replicas=(1, 2)), 3) == NONE


def test_high_watermark_is_the_lowest_isr_log_end() -> None:
    leader = LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=100, now_s=0.0)
    assert leader.high_watermark(120) == -1  # followers not heard from yet: nothing new is committed
    leader.record_follower(2, 110, leader_end=120, now_s=1.0)
    leader.record_follower(3, 105, leader_end=120, now_s=1.0)
    assert leader.high_watermark(120) == 105
    leader.isr = {1, 2}
    assert leader.high_watermark(120) == 110


def test_lagging_follower_leaves_and_caught_up_follower_returns() -> None:
    leader = LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=0, now_s=0.0)
    leader.record_follower(2, 50, leader_end=50, now_s=1.0)
    leader.record_follower(3, 10, leader_end=50, now_s=1.0)
    assert leader.isr_change(50, 10, now_s=1.5, lag_max_s=2.0) is None
    leader.record_follower(2, 50, leader_end=50, now_s=3.0)
    assert leader.isr_change(50, 10, now_s=3.5, lag_max_s=2.0) == {1, 2}  # 3 stuck since its start
    leader.isr = {1, 2}
    leader.record_follower(3, 50, leader_end=50, now_s=4.0)
    assert leader.isr_change(50, 50, now_s=4.0, lag_max_s=2.0) == {1, 2, 3}


def test_unregistered_follower_leaves_the_isr_at_once() -> None:
    # A follower whose znode is gone (stopped, or its session ended) cannot acknowledge:
    # it leaves the ISR without waiting out the lag, and comes back only once registered
    # and caught up.
    leader = LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=0, now_s=0.0)
    leader.record_follower(2, 50, leader_end=50, now_s=1.0)
    leader.record_follower(3, 50, leader_end=50, now_s=1.0)
    assert leader.isr_change(50, 50, now_s=1.1, lag_max_s=2.0, live={1, 2, 3}) is None
    assert leader.isr_change(50, 50, now_s=1.1, lag_max_s=2.0, live={1, 2}) == {1, 2}
    leader.isr = {1, 2}
    assert leader.isr_change(50, 50, now_s=1.2, lag_max_s=2.0, live={1, 2}) is None
    assert leader.isr_change(50, 50, now_s=1.2, lag_max_s=2.0, live={1, 2, 3}) == {1, 2, 3}


def test_caught_up_as_of_previous_report() -> None:
    # Under steady writes a follower is never exactly level when it reports; reaching the
    # leader's end as it was at the previous report counts as caught up at that report.
    leader = LeaderReplica.start(1, state(1, (1, 2)), log_end_offset=0, now_s=0.0)
    leader.record_follower(2, 90, leader_end=100, now_s=10.0)
    leader.record_follower(2, 105, leader_end=120, now_s=11.0)
    assert leader.followers[2].caught_up_at_s == 10.0
