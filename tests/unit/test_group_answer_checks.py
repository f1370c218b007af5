"""Group answers no coordinator sends, fed to the SDK by a fake node (tests/unit/test_sdk_hostile_answers.py).

* A heartbeat answer naming another member id than the one a member in the group (epoch
  above 0) sent: nodes/group_state.py answers such a heartbeat under the id it names, or
  with an error; only a join (epoch 0) gets a new id. It was taken, and the member's next
  heartbeat and commits went out under the other id.
* A DESCRIBE_GROUPS answer (and the OFFSET_FETCH and LIST_OFFSETS answers describe_group
  reads) with impossible values: they were handed to the user as they came.
"""

from __future__ import annotations

from typing import Any

import pytest

from fabric import errors
from fabric.limits import PARTITIONS_MAX
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from sdk import Admin, Consumer, TopicPartition
from sdk._group import _answer_fault
from tests.unit.test_sdk_hostile_answers import HELD, TOPIC, FakeNode, Reply
from tests.unit.test_sdk_hostile_answers import node as node  # the fixture: a fake node per test


def _answer(member_id: str, epoch: int = 6) -> dict[str, Any]:
    return {"error": 0, "message": "", "member_id": member_id, "member_epoch": epoch, "heartbeat_interval_ms": 0,
            "assignment": HELD}


# -- the heartbeat answer's member id -------------------------------------------------------------
@pytest.mark.parametrize(("sent", "epoch_sent", "answered", "refused"), [
    ("", 0, "m1", False),  # the first join: the coordinator gives the id
    ("m1", 0, "m2", False),  # a rejoin: a static member's every join, or an id the group no longer knows
    ("m1", 0, "m1", False),  # a dynamic member's rejoin after FENCED_MEMBER_EPOCH keeps its id
    ("m1", 5, "m1", False),
    ("m1", 5, "m2", True),  # in the group: no coordinator renames it
    ("m1", 1, "M1", True),
])
def test_the_answers_member_id_must_be_the_one_a_member_in_the_group_sent(
        sent: str, epoch_sent: int, answered: str, refused: bool) -> None:
    fault = _answer_fault(_answer(answered), [TOPIC], "", sent, epoch_sent)
    assert bool(fault) is refused, fault
    if refused:
        assert repr(answered) in fault and repr(sent) in fault


def test_a_static_members_rejoin_takes_its_new_member_id(node: FakeNode) -> None:
    """The legitimate change: a static member that lost its session joins again (epoch 0)
    under its old id, and the coordinator takes the instance over under a new one."""
    sent: list[dict[str, Any]] = []

    def heartbeat(request: apis.Message) -> list[Reply]:
        sent.append(request.body)
        if len(sent) == 2:
            return [node.answer(request, {**_answer("m1", -1), "error": errors.UnknownMemberIdError.code,
                                          "message": "gone", "assignment": []})]
        return [node.answer(request, _answer("m1", 5) if len(sent) == 1 else _answer("m2", 6))]

    node.handlers[ApiKey.CONSUMER_GROUP_HEARTBEAT] = heartbeat
    node.handlers[ApiKey.FETCH] = lambda r: []
    consumer = Consumer(node.address, group_id="g1", group_instance_id="host-a", request_timeout_ms=1000,
                        enable_auto_commit=False)
    try:
        consumer.subscribe([TOPIC])
        consumer.poll(timeout_ms=0)  # UNKNOWN_MEMBER_ID: lost, rejoin at once
        consumer.poll(timeout_ms=0)
        assert [(b["member_id"], b["member_epoch"]) for b in sent[:3]] == [("", 0), ("m1", 5), ("m1", 0)]
        assert consumer._group is not None and consumer._group.member_id == "m2"
        assert consumer.assignment() == [TopicPartition(TOPIC, 0)]
    finally:
        consumer.close()


