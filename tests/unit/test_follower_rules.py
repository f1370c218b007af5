"""Follower truncation (KIP-101/279), the leader's epoch check of follower requests, and
the acks a drain of the leaders' streams sends."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from fabric import errors
from fabric.zk import PartitionState
from nodes import leader
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


def test_a_drain_acks_only_what_it_appended_one_request_per_leader(monkeypatch: Any) -> None:
    from nodes import follower
    from nodes.follower import FETCHING, STREAMING, FollowerReplica

    sent: list[tuple[str, dict[str, Any], int]] = []
    monkeypatch.setattr(follower, "_request", lambda node, address, api_key, body, kind, context, *, api_version=0:
                        sent.append((address, body, api_version)) or 1)
    info = {1: SimpleNamespace(address="tcp://l1", replication_address="tcp://r1"),
            2: SimpleNamespace(address="tcp://l2", replication_address="tcp://r2")}
    followers = {("a", 0): FollowerReplica(1, 4, STREAMING), ("a", 1): FollowerReplica(1, 4, STREAMING),
                 ("b", 0): FollowerReplica(2, 9, STREAMING), ("b", 1): FollowerReplica(2, 9, FETCHING),
                 ("c", 0): FollowerReplica(3, 1, STREAMING), ("c", 1): FollowerReplica(1, 4, STREAMING)}
    followers[("c", 1)].acked_log_end = 7  # nothing new since its last ack
    logs = {tp: SimpleNamespace(log_end_offset=10 + i) for i, tp in enumerate(followers)}
    logs[("c", 1)].log_end_offset = 7
    node = SimpleNamespace(node_id=5, followers=followers, logs=logs, sub_connected={"tcp://r1", "tcp://r2"},
                           routing=SimpleNamespace(nodes=lambda: info))
    follower.ack_appended(node, set(followers))  # type: ignore[arg-type]
    by_address = {address: (body, version) for address, body, version in sent}
    assert set(by_address) == {"tcp://l1", "tcp://l2"}  # leader 3 is not known: nothing sent to it
    assert all(version == leader.REPLICA_ACK_ONE_WAY_VERSION and body["replica_id"] == 5
               for body, version in by_address.values())
    assert sorted((p["topic"], p["partition"], p["log_end_offset"], p["leader_epoch"])
                  for p in by_address["tcp://l1"][0]["partitions"]) == [("a", 0, 10, 4), ("a", 1, 11, 4)]
    assert [(p["topic"], p["partition"]) for p in by_address["tcp://l2"][0]["partitions"]] == [("b", 0)]
    assert followers[("a", 0)].acked_log_end == 10 and followers[("b", 0)].acked_log_end == 12
    assert followers[("c", 0)].acked_log_end == -1  # unsent: the tick tries again
    assert followers[("b", 1)].acked_log_end == -1  # not streaming
