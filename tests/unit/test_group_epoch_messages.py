"""FENCED_MEMBER_EPOCH's answer, as docs/GROUPS.md and docs/PROTOCOL.md (section 7)
describe it: "stale" only for an epoch below the member's, "unknown" for one above it
(the message said "stale" for both: "member epoch 7 is stale (current 2)")."""

from __future__ import annotations

import itertools
from typing import Any

from fabric import errors
from fabric.protocol import groups as gp
from nodes.group_state import HEARTBEAT_INTERVAL_MS_DEFAULT, GroupState

TOPICS = {"t": 4}


def _heartbeat(group: GroupState, member_id: str, epoch: int, owned: set[tuple[str, int]]) -> dict[str, Any]:
    request = {"group_id": "g", "member_id": member_id, "member_epoch": epoch, "instance_id": "",
               "session_timeout_ms": 45_000, "subscribed_topics": ["t"], "subscribed_topic_regex": "",
               "owned": gp.tp_list(owned)}
    return group.heartbeat(request, 0, TOPICS).response


def _settled_pair() -> tuple[GroupState, str, int, set[tuple[str, int]]]:
    """Two members that have split the topic; returns the group and the first one's state."""
    ids = itertools.count(1)
    group = GroupState("g", new_member_id=lambda: f"m{next(ids)}")
    state: dict[str, tuple[int, set[tuple[str, int]]]] = {}
    for _ in range(2):
        answer = _heartbeat(group, "", 0, set())
        state[answer["member_id"]] = (answer["member_epoch"], gp.tp_set(answer["assignment"]))
    for _ in range(4):
        for member_id, (epoch, owned) in list(state.items()):
            answer = _heartbeat(group, member_id, epoch, owned)
            state[member_id] = (answer["member_epoch"], gp.tp_set(answer["assignment"]))
    epoch, owned = state["m1"]
    assert len(owned) == 2 and epoch >= 3, state
    return group, "m1", epoch, owned


def test_an_epoch_above_the_members_is_unknown_not_stale() -> None:
    group, member_id, epoch, owned = _settled_pair()
    before = group.describe()
    answer = _heartbeat(group, member_id, epoch + 5, owned)
    assert answer["error"] == errors.FencedMemberEpochError.code
    assert answer["message"] == (f"member epoch {epoch + 5} is unknown: ahead of the current epoch {epoch}; "
                                 "rejoin with member epoch 0 and this member id")
    # The error answer's other fields (documented: a client must not take them).
    assert (answer["member_id"], answer["member_epoch"], answer["heartbeat_interval_ms"], answer["assignment"]) == (
        member_id, -1, HEARTBEAT_INTERVAL_MS_DEFAULT, [])
    assert group.describe() == before  # refused: the member keeps its partitions and epoch


def test_an_epoch_below_the_members_is_stale() -> None:
    group, member_id, epoch, owned = _settled_pair()
    answer = _heartbeat(group, member_id, epoch - 2, owned)
    assert answer["error"] == errors.FencedMemberEpochError.code
    assert answer["message"] == (f"member epoch {epoch - 2} is stale (current {epoch}); "
                                 "rejoin with member epoch 0 and this member id")
    # The previous epoch is taken only while owned lists nothing the member was not given.
    extra = {("t", p) for p in range(4)} - owned
    answer = _heartbeat(group, member_id, epoch - 1, owned | extra)
    assert answer["error"] == errors.FencedMemberEpochError.code
    assert answer["message"].startswith(f"member epoch {epoch - 1} is stale (current {epoch}); the previous epoch")
    assert _heartbeat(group, member_id, epoch - 1, owned)["error"] == 0
