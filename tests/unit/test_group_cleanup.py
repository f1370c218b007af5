"""Offsets of deleted topics (nodes/group_cleanup.py): a topic seen to leave the routing map
takes its committed offsets with it, a topic merely not in the map yet never does, and a
topic made again keeps only the offsets committed since (what fetch_offsets shows)."""

from __future__ import annotations

from nodes import group_cleanup
from nodes.group_cleanup import TopicsSeen, stale_offsets
from nodes.group_state import GroupState

CREATED_MS = 1_800_000_000_000


def _group(offsets: dict[tuple[str, int], int]) -> dict[str, GroupState]:
    group = GroupState("g")
    group.offsets = {tp: (5, "", commit_ms) for tp, commit_ms in offsets.items()}
    return {"g": group}


def test_only_a_topic_seen_to_go_is_deleted() -> None:
    seen = TopicsSeen()
    seen.observe(1, lambda: {"kept": CREATED_MS})  # the first map: nothing inferred from it
    groups = _group({("kept", 0): CREATED_MS + 1, ("never-seen", 0): CREATED_MS + 1, ("gone", 0): CREATED_MS + 1})
    assert seen.deleted == {}
    assert stale_offsets(groups, seen.incarnations or {}, seen.deleted) == []
    seen.observe(2, lambda: {"kept": CREATED_MS, "gone": CREATED_MS})
    seen.observe(3, lambda: {"kept": CREATED_MS})
    assert list(seen.deleted) == ["gone"]
    assert stale_offsets(groups, seen.incarnations or {}, seen.deleted) == [("g", ("gone", 0))]


def test_a_topic_made_again_keeps_only_the_new_incarnations_offsets() -> None:
    seen = TopicsSeen()
    seen.observe(1, lambda: {"t": CREATED_MS})
    seen.observe(2, lambda: {})
    seen.observe(3, lambda: {"t": CREATED_MS + 1_000})
    assert seen.deleted == {}  # its created_ms now tells old offsets from new
    groups = _group({("t", 0): CREATED_MS + 999, ("t", 1): CREATED_MS + 1_000})
    assert stale_offsets(groups, seen.incarnations or {}, seen.deleted) == [("g", ("t", 0))]
    assert [o["partition"] for o in groups["g"].fetch_offsets([], created_ms=seen.incarnations)] == [1]


def test_an_unchanged_map_is_not_read_again_and_a_write_is_bounded() -> None:
    seen = TopicsSeen()
    seen.observe(1, lambda: {"t": CREATED_MS})
    epoch = seen.epoch
    seen.observe(1, lambda: {})  # same generation: not read
    seen.observe(2, lambda: {"t": CREATED_MS})  # read, same topics: nothing to look at again
    assert seen.epoch == epoch and seen.deleted == {}
    seen.observe(3, lambda: {})
    many = _group({("t", p): CREATED_MS for p in range(group_cleanup.OFFSETS_DELETED_PER_WRITE_MAX + 5)})
    assert len(stale_offsets(many, seen.incarnations or {}, seen.deleted)) == group_cleanup.OFFSETS_DELETED_PER_WRITE_MAX


def test_a_topic_committed_on_between_two_looks_is_seen_to_go() -> None:
    """Created, committed on and deleted between two looks at the map (0.1 s apart, more on
    a busy node): the commit was checked against the map, so the topic counts as seen.
    Its offsets stayed for good before (a CI run listed them after 10 s)."""
    seen = TopicsSeen()
    seen.observe(1, lambda: {"kept": CREATED_MS})
    seen.saw("kept")
    seen.saw("brief")
    seen.observe(2, lambda: {"kept": CREATED_MS})  # the map has changed twice since: made, then gone
    assert list(seen.deleted) == ["brief"]
    groups = _group({("kept", 0): CREATED_MS + 1, ("brief", 0): CREATED_MS + 1})
    assert stale_offsets(groups, seen.incarnations or {}, seen.deleted) == [("g", ("brief", 0))]


def test_a_topic_committed_on_before_the_first_look_is_seen_to_go_too() -> None:
    seen = TopicsSeen()
    seen.saw("brief")
    seen.saw("lasting")
    seen.observe(1, lambda: {"lasting": CREATED_MS})
    assert list(seen.deleted) == ["brief"]
    seen.observe(2, lambda: {"lasting": CREATED_MS})  # nothing seen since: nothing more inferred
    assert list(seen.deleted) == ["brief"]
