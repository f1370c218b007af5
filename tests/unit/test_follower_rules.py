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


def test_a_quiet_partition_level_with_its_leader_is_acked_once_a_second_not_every_tick() -> None:
    from nodes.follower import STREAMING, FollowerReplica, idle_ack_interval_s, periodic_ack_due

    interval_s = idle_ack_interval_s(5_000)
    assert interval_s == 1.0
    assert idle_ack_interval_s(400) == 0.1  # never more than a quarter of the lag the leader allows
    quiet = FollowerReplica(1, 4, STREAMING, leader_log_end=10, last_progress_s=100.0, acked_log_end=10, acked_at_s=104.5)
    assert not periodic_ack_due(quiet, 10, 105.0, interval_s)  # level, quiet, acked 0.5 s ago
    assert periodic_ack_due(quiet, 10, 105.5, interval_s)  # a second since its last ack: keeps it in the ISR
    behind = FollowerReplica(1, 4, STREAMING, leader_log_end=12, last_progress_s=100.0, acked_log_end=10, acked_at_s=104.9)
    assert periodic_ack_due(behind, 10, 105.0, interval_s)  # the leader has more: every round
    busy = FollowerReplica(1, 4, STREAMING, leader_log_end=10, last_progress_s=104.8, acked_log_end=10, acked_at_s=104.9)
    assert periodic_ack_due(busy, 10, 105.0, interval_s)  # written a moment ago: its HW is news
    untold = FollowerReplica(1, 4, STREAMING, leader_log_end=10, last_progress_s=100.0, acked_log_end=9, acked_at_s=104.9)
    assert periodic_ack_due(untold, 10, 105.0, interval_s)


def test_the_tick_reads_the_live_nodes_once_and_leaves_quiet_partitions_out_of_most_rounds(monkeypatch: Any) -> None:
    from nodes import follower
    from nodes.follower import STREAMING, FollowerReplica

    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(follower, "_request", lambda node, address, api_key, body, kind, context, *, api_version=0:
                        sent.append(body) or 1)
    info = {1: SimpleNamespace(address="tcp://l1", replication_address="tcp://r1")}
    copies = []

    def nodes() -> dict[int, Any]:
        copies.append(1)
        return dict(info)

    followers = {("t", p): FollowerReplica(1, 4, STREAMING, leader_log_end=0) for p in range(200)}
    followers[("t", 7)].last_progress_s = 50.1  # just written: acked every round
    logs = {tp: SimpleNamespace(log_end_offset=0) for tp in followers}
    node = SimpleNamespace(node_id=2, followers=followers, logs=logs, sub_connected={"tcp://r1"},
                           routing=SimpleNamespace(nodes=nodes), config=SimpleNamespace(replica_lag_max_ms=5_000),
                           replica_requests={}, last_ack_sent_s=0.0, states={})
    follower.tick(node, 50.0)  # type: ignore[arg-type]
    assert len(copies) == 1  # once per tick, not once per followed partition
    assert len(sent) == 1 and len(sent[0]["partitions"]) == 200  # the first round tells the leader everything
    sent.clear()
    follower.tick(node, 50.2)  # type: ignore[arg-type]
    assert [p["partition"] for p in sent[0]["partitions"]] == [7]
    sent.clear()
    follower.tick(node, 51.1)  # type: ignore[arg-type]
    # A second on: the quiet ones again (7, quiet now too, was acked 0.9 s ago: its turn is next).
    assert sorted(p["partition"] for p in sent[0]["partitions"]) == [p for p in range(200) if p != 7]


def test_between_periodic_rounds_the_tick_leaves_streaming_followers_alone(monkeypatch: Any) -> None:
    """Only the followers with something to do (truncating, fetching, a request out) are
    looked at on every loop turn; the streaming ones, nearly all of an idle node's, wait for
    the periodic round. (Their logs are left out below: reading one would raise.)"""
    from nodes import follower
    from nodes.follower import FETCHING, STREAMING, FollowerReplica

    sent: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr(follower, "_request", lambda node, address, api_key, body, kind, context, *, api_version=0:
                        sent.append((api_key, body)) or 1)
    info = {1: SimpleNamespace(address="tcp://l1", replication_address="tcp://r1")}
    followers = {("t", p): FollowerReplica(1, 4, STREAMING) for p in range(100)}
    followers[("t", 100)] = FollowerReplica(1, 4, FETCHING)
    node = SimpleNamespace(node_id=2, followers=followers, logs={("t", 100): SimpleNamespace(log_end_offset=5)},
                           sub_connected={"tcp://r1"}, routing=SimpleNamespace(nodes=lambda: info),
                           config=SimpleNamespace(replica_lag_max_ms=5_000), replica_requests={},
                           last_ack_sent_s=10.0, states={})
    follower.tick(node, 10.05)  # type: ignore[arg-type]  # 50 ms after the last periodic round
    assert [(body["partitions"][0]["partition"], body["partitions"][0]["fetch_offset"]) for _key, body in sent] == [
        (100, 5)]  # the fetching one fetched
