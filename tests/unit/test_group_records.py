"""Replaying ``__consumer_offsets`` records, and the restatement that compacts them
(nodes/group_records.py): replaying a restatement gives the same groups back."""

from __future__ import annotations

import random

from fabric.protocol import groups as gp
from nodes import group_records
from nodes.group_records import RESTATE_BATCH_BYTES_MAX, Record
from nodes.group_state import GroupState


def _replay(records: list[Record], now_ms: int = 0) -> dict[str, GroupState]:
    groups: dict[str, GroupState] = {}
    for key, value in records:
        group_records.apply(groups, key, value, now_ms)
    return groups


def _view(groups: dict[str, GroupState]) -> dict[str, tuple[int, list[str], dict[tuple[str, int], tuple[int, str, int]]]]:
    return {g.group_id: (g.group_epoch, sorted(g.members), dict(g.offsets)) for g in groups.values()}


def _history(seed: int, commits: int) -> list[Record]:
    """Commits, group records and deletions of a few groups, as a coordinator writes them."""
    rng = random.Random(seed)
    records: list[Record] = []
    live: dict[str, GroupState] = {}  # what the records so far say: a deletion names every offset

    def write(key: bytes, value: bytes | None) -> None:
        records.append((key, value))
        group_records.apply(live, key, value, 0)

    for i in range(commits):
        group = f"g{rng.randrange(6)}"
        action = rng.random()
        if action < 0.8:
            tp = (f"t{rng.randrange(3)}", rng.randrange(20))
            write(gp.offset_key(group, *tp), gp.encode_offset_value(i, f"m{i}", 1_000 + i))
        elif action < 0.9:
            member = {"member_id": f"{group}-m{i}", "instance_id": "", "member_epoch": i, "previous_epoch": -1,
                      "session_timeout_ms": 45_000, "subscribed_topics": ["t0"], "subscribed_topic_regex": "",
                      "assignment": [], "revoking": [], "principal": ""}
            write(gp.group_key(group), gp.encode_group_value(i, [member]))
        else:  # DELETE_GROUPS: every offset, then the group
            state = live.get(group)
            for tp in list(state.offsets if state else ()):
                write(gp.offset_key(group, *tp), None)
            write(gp.group_key(group), None)
    return records


def test_replaying_the_restatement_gives_the_same_groups() -> None:
    for seed in range(20):
        history = _history(seed, 3_000)
        groups = _replay(history)
        writes = group_records.restatement(groups)
        restated = [record for write in writes for record in write]
        assert len(restated) == group_records.live_count(groups)
        assert _view(_replay(restated)) == _view(groups)
        # What a new coordinator reads after the compaction: the restatement, then later writes.
        later = _history(seed + 100, 500)
        assert _view(_replay(restated + later)) == _view(_replay(history + later))


def test_a_deleted_group_is_not_restated() -> None:
    records: list[Record] = [(gp.offset_key("gone", "t", 0), gp.encode_offset_value(3, "", 1)),
                             (gp.offset_key("kept", "t", 0), gp.encode_offset_value(4, "", 1)),
                             (gp.offset_key("gone", "t", 0), None), (gp.group_key("gone"), None)]
    groups = _replay(records)
    assert set(groups) == {"kept"}
    assert {key for write in group_records.restatement(groups) for key, _ in write} == {
        gp.group_key("kept"), gp.offset_key("kept", "t", 0)}
    assert group_records.restatement({}) == []


def test_restatement_writes_are_bounded_in_bytes_and_keep_every_record() -> None:
    group = GroupState("big")
    for p in range(20_000):
        group.offsets[("a-topic-with-a-long-name", p)] = (p, "metadata" * 4, 1_000)
    writes = group_records.restatement({"big": group})
    assert len(writes) > 1
    assert all(sum(len(k) + len(v or b"") for k, v in write) <= RESTATE_BATCH_BYTES_MAX for write in writes)
    assert sum(len(write) for write in writes) == 20_001
    assert _view(_replay([r for write in writes for r in write])) == _view({"big": group})
