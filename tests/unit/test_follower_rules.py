"""Follower truncation (KIP-101/279) and the leader's epoch check of follower requests."""

from __future__ import annotations

from fabric import errors
from fabric.zk import PartitionState
from nodes.follower import truncation_target
from nodes.leader import LeaderReplica, epoch_error


def test_truncate_to_the_end_of_the_last_shared_epoch() -> None:
    # Our log has epoch 3 up to 150; the leader says epoch 3 ends at 120 in its log.
    assert truncation_target(3, 120, 150, log_start_offset=0) == 120
    # The leader's epoch 3 went further than ours: keep ours (never cut to the HW).
    assert truncation_target(3, 200, 150, log_start_offset=0) == 150


def test_nothing_shared_truncates_to_the_log_start() -> None:
    assert truncation_target(-1, -1, 150, log_start_offset=40) == 40  # leader has nothing that old
    assert truncation_target(2, 90, -1, log_start_offset=40) == 40  # we never had that epoch


def test_follower_requests_are_fenced_by_epoch() -> None:
    leader = LeaderReplica.start(1, PartitionState(0, (1, 2), 1, 7, (1, 2), 0), 0, 0.0)
    assert epoch_error(leader, 7) == 0
    assert epoch_error(leader, 6) == errors.FencedLeaderEpochError.code
    assert epoch_error(leader, 8) == errors.UnknownLeaderEpochError.code
    assert epoch_error(None, 7) == errors.NotLeaderError.code
