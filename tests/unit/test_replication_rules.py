"""Controller elections and leader-side ISR/high-watermark rules, fed states and events."""

from __future__ import annotations

from typing import Any

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


def test_a_leaders_own_stall_is_not_its_followers_lag() -> None:
    # A leader stopped longer than the lag bound (SIGSTOP) neither sent its followers its
    # newest batches nor read their acks; on waking it shrank the ISR to itself (a fault hunt
    # with the C producer). The lag counts from when it listens again; a follower that
    # stays behind after that still leaves, and a dead one (unregistered) at once.
    leader = LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=0, now_s=0.0)
    leader.record_follower(2, 40, leader_end=50, now_s=1.0)
    leader.record_follower(3, 40, leader_end=50, now_s=1.0)
    # stopped from 1.0 to 4.0 s; ZooKeeper confirmed it at 4.1 s
    assert leader.isr_change(50, 40, now_s=4.2, lag_max_s=2.0) == {1}  # as it was
    assert leader.isr_change(50, 40, now_s=4.2, lag_max_s=2.0, listening_since_s=4.1) is None
    leader.record_follower(2, 50, leader_end=50, now_s=4.3)
    assert leader.isr_change(50, 40, now_s=6.0, lag_max_s=2.0, listening_since_s=4.1) is None
    assert leader.isr_change(50, 40, now_s=6.0, lag_max_s=2.0, live={1, 2}, listening_since_s=4.1) == {1, 2}
    assert leader.isr_change(50, 40, now_s=6.2, lag_max_s=2.0, listening_since_s=4.1) == {1, 2}  # 3 still behind


def test_caught_up_as_of_previous_report() -> None:
    # Under steady writes a follower is never exactly level when it reports; reaching the
    # leader's end as it was at the previous report counts as caught up at that report.
    leader = LeaderReplica.start(1, state(1, (1, 2)), log_end_offset=0, now_s=0.0)
    leader.record_follower(2, 90, leader_end=100, now_s=10.0)
    leader.record_follower(2, 105, leader_end=120, now_s=11.0)
    assert leader.followers[2].caught_up_at_s == 10.0


def test_a_draining_leader_keeps_its_isr_while_the_controller_moves_its_leaderships() -> None:
    # Its followers stop acking a leader that left the live nodes; shrinking the ISR to
    # itself after replica_lag_max_ms would take every partition the controller had not
    # moved yet offline once it stops (169 of 667 at 2,000 partitions did).
    from types import SimpleNamespace

    from nodes import leader as leader_side

    tp = ("t", 0)
    replica = LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=0, now_s=0.0)
    submitted: list[object] = []
    node = SimpleNamespace(session_ok=lambda: True, config=SimpleNamespace(replica_lag_max_ms=5_000),
                           routing=SimpleNamespace(nodes=lambda: {2: None, 3: None}), leaders={tp: replica},
                           isr_jobs=set(), logs={tp: SimpleNamespace(log_end_offset=0, high_watermark=0, incarnation=1)},
                           states={tp: state(1, (1, 2, 3))}, zk=None, draining_since=0.0, listening_since_s=0.0,
                           zk_worker=SimpleNamespace(submit=lambda job, done: submitted.append(job)))
    node.draining_since = 100.0
    leader_side.check_isr(node, 120.0)  # type: ignore[arg-type]
    assert submitted == []  # 20 s without an ack, yet no shrink while draining
    node.draining_since = 0.0
    leader_side.check_isr(node, 120.0)  # type: ignore[arg-type]
    assert len(submitted) == 1  # not draining: the same lag shrinks it, as before


def test_the_isr_changes_of_one_check_go_to_zookeeper_as_one_job() -> None:
    """One job per partition, each two round trips in turn on the node's one ZooKeeper
    worker, took a restarted follower 30 s to rejoin 1,333 ISRs at 2,000 partitions."""
    from types import SimpleNamespace

    from nodes import leader as leader_side

    tps = [("t", p) for p in range(3)]
    leaders = {tp: LeaderReplica.start(1, state(1, (1, 2, 3)), log_end_offset=0, now_s=0.0) for tp in tps}
    submitted: list[tuple[Any, Any]] = []
    node = SimpleNamespace(session_ok=lambda: True, config=SimpleNamespace(replica_lag_max_ms=5_000),
                           routing=SimpleNamespace(nodes=lambda: {1: None, 2: None}), leaders=leaders, isr_jobs=set(),
                           logs={tp: SimpleNamespace(log_end_offset=0, high_watermark=0, incarnation=1) for tp in tps},
                           states={tp: state(1, (1, 2, 3)) for tp in tps}, zk=None, draining_since=0.0, listening_since_s=0.0,
                           zk_worker=SimpleNamespace(submit=lambda job, done: submitted.append((job, done))))
    leader_side.check_isr(node, 1.0)  # type: ignore[arg-type]  # node 3 is gone: out of every ISR
    assert len(submitted) == 1 and node.isr_jobs == set(tps)
    job, _done = submitted[0]
    assert [(topic, s.isr) for topic, s, _incarnation in job.args[1]] == [("t", (1, 2))] * 3
