"""The group assignor: a pure function of subscriptions, partition counts and current owners."""

from __future__ import annotations

import random

from nodes.group_assignor import assign


def _counts(target: dict[str, set[tuple[str, int]]]) -> list[int]:
    return sorted(len(v) for v in target.values())


def _check_partition_owned_once(target: dict[str, set[tuple[str, int]]], expected: set[tuple[str, int]]) -> None:
    seen: list[tuple[str, int]] = [tp for tps in target.values() for tp in tps]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    assert set(seen) == expected


def test_single_member_gets_everything() -> None:
    target = assign({"a": {"t"}}, {"t": 4}, {})
    assert target == {"a": {("t", 0), ("t", 1), ("t", 2), ("t", 3)}}


def test_balanced_and_complete() -> None:
    subs = {m: {"t", "u"} for m in "abc"}
    target = assign(subs, {"t": 6, "u": 5}, {})
    _check_partition_owned_once(target, {("t", p) for p in range(6)} | {("u", p) for p in range(5)})
    assert _counts(target) == [3, 4, 4]


def test_sticky_join_moves_only_what_balance_needs() -> None:
    before = assign({"a": {"t"}, "b": {"t"}}, {"t": 6}, {})
    after = assign({"a": {"t"}, "b": {"t"}, "c": {"t"}}, {"t": 6}, before)
    assert _counts(after) == [2, 2, 2]
    # Each old member keeps two of its three partitions: exactly two partitions move.
    assert after["a"] <= before["a"] and after["b"] <= before["b"]
    assert len(after["c"]) == 2


def test_sticky_leave_keeps_survivors() -> None:
    before = assign({m: {"t"} for m in "abc"}, {"t": 6}, {})
    after = assign({"a": {"t"}, "b": {"t"}}, {"t": 6}, before)
    assert before["a"] <= after["a"] and before["b"] <= after["b"]
    assert _counts(after) == [3, 3]


def test_stable_when_nothing_changes() -> None:
    subs = {m: {"t"} for m in "abcd"}
    first = assign(subs, {"t": 10}, {})
    assert assign(subs, {"t": 10}, first) == first


def test_unsubscribed_and_vanished_partitions_are_dropped() -> None:
    current = {"a": {("t", 0), ("gone", 0), ("t", 9)}, "b": {("u", 0)}}
    target = assign({"a": {"t"}, "b": {"t"}}, {"t": 2, "u": 1}, current)
    _check_partition_owned_once(target, {("t", 0), ("t", 1)})
    assert ("t", 0) in target["a"]


def test_partition_claimed_twice_goes_to_one_member() -> None:
    target = assign({"a": {"t"}, "b": {"t"}}, {"t": 2}, {"a": {("t", 0)}, "b": {("t", 0)}})
    _check_partition_owned_once(target, {("t", 0), ("t", 1)})


def test_different_subscriptions() -> None:
    subs = {"a": {"t"}, "b": {"t", "u"}, "c": {"u"}}
    target = assign(subs, {"t": 4, "u": 4}, {})
    _check_partition_owned_once(target, {("t", p) for p in range(4)} | {("u", p) for p in range(4)})
    assert all(tp[0] in subs[m] for m, tps in target.items() for tp in tps)
    assert max(_counts(target)) - min(_counts(target)) <= 1


def test_new_partitions_are_spread() -> None:
    subs = {"a": {"t"}, "b": {"t"}}
    before = assign(subs, {"t": 2}, {})
    after = assign(subs, {"t": 6}, before)
    assert before["a"] <= after["a"] and before["b"] <= after["b"]
    assert _counts(after) == [3, 3]


def test_random_histories_stay_valid_and_balanced() -> None:
    rng = random.Random(13)
    current: dict[str, set[tuple[str, int]]] = {}
    members: set[str] = set()
    for _step in range(200):
        if members and rng.random() < 0.4:
            members.discard(rng.choice(sorted(members)))
        else:
            members.add(f"m{rng.randrange(12)}")
        partitions = rng.randrange(1, 20)
        subs = {m: {"t"} for m in members}
        target = assign(subs, {"t": partitions}, current)
        _check_partition_owned_once(target, {("t", p) for p in range(partitions)} if members else set())
        if members:
            assert max(_counts(target)) - min(_counts(target)) <= 1
        # Sticky: a surviving member loses a partition only if it had more than its share.
        share = -(-partitions // max(1, len(members)))
        for m in members:
            kept = {tp for tp in current.get(m, set()) if tp[1] < partitions}
            if len(kept) <= share - 1:
                assert kept <= target[m]
        current = target