# -- DESCRIBE_GROUPS ---------------------------------------------------------------------------------
def _member(member_id: str = "5f0c", epoch: int = 4, assignment: list[int] | None = None,
            revoking: list[int] | None = None) -> dict[str, Any]:
    return {"member_id": member_id, "instance_id": "", "member_epoch": epoch, "subscribed_topics": [TOPIC],
            "subscribed_topic_regex": "",
            "assignment": [{"topic": TOPIC, "partitions": assignment if assignment is not None else [0]}],
            "revoking": [{"topic": TOPIC, "partitions": revoking}] if revoking else []}


def _describe_with(node: FakeNode, group_epoch: int, members: list[dict[str, Any]]) -> None:
    node.handlers[ApiKey.DESCRIBE_GROUPS] = lambda r: [node.answer(r, {"groups": [
        {"error": 0, "group_id": "g1", "state": "stable", "group_epoch": group_epoch, "members": members}]})]


def test_a_possible_description_is_handed_over(node: FakeNode) -> None:
    _describe_with(node, 0, [_member("a", 1, [0], [1]), _member("b", 9, [])])  # group_epoch 0: only commits
    with Admin(node.address, request_timeout_ms=2000) as admin:
        described = admin.describe_group("g1")
    assert [(m.member_id, m.member_epoch, m.assignment, m.revoking) for m in described.members] == [
        ("a", 1, (TopicPartition(TOPIC, 0),), (TopicPartition(TOPIC, 1),)), ("b", 9, (), ())]
    assert [(o.partition, o.committed, o.log_end, o.member_id) for o in described.offsets] == [(0, None, 10, "a")]


@pytest.mark.parametrize(("group_epoch", "members", "said"), [
    (-1, [], "group epoch -1"),
    (1, [_member(epoch=0)], "epoch 0"),
    (1, [_member(epoch=-2)], "epoch -2"),
    (1, [_member(member_id="")], "member id ''"),
    (1, [_member(member_id="m" * 201)], "MEMBER_ID_BYTES_MAX"),
    (1, [_member("a", assignment=[0]), _member("a", assignment=[1])], "twice"),
    (1, [_member(assignment=[-1])], "partition -1"),
    (1, [_member(assignment=[PARTITIONS_MAX])], f"partition {PARTITIONS_MAX}"),
    (1, [_member(revoking=[-3])], "partition -3"),
    (1, [_member("a", assignment=[0]), _member("b", assignment=[0])], "held twice"),  # no partition has two
    (1, [_member("a", assignment=[0]), _member("b", assignment=[1], revoking=[0])], "held twice"),
    (1, [_member("a", assignment=[0], revoking=[0])], "held twice"),
])
def test_an_impossible_description_is_refused(node: FakeNode, group_epoch: int, members: list[dict[str, Any]],
                                              said: str) -> None:
    _describe_with(node, group_epoch, members)
    # Each was handed to the user as it came.
    with Admin(node.address, request_timeout_ms=2000) as admin, pytest.raises(errors.UnknownServerError, match=said):
        admin.describe_group("g1")


def test_an_impossible_committed_offset_or_log_end_is_refused(node: FakeNode) -> None:
    _describe_with(node, 1, [_member()])
    fetched = {"offset": -2, "partition": 0}
    node.handlers[ApiKey.OFFSET_FETCH] = lambda r: [node.answer(r, {"error": 0, "message": "", "offsets": [
        {"topic": TOPIC, "metadata": "", "commit_ms": 0, **fetched}]})]
    with Admin(node.address, request_timeout_ms=2000) as admin:
        with pytest.raises(errors.UnknownServerError, match="offset -2"):  # was taken for "none"
            admin.describe_group("g1")
        fetched.update(offset=-1, partition=0)  # the wire's "none"
        assert [(o.committed, o.log_end) for o in admin.describe_group("g1").offsets] == [(None, 10)]
        node.handlers[ApiKey.LIST_OFFSETS] = lambda r: [node.answer(r, {"partitions": [
            {**p, "offset": -7} for p in node.sane(r)["partitions"]]})]
        with pytest.raises(errors.UnknownServerError, match="offset -7"):  # was the log end shown
            admin.describe_group("g1")
