"""The coordinator's member state machine, fed heartbeats with an injected clock; no sockets."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from fabric import errors
from fabric.protocol import groups as gp
from nodes.group_state import (
    HEARTBEAT_INTERVAL_MS_DEFAULT,
    HEARTBEAT_INTERVAL_MS_RECONCILING,
    GroupState,
    Member,
)

TOPICS = {"t": 6}


def _group() -> GroupState:
    ids = itertools.count(1)
    return GroupState("g", new_member_id=lambda: f"m{next(ids)}")


def _hb(group: GroupState, member_id: str, epoch: int, owned: set[tuple[str, int]], now_ms: int = 0, *,
        instance_id: str = "", topics: dict[str, int] | None = None, subscribed: list[str] | None = None,
        regex: str = "") -> dict[str, Any]:
    request = {"group_id": "g", "member_id": member_id, "member_epoch": epoch, "instance_id": instance_id,
               "session_timeout_ms": 45_000, "subscribed_topics": subscribed if subscribed is not None else ["t"],
               "subscribed_topic_regex": regex, "owned": gp.tp_list(owned)}
    return group.heartbeat(request, now_ms, topics or TOPICS).response


class SimMember:
    """A well-behaved member: holds what it was given, revokes at once, reports what it holds."""

    def __init__(self, group: GroupState, instance_id: str = "") -> None:
        self.group = group
        self.instance_id = instance_id
        response = _hb(group, "", 0, set(), instance_id=instance_id)
        assert response["error"] == 0, response
        self.member_id = response["member_id"]
        self.epoch = response["member_epoch"]
        self.owned = gp.tp_set(response["assignment"])
        self.interval_ms = response["heartbeat_interval_ms"]

    def beat(self, now_ms: int = 0) -> dict[str, Any]:
        response = _hb(self.group, self.member_id, self.epoch, self.owned, now_ms, instance_id=self.instance_id)
        if response["error"] == 0:
            self.epoch = response["member_epoch"]
            self.owned = gp.tp_set(response["assignment"])
            self.interval_ms = response["heartbeat_interval_ms"]
        return response


def _never_shared(members: list[SimMember]) -> None:
    held = [tp for m in members for tp in m.owned]
    assert len(held) == len(set(held)), f"a partition held by two members: {sorted(held)}"


def _settle(members: list[SimMember], rounds: int = 10) -> None:
    for _ in range(rounds):
        for m in members:
            m.beat()
            _never_shared(members)


def test_first_member_gets_all_partitions() -> None:
    group = _group()
    a = SimMember(group)
    assert a.owned == {("t", p) for p in range(6)}
    assert a.epoch >= 1 and a.interval_ms == HEARTBEAT_INTERVAL_MS_DEFAULT
    assert group.state() == "stable"


def test_join_revokes_before_assigning() -> None:
    group = _group()
    a = SimMember(group)
    b = SimMember(group)
    # b joins while a holds everything: b gets nothing yet and is told to come back soon.
    assert b.owned == set() and b.interval_ms == HEARTBEAT_INTERVAL_MS_RECONCILING
    b.beat()
    assert b.owned == set()
    # a is told to give up three partitions; until it confirms, b still gets none.
    a_before = set(a.owned)
    response = _hb(group, a.member_id, a.epoch, a.owned)
    revoked = a_before - gp.tp_set(response["assignment"])
    assert len(revoked) == 3 and group.members[a.member_id].revoking == revoked
    a.epoch, a.owned = response["member_epoch"], gp.tp_set(response["assignment"])
    # a's other partitions never stopped: it keeps three throughout.
    assert len(a.owned) == 3 and a.owned <= a_before
    b.beat()
    assert b.owned == set(), "b got a partition a has not confirmed revoking"
    a.beat()  # confirms: it no longer reports the revoked partitions
    b.beat()
    assert b.owned == revoked
    _never_shared([a, b])
    assert group.state() == "stable"


def test_leave_frees_partitions_for_the_rest() -> None:
    group = _group()
    members = [SimMember(group) for _ in range(3)]
    _settle(members)
    assert sorted(len(m.owned) for m in members) == [2, 2, 2]
    gone = members.pop()
    assert group.state() == "stable"
    response = _hb(group, gone.member_id, gp.LEAVE_EPOCH, gone.owned)
    assert response["error"] == 0
    # Its partitions belong to nobody until the others' next heartbeat: not "stable" (was).
    assert group.state() == "reconciling"
    _settle(members)
    assert sorted(len(m.owned) for m in members) == [3, 3]
    assert group.state() == "stable"


def test_session_expiry_removes_member() -> None:
    group = _group()
    a = SimMember(group)
    b = SimMember(group)
    _settle([a, b])
    a.beat(now_ms=40_000)
    assert group.expire(now_ms=46_000) == [b.member_id]
    a.beat(now_ms=46_000)
    assert len(a.owned) == 6
    response = b.beat(now_ms=47_000)
    assert response["error"] == errors.UnknownMemberIdError.code


def test_stale_epoch_is_fenced_but_previous_epoch_tolerated() -> None:
    group = _group()
    a = SimMember(group)
    b = SimMember(group)
    _settle([a, b])
    # A response lost in transit: resending with the previous epoch is accepted while
    # the member reports nothing beyond what it holds.
    member = group.members[a.member_id]
    assert _hb(group, a.member_id, member.previous_epoch, a.owned)["error"] == 0
    assert _hb(group, a.member_id, a.epoch + 7, a.owned)["error"] == errors.FencedMemberEpochError.code


def test_static_member_restart_keeps_partitions() -> None:
    group = _group()
    a = SimMember(group, instance_id="host-a")
    b = SimMember(group, instance_id="host-b")
    _settle([a, b])
    a_partitions = set(a.owned)
    assert _hb(group, a.member_id, gp.STATIC_LEAVE_EPOCH, a.owned, instance_id="host-a")["error"] == 0
    # While a is away, b does not take its partitions.
    b.beat(now_ms=1_000)
    assert not (b.owned & a_partitions)
    a2 = SimMember(group, instance_id="host-a")
    assert a2.owned == a_partitions and a2.member_id != a.member_id
    # The old identity is fenced.
    assert _hb(group, a.member_id, a.epoch, set())["error"] == errors.UnknownMemberIdError.code


def test_static_member_that_does_not_return_expires() -> None:
    group = _group()
    a = SimMember(group, instance_id="host-a")
    b = SimMember(group)
    _settle([a, b])
    _hb(group, a.member_id, gp.STATIC_LEAVE_EPOCH, a.owned, instance_id="host-a")
    b.beat(now_ms=30_000)
    assert group.expire(now_ms=46_000) == [a.member_id]
    b.beat(now_ms=46_000)
    assert len(b.owned) == 6


def test_a_replaced_static_member_is_fenced_and_cannot_take_its_instance_back() -> None:
    """Two live processes with one instance id: the second's join (no member id) replaced the
    first, whose next heartbeat got UNKNOWN_MEMBER_ID; its SDK rejoined under its old member
    id with the same instance id, which replaced the second, and so on for ever. Now every
    request of the replaced member gets FENCED_INSTANCE_ID and changes nothing; only a new
    process (a join with no member id) takes the instance over."""
    group = _group()
    first = SimMember(group, instance_id="host-a")
    other = SimMember(group, instance_id="host-b")
    _settle([first, other])
    second = SimMember(group, instance_id="host-a")  # a second process, same instance id
    assert second.owned == first.owned and second.member_id != first.member_id
    fenced = errors.FencedInstanceIdError.code
    epoch_before = group.group_epoch
    # Its heartbeat, its rejoin under its old id, its leaves and its commits: all refused.
    for epoch in (first.epoch, 0, gp.STATIC_LEAVE_EPOCH, gp.LEAVE_EPOCH):
        result = group.heartbeat({"group_id": "g", "member_id": first.member_id, "member_epoch": epoch,
                                  "instance_id": "host-a", "session_timeout_ms": 45_000, "subscribed_topics": ["t"],
                                  "subscribed_topic_regex": "", "owned": gp.tp_list(first.owned)}, 0, TOPICS)
        assert result.response["error"] == fenced and not result.changed, (epoch, result.response)
        assert "host-a" in result.response["message"] and second.member_id in result.response["message"]
    assert group.check_commit(first.member_id, first.epoch, sorted(first.owned)) == [fenced] * len(first.owned)
    # The second one still holds the instance, undisturbed (not left, same epoch).
    member = group.members[second.member_id]
    assert member.instance_id == "host-a" and not member.left_static and member.member_epoch == second.epoch
    assert group.group_epoch == epoch_before and set(group.members) == {second.member_id, other.member_id}
    assert second.beat()["error"] == 0 and other.beat()["error"] == 0
    assert group.check_commit(second.member_id, second.epoch, sorted(second.owned)) == [0] * len(second.owned)
    # A new process always wins: a third one (no member id) replaces the second, fenced in turn.
    third = SimMember(group, instance_id="host-a")
    assert third.owned == second.owned
    assert second.beat()["error"] == fenced
    assert group.check_commit(second.member_id, second.epoch, sorted(second.owned)) == [fenced] * len(second.owned)
    _settle([third, other])
    # Without an instance id a request says nothing about one: an unknown member, as before.
    assert _hb(group, first.member_id, first.epoch, set())["error"] == errors.UnknownMemberIdError.code
    # Once the instance has no member (the third's session ended), nobody is fenced by it.
    assert group.expire(now_ms=10**9) and group.is_empty()
    assert group.check_commit(first.member_id, 1, [("t", 0)]) == [errors.UnknownMemberIdError.code]


def test_a_fenced_member_rejoining_under_its_id_frees_its_partitions_at_once() -> None:
    """FENCED_MEMBER_EPOCH says the member lost its partitions and must rejoin; rejoining
    with epoch 0 made a second member, and the old one kept its partitions until its
    session ended (45 s by default), so nobody read them. Rejoining under the same id
    now replaces it: its partitions go to whoever the assignor gives them, at once."""
    group = _group()
    a, b = SimMember(group), SimMember(group)
    _settle([a, b])
    held_by_a = set(a.owned)
    assert held_by_a and b.owned
    fenced = _hb(group, a.member_id, a.epoch + 5, a.owned)  # a stale/confused epoch
    assert fenced["error"] == errors.FencedMemberEpochError.code
    rejoined = _hb(group, a.member_id, 0, set())  # its client dropped everything, rejoins
    assert rejoined["error"] == 0 and rejoined["member_id"] == a.member_id
    assert rejoined["member_epoch"] > a.epoch  # what it sends from before stays fenced
    assert len(group.members) == 2
    a.epoch, a.owned = rejoined["member_epoch"], gp.tp_set(rejoined["assignment"])
    _settle([a, b])
    assert a.owned | b.owned == set().union(held_by_a, b.owned) and not a.owned & b.owned


def test_pattern_picks_up_new_topic() -> None:
    group = _group()
    response = _hb(group, "", 0, set(), subscribed=[], regex=r"orders\..*", topics={"orders.eu": 2, "other": 3})
    member_id, epoch = response["member_id"], response["member_epoch"]
    assert gp.tp_set(response["assignment"]) == {("orders.eu", 0), ("orders.eu", 1)}
    response = _hb(group, member_id, epoch, gp.tp_set(response["assignment"]), subscribed=[], regex=r"orders\..*",
                   topics={"orders.eu": 2, "orders.us": 1, "other": 3, "__consumer_offsets": 8})
    assert gp.tp_set(response["assignment"]) == {("orders.eu", 0), ("orders.eu", 1), ("orders.us", 0)}


def test_pattern_matches_only_topics_the_principal_may_describe() -> None:
    """Secure cluster: a member's pattern resolves to the topics its principal may
    describe; a member with wider rights still gets the rest, and the principal is kept in
    the group record (a new coordinator filters from its first heartbeat)."""
    group = _group()
    rights = {"alice": {"orders.eu"}, "bob": {"orders.eu", "orders.us"}}

    def may_describe(principal: str, topic: str) -> bool:
        return topic in rights.get(principal, set())

    topics = {"orders.eu": 1, "orders.us": 1}
    request = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": "", "session_timeout_ms": 45_000,
               "subscribed_topics": [], "subscribed_topic_regex": r"orders\..*", "owned": []}
    alice = group.heartbeat(request, 0, topics, principal="alice", may_describe=may_describe).response
    assert gp.tp_set(alice["assignment"]) == {("orders.eu", 0)}
    bob = group.heartbeat(request, 0, topics, principal="bob", may_describe=may_describe).response
    assert ("orders.us", 0) in gp.tp_set(bob["assignment"])
    for member in (alice, bob):  # however often they heartbeat, alice never gets orders.us
        for _ in range(3):
            again = dict(request, member_id=member["member_id"], member_epoch=member["member_epoch"],
                         owned=member["assignment"])
            principal = "alice" if member is alice else "bob"
            member.update(group.heartbeat(again, 0, topics, principal=principal, may_describe=may_describe).response)
    assert ("orders.us", 0) not in gp.tp_set(alice["assignment"])
    assert ("orders.us", 0) in gp.tp_set(bob["assignment"])
    decoded = gp.decode_record(gp.group_key("g"), group.to_record())
    assert decoded is not None
    assert {m["principal"] for m in decoded[1][1]["members"]} == {"alice", "bob"}


def test_group_record_v0_still_loads() -> None:
    """Records written before the principal was kept (version 0) load with principal ""."""
    from fabric.protocol import schema
    member = {"member_id": "m1", "instance_id": "", "member_epoch": 3, "previous_epoch": 2,
              "session_timeout_ms": 45_000, "subscribed_topics": ["t"], "subscribed_topic_regex": "",
              "assignment": [{"topic": "t", "partitions": [0]}], "revoking": []}
    raw = schema.encode(gp.GROUP_VALUE_V0, {"version": 0, "group_epoch": 4, "members": [member]})
    decoded = gp.decode_record(gp.group_key("g"), raw)
    assert decoded is not None
    loaded = GroupState("g")
    loaded.load_record(decoded[1][1], now_ms=0)
    assert loaded.members["m1"].principal == "" and loaded.members["m1"].assignment == {("t", 0)}
    with pytest.raises(errors.CorruptMessageError):
        gp.decode_record(gp.group_key("g"), bytes([9]) + raw[1:])


def test_bad_requests_change_nothing() -> None:
    group = _group()
    bad = {"group_id": "g", "member_id": "", "member_epoch": 0, "instance_id": "", "session_timeout_ms": 10,
           "subscribed_topics": ["t"], "subscribed_topic_regex": "", "owned": []}
    assert group.heartbeat(bad, 0, TOPICS).response["error"] == errors.InvalidRequestError.code
    bad.update(session_timeout_ms=45_000, subscribed_topic_regex="(")
    assert group.heartbeat(bad, 0, TOPICS).response["error"] == errors.InvalidRequestError.code
    bad.update(subscribed_topic_regex="", subscribed_topics=[])
    assert group.heartbeat(bad, 0, TOPICS).response["error"] == errors.InvalidRequestError.code
    assert group.is_empty() and group.group_epoch == 0


def test_commit_checks() -> None:
    group = _group()
    assert group.check_commit("", -1, [("t", 0)]) == [0]
    a = SimMember(group)
    b = SimMember(group)
    _settle([a, b])
    assert group.check_commit("", -1, [("t", 0)]) == [errors.GroupNotEmptyError.code]
    mine = sorted(a.owned)[0]
    theirs = sorted(b.owned)[0]
    assert group.check_commit(a.member_id, a.epoch, [mine, theirs]) == [0, errors.FencedMemberEpochError.code]
    assert group.check_commit("nobody", 1, [mine]) == [errors.UnknownMemberIdError.code]


def test_record_round_trip() -> None:
    group = _group()
    members = [SimMember(group, instance_id=f"i{i}") for i in range(2)]
    _settle(members)
    decoded = gp.decode_record(gp.group_key("g"), group.to_record())
    assert decoded is not None and decoded[0] == "group"
    loaded = GroupState("g")
    loaded.load_record(decoded[1][1], now_ms=5)
    assert {m: (v.assignment, v.member_epoch, v.previous_epoch) for m, v in loaded.members.items()} == {
        m: (v.assignment, v.member_epoch, v.previous_epoch) for m, v in group.members.items()}
    assert all(isinstance(m, Member) and m.deadline_ms == 5 + 45_000 for m in loaded.members.values())


def test_random_membership_never_shares_a_partition() -> None:
    rng = random.Random(7)
    group = _group()
    members: list[SimMember] = []
    for _step in range(300):
        roll = rng.random()
        if roll < 0.15 or not members:
            members.append(SimMember(group))
        elif roll < 0.25 and members:
            m = members.pop(rng.randrange(len(members)))
            _hb(group, m.member_id, gp.LEAVE_EPOCH, m.owned)
        else:
            rng.choice(members).beat()
        _never_shared(members)
    _settle(members, rounds=20)
    held = {tp for m in members for tp in m.owned}
    assert held == {("t", p) for p in range(6)}
    counts = sorted(len(m.owned) for m in members)
    assert counts[-1] - counts[0] <= 1


def test_patterns_are_re2_linear_time() -> None:
    # A pattern that makes a backtracking engine take exponential time is harmless here.
    group = _group()
    topics = {("a" * 40) + "!": 1, "orders.eu": 1}
    response = _hb(group, "", 0, set(), subscribed=[], regex=r"(a+)+$", topics=topics)
    assert response["error"] == 0 and response["assignment"] == []
    # Backreferences are not RE2: refused as a bad request, nothing changes.
    response = _hb(group, "", 0, set(), subscribed=[], regex=r"(a)\1", topics=topics)
    assert response["error"] == errors.InvalidRequestError.code
