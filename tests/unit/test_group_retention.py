"""Offsets retention (nodes/group_retention.py): empty consumer groups are forgotten after
``offsets_retention_ms`` (an empty group that never committed sooner), so a coordinator's
state does not grow with every group id ever used; groups with members never are. And the
time a group became empty survives a reload and a restatement (nodes/group_records.py)."""

from __future__ import annotations

from fabric.protocol import groups as gp
from nodes import group_records, group_retention
from nodes.group_retention import EMPTY_GROUP_RETENTION_MS
from nodes.group_state import GroupState

DAY_MS = 24 * 3600 * 1000
RETENTION_MS = 7 * DAY_MS
NOW_MS = 1_800_000_000_000


def _member(member_id: str) -> dict[str, object]:
    return {"member_id": member_id, "instance_id": "", "member_epoch": 1, "previous_epoch": -1,
            "session_timeout_ms": 45_000, "subscribed_topics": ["t"], "subscribed_topic_regex": "",
            "assignment": [], "revoking": [], "principal": ""}


def _group(group_id: str, *, active_ms: int, commits_ms: tuple[int, ...] = (), members: int = 0) -> GroupState:
    group = GroupState(group_id)
    group.active_ms = active_ms
    for i, commit_ms in enumerate(commits_ms):
        group.offsets[("t", i)] = (10, "", commit_ms)
    group.load_record({"group_epoch": 1, "members": [_member(f"{group_id}-m{i}") for i in range(members)]}, 0)
    return group


def test_an_empty_group_goes_once_its_retention_has_passed_since_it_was_last_active() -> None:
    groups = {
        "old-commit": _group("old-commit", active_ms=NOW_MS - RETENTION_MS - 1, commits_ms=(NOW_MS - RETENTION_MS - 5,)),
        "recent-commit": _group("recent-commit", active_ms=NOW_MS - RETENTION_MS - 1, commits_ms=(NOW_MS - DAY_MS,)),
        "left-recently": _group("left-recently", active_ms=NOW_MS - DAY_MS, commits_ms=(NOW_MS - 30 * DAY_MS,)),
        "live-and-old": _group("live-and-old", active_ms=0, commits_ms=(NOW_MS - 300 * DAY_MS,), members=1),
        "no-offsets-old": _group("no-offsets-old", active_ms=NOW_MS - EMPTY_GROUP_RETENTION_MS),
        "no-offsets-new": _group("no-offsets-new", active_ms=NOW_MS - EMPTY_GROUP_RETENTION_MS + 1),
    }
    assert sorted(group_retention.expired(groups, NOW_MS, RETENTION_MS)) == ["no-offsets-old", "old-commit"]


def test_a_short_retention_also_shortens_the_wait_of_groups_without_offsets() -> None:
    groups = {"g": _group("g", active_ms=NOW_MS - 2_000)}
    assert group_retention.expired(groups, NOW_MS, 2_000) == ["g"]
    assert group_retention.expired(groups, NOW_MS - 1, 2_000) == []
    assert group_retention.check_interval_ms(2_000) == 1_000
    assert group_retention.check_interval_ms(RETENTION_MS) == group_retention.RETENTION_CHECK_INTERVAL_MS_MAX


def test_churned_group_ids_do_not_accumulate() -> None:
    # The soak's shape: a new group id every second, each joined, committed, left; the
    # coordinator expiring as it goes keeps only the last retention's worth.
    groups: dict[str, GroupState] = {}
    retention_ms = 60_000
    for second in range(600):
        now_ms = NOW_MS + second * 1_000
        groups[f"g{second}"] = _group(f"g{second}", active_ms=now_ms, commits_ms=(now_ms,))
        for group_id in group_retention.expired(groups, now_ms, retention_ms):
            del groups[group_id]
    assert len(groups) == 60


def test_tombstones_delete_every_offset_and_the_group() -> None:
    group = _group("g", active_ms=0, commits_ms=(1, 2))
    records = group_retention.tombstones(group)
    assert records == [(gp.offset_key("g", "t", 0), None), (gp.offset_key("g", "t", 1), None),
                       (gp.group_key("g"), None)]
    groups = {"g": group}
    for key, value in records:
        group_records.apply(groups, key, value, 0)
    assert groups == {}


def test_a_reload_takes_when_the_group_emptied_from_its_record_and_a_restatement_keeps_it() -> None:
    emptied_ms = NOW_MS - 3 * DAY_MS
    loaded: dict[str, GroupState] = {}
    group_records.apply(loaded, gp.offset_key("g", "t", 0), gp.encode_offset_value(5, "", NOW_MS - 4 * DAY_MS), 0,
                        NOW_MS - 4 * DAY_MS)
    group_records.apply(loaded, gp.group_key("g"), gp.encode_group_value(3, []), 0, emptied_ms)
    group_records.apply(loaded, gp.group_key("live"), gp.encode_group_value(1, [_member("m")]), 0, emptied_ms)
    assert loaded["g"].active_ms == emptied_ms
    assert group_retention.last_active_ms(loaded["g"]) == emptied_ms

    writes = group_records.restatement_timed(loaded, NOW_MS)
    times = {key: timestamp_ms for write in writes for key, _, timestamp_ms in write}
    assert times[gp.group_key("g")] == emptied_ms  # not the restatement's time: retention goes on
    assert times[gp.group_key("live")] == NOW_MS
    replayed: dict[str, GroupState] = {}
    for write in writes:
        for key, value, timestamp_ms in write:
            group_records.apply(replayed, key, value, 0, timestamp_ms)
    assert replayed["g"].active_ms == emptied_ms


def test_a_restated_timestamp_stays_within_a_batch_delta() -> None:
    group = _group("ancient", active_ms=0, commits_ms=(1,))
    (write,) = group_records.restatement_timed({"ancient": group}, NOW_MS)
    assert min(t for _, _, t in write) == NOW_MS - group_records.RESTATE_TIMESTAMP_SPREAD_MS
    assert group_records.RESTATE_TIMESTAMP_SPREAD_MS < 2**31
