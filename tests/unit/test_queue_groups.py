"""Deleting and expiring queue groups (docs/QUEUES.md, "Groups"): the pure state logic, the
tombstone record and its replay, the room and the trim a deleted group gives back, the
expiry rules, the config key and the ACL. No sockets; clocks are passed in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fabric import errors
from fabric import zk as zkl
from fabric.auth.acl import Operation, Resource, ResourceType, required_access
from fabric.protocol import queues as qp
from fabric.protocol import schema
from nodes.queue_durable import Slot
from nodes.queue_share import COUNTING, SharePartition
from nodes.queue_state import ACKED, Change

DAY_MS = 24 * 3_600_000


@dataclass
class _Log:
    """What SharePartition reads of a partition's log to place a new group."""

    log_start_offset: int = 0


def _share(**config: str) -> SharePartition:
    return SharePartition("jobs", 0, 1, zkl.TopicConfig.build(1, 1, {"queue": "true", **config}, 0))


def _group_with(share: SharePartition, name: str, messages: int, plog: _Log) -> None:
    g = share.group(name, plog)  # type: ignore[arg-type]
    for offset in range(messages):
        g.state.append(offset, 0)


def test_delete_frees_room_among_queue_groups_max() -> None:
    share, plog = _share(), _Log()
    for n in range(qp.QUEUE_GROUPS_MAX):
        _group_with(share, f"g{n}", 1, plog)
    with pytest.raises(errors.GroupMaxSizeReachedError, match="QUEUE_GROUPS_MAX"):
        share.check_group_room("one-more")
    share.delete_group("g7", now_ms=0)
    share.check_group_room("one-more")  # room again
    assert "g7" not in share.groups and len(share.groups) == qp.QUEUE_GROUPS_MAX - 1


def test_delete_refuses_an_unknown_group_and_one_holding_live_leases() -> None:
    share, plog = _share(visibility_timeout_ms="1000"), _Log()
    with pytest.raises(errors.GroupIdNotFoundError):
        share.delete_group("nobody", now_ms=0)
    with pytest.raises(errors.GroupIdNotFoundError):
        share.delete_group(COUNTING, now_ms=0)
    _group_with(share, "workers", 2, plog)
    g = share.groups["workers"]
    leases, _ = g.state.acquire("w1", 1, now_ms=0)
    assert len(leases) == 1
    with pytest.raises(errors.GroupNotEmptyError, match="1 live leases"):
        share.delete_group("workers", now_ms=999)
    assert g.state.live_leases(999) == 1 and g.state.live_leases(1_000) == 0
    share.delete_group("workers", now_ms=1_000)  # the lease ended (not ticked yet): not live
    assert "workers" not in share.groups


def test_a_deleted_group_no_longer_holds_back_the_trim() -> None:
    share, plog = _share(), _Log()
    _group_with(share, "live", 10, plog)
    _group_with(share, "abandoned", 10, plog)
    live = share.groups["live"].state
    leases, _ = live.acquire("w", 10, now_ms=0)
    for lease in leases:
        live.ack("w", lease.offset, now_ms=1)
    slot = Slot(share)
    assert min(slot.written_starts().values()) == 0  # the abandoned group holds the log at 0
    share.delete_group("abandoned", now_ms=2)
    assert slot.written_starts() == {"live": 10}
    # While the tombstone is being written, the trim still counts the group as written.
    slot.durable_starts, slot.flushing = {"live": 10, "abandoned": 0}, True
    assert min(slot.written_starts().values()) == 0


def test_the_tombstone_replays_as_a_deletion_and_later_records_start_afresh() -> None:
    share, plog = _share(), _Log()
    share.restore("old", 0, 4, Change(0, ACKED, 1, 0, ""), plog, written_ms=5_000)  # type: ignore[arg-type]
    assert share.groups["old"].used_ms == 5_000
    share.mark("old", qp.STATE_DELETED, 6_000, plog)  # type: ignore[arg-type]
    assert "old" not in share.groups
    plog.log_start_offset = 3
    share.restore("old", 7, 7, Change(7, ACKED, 1, 0, ""), plog, written_ms=7_000)  # type: ignore[arg-type]
    g = share.groups["old"]
    assert sorted(g.restore) == [7] and g.state.start_offset == 3  # starts at what is left, not at 0
    share.mark("idle", qp.STATE_USED, 8_000, plog)  # type: ignore[arg-type]
    assert share.groups["idle"].used_ms == share.groups["idle"].used_written_ms == 8_000


