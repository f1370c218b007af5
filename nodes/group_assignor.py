"""The target assignment of a consumer group: a pure function, sticky and balanced.

``assign(subscriptions, partition_counts, current)`` decides which member should own
which partition. It is called on every heartbeat (cheap: a few thousand partitions take
milliseconds), so it must be stable: the same inputs give the same output, and a partition
moves only when balance needs it. The coordinator (``nodes/group_state.py``) then moves
partitions incrementally: a partition goes to its new owner only after the old owner has
reported it revoked.

Rules, in order:

1. A member keeps what it owns now if it still subscribes to the topic and the partition
   exists (a partition claimed twice stays with the member that sorts first).
2. Partitions nobody keeps go one by one (sorted by topic, partition) to the eligible
   member with the fewest partitions (ties: member id order).
3. While some partition could move from a member with ``n`` partitions to an eligible
   member with ``n - 2`` or fewer, move one (the most loaded member gives up its highest
   partition first). With identical subscriptions this ends with counts differing by at
   most one; with different subscriptions it ends when no single move improves balance.
"""

from __future__ import annotations

from collections.abc import Mapping

TopicPartition = tuple[str, int]

REBALANCE_MOVES_MAX = 1_000_000  # a bound on step 3; each move strictly lowers the spread


def assign(
    subscriptions: Mapping[str, set[str]],
    partition_counts: Mapping[str, int],
    current: Mapping[str, set[TopicPartition]],
) -> dict[str, set[TopicPartition]]:
    """``subscriptions``: member id -> topics it reads (already resolved from patterns).
    ``partition_counts``: topic -> partitions (topics absent here do not exist).
    ``current``: member id -> partitions it owns now. Returns member id -> target."""
    members = sorted(subscriptions)
    target: dict[str, set[TopicPartition]] = {m: set() for m in members}
    taken: set[TopicPartition] = set()
    for m in members:
        for tp in sorted(current.get(m, ())):
            topic, partition = tp
            if topic in subscriptions[m] and 0 <= partition < partition_counts.get(topic, 0) and tp not in taken:
                target[m].add(tp)
                taken.add(tp)
    eligible: dict[str, list[str]] = {}
    for m in members:
        for topic in subscriptions[m]:
            if topic in partition_counts:
                eligible.setdefault(topic, []).append(m)
    for topic in sorted(eligible):
        readers = eligible[topic]
        for partition in range(partition_counts[topic]):
            tp = (topic, partition)
            if tp not in taken:
                owner = min(readers, key=lambda m: (len(target[m]), m))
                target[owner].add(tp)
                taken.add(tp)
    _balance(target, eligible)
    return target


def _balance(target: dict[str, set[TopicPartition]], eligible: dict[str, list[str]]) -> None:
    for _ in range(REBALANCE_MOVES_MAX):
        move = _best_move(target, eligible)
        if move is None:
            return
        tp, giver, taker = move
        target[giver].discard(tp)
        target[taker].add(tp)
    raise RuntimeError("assignor did not converge within REBALANCE_MOVES_MAX moves")


def _best_move(
    target: dict[str, set[TopicPartition]], eligible: dict[str, list[str]]
) -> tuple[TopicPartition, str, str] | None:
    """One move that narrows the spread: from the most loaded member that has a partition
    some much less loaded member could read. None when no such move exists."""
    for giver in sorted(target, key=lambda m: (-len(target[m]), m)):
        load = len(target[giver])
        for tp in sorted(target[giver], reverse=True):
            candidates = [m for m in eligible.get(tp[0], ()) if len(target[m]) <= load - 2]
            if candidates:
                taker = min(candidates, key=lambda m: (len(target[m]), m))
                return tp, giver, taker
    return None