def test_group_records_encode_and_decode() -> None:
    for state in (qp.STATE_DELETED, qp.STATE_USED):
        raw = qp.encode_state_record(12, state, 0, 0, "deleted")
        assert raw == schema.encode(qp.STATE_RECORD_V0, {
            "version": 0, "offset": 12, "last_offset": 12, "state": qp.STATE_CODES[state], "delivery_count": 0,
            "visible_at_ms": 0, "reason": "deleted"})
        fields = qp.decode_state_record(raw)
        assert fields["state"] == state and fields["offset"] == fields["last_offset"] == 12


def test_idle_groups_expire_after_their_retention_only() -> None:
    share, plog = _share(visibility_timeout_ms="5000"), _Log()
    for name in ("a", "b", "c", "d"):
        _group_with(share, name, 1, plog)
    retention = 7 * DAY_MS
    # An unknown last use starts the clock at the first check, never expires at once.
    assert share.idle_groups(100, retention, set(), 10) == []
    assert all(g.used_ms == 100 for g in share.groups.values())
    share.used(share.groups["b"], 50_000)  # used later
    share.groups["c"].state.acquire("w", 1, now_ms=retention + 100)  # leased until retention + 5,100
    at = retention + 100
    assert share.idle_groups(at - 1, retention, set(), 10) == []
    assert share.idle_groups(at, retention, {"d"}, 10) == ["a"]  # b used since, c leased, d waiting
    assert share.idle_groups(at, retention, set(), 1) == ["a"]  # bounded work per check
    assert share.idle_groups(retention + 5_100, retention, set(), 10) == ["a", "c", "d"]  # c's lease ended
    assert share.idle_groups(50_000 + retention, retention, set(), 10) == ["a", "b", "c", "d"]


def test_the_retention_config_key_is_validated_like_the_other_queue_keys() -> None:
    assert zkl.TopicConfig.build(1, 1, {"queue": "true"}, 0).queue_group_retention_ms == 7 * DAY_MS
    assert zkl.TopicConfig.build(1, 1, {"queue_group_retention_ms": "60000"}, 0).queue_group_retention_ms == 60_000
    assert "queue_group_retention_ms" in zkl.TopicConfig.ALTERABLE
    for bad in ("0", str(qp.QUEUE_GROUP_RETENTION_MS_MIN - 1), str(qp.QUEUE_GROUP_RETENTION_MS_MAX + 1)):
        with pytest.raises(errors.InvalidQueueConfigError, match="QUEUE_GROUP_RETENTION_MS_MIN"):
            zkl.TopicConfig.build(1, 1, {"queue_group_retention_ms": bad}, 0)
    with pytest.raises(errors.InvalidConfigError):
        zkl.TopicConfig.build(1, 1, {"queue_group_retention_ms": "7d"}, 0)


def test_deleting_a_queue_group_needs_delete_on_the_group() -> None:
    assert required_access(qp.API_QUEUE_DELETE_GROUP, {"queue": "jobs", "group": "w"}) == [
        (Operation.DELETE, Resource(ResourceType.GROUP, "w"))]


def test_purging_needs_delete_on_the_topic_or_on_the_one_group() -> None:
    topic = Resource(ResourceType.TOPIC, "jobs")
    assert required_access(qp.API_QUEUE_PURGE, {"queue": "jobs", "group": ""}) == [(Operation.DELETE, topic)]
    assert required_access(qp.API_QUEUE_PURGE, {"queue": "jobs", "group": "w"}) == [
        (Operation.CONSUME, topic), (Operation.DELETE, Resource(ResourceType.GROUP, "w"))]


def test_the_delete_group_schema_round_trips() -> None:
    request, response = qp.SCHEMAS[(qp.API_QUEUE_DELETE_GROUP, 0)]
    assert schema.decode(request, schema.encode(request, {"queue": "jobs", "group": "w"})) == {
        "queue": "jobs", "group": "w"}
    body = {"error": 0, "message": "", "partitions": [{"partition": 0, "error": 0},
                                                       {"partition": 1, "error": errors.GroupIdNotFoundError.code}]}
    assert schema.decode(response, schema.encode(response, body)) == body


def test_a_queue_nobody_reads_is_counted_and_a_plain_topic_is_not() -> None:
    """docs/OPERATIONS.md, "Queue depth": COUNTING is made for a queue partition with no
    group (its depth series), and gives way to the first real group."""
    share, plog = _share(), _Log()
    share.count_unconsumed(plog)  # type: ignore[arg-type]
    assert list(share.groups) == [COUNTING]
    _group_with(share, "workers", 1, plog)
    share.count_unconsumed(plog)  # type: ignore[arg-type]
    assert list(share.groups) == ["workers"]
    plain = SharePartition("events", 0, 1, zkl.TopicConfig.build(1, 1, {}, 0))
    plain.count_unconsumed(plog)  # type: ignore[arg-type]
    assert plain.groups == {}  # read in queue mode only once a group does: its whole log is not held
