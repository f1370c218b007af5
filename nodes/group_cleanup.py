"""Committed offsets of deleted topics: which ones a coordinator deletes, and when (Kafka's
``GroupMetadataManager.cleanupGroupMetadata`` for deleted partitions).

Pure: the coordinator (``nodes/group_coordinator.py``) passes in its routing map, decides
when that map is current, and writes the tombstones this returns.

Without it a deleted topic's offsets stayed in their group for as long as the group lived:
``fabric group describe`` and ``fabric status`` listed its partitions with an unknown lag,
and ``__consumer_offsets`` kept (and restated at every compaction) their records.

Deleting a live topic's offsets loses the group's place, so only a deletion the node saw
is acted on: a topic that was in a routing map it trusted and is missing from a later one
(``TopicsSeen``). A map loses a topic only when ZooKeeper's own listing (a watch or a full
re-read) no longer holds it; one not loaded yet, or cut off from ZooKeeper, never does, and
a topic merely *absent* from the map (not seen yet) is never taken for a deleted one.
A topic the coordinator took a commit on counts as seen (``TopicsSeen.saw``): the commit
was checked against the map, so ZooKeeper listed it. Without that, a topic created,
committed on and deleted between two looks (0.1 s apart, longer on a busy node) was never
in a map the coordinator looked at, and its offsets stayed for good.

A topic deleted and created again under the same name: the old incarnation's offsets are
those committed before the topic's ``created_ms`` (``GroupState.fetch_offsets`` already
hides them; a commit is never stamped before its topic's creation), and they go too. That
is the comparison fetch_offsets makes, nothing more: no offset it shows is ever deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from nodes.group_assignor import TopicPartition
from nodes.group_state import GroupState

# Tombstones of one write per partition (the rest go at the next look, 0.1 s later): about
# 100 bytes each, the bound group_retention puts on its writes.
OFFSETS_DELETED_PER_WRITE_MAX: Final[int] = 1_000
# Deleted topic names remembered for partitions this node comes to coordinate later (a
# failover before the old coordinator wrote its tombstones); the oldest are forgotten.
DELETED_TOPICS_REMEMBERED_MAX: Final[int] = 10_000


class TopicsSeen:
    """The topics (and their ``created_ms``) of the last routing map known current, and the
    names seen to go since this process started."""

    def __init__(self) -> None:
        self.incarnations: dict[str, int] | None = None  # None until a current map was read
        self.deleted: dict[str, None] = {}  # in the order seen (oldest first)
        self.epoch = 0  # one more at every change: every partition is looked at again
        self._generation = -1
        self._seen_between: dict[str, None] = {}  # committed on since the last look (saw)

    def saw(self, name: str) -> None:
        """A commit on ``name`` was taken: it was in the routing map (its deletion is acted on
        even if no look saw it in the map)."""
        if self.incarnations is None or name not in self.incarnations:
            self._seen_between[name] = None

    def observe(self, generation: int, read: Callable[[], dict[str, int]]) -> None:
        """Take the map (``read``) if it changed (``generation``) since the last look. Call
        only while the map is current."""
        if generation == self._generation:
            return
        self._generation = generation
        now = read()
        between, self._seen_between = self._seen_between, {}
        if now == self.incarnations and all(name in now for name in between):
            return
        known = [*([] if self.incarnations is None else self.incarnations), *between]
        for name in [n for n in known if n not in now]:
            self.deleted.pop(name, None)
            self.deleted[name] = None
        for name in [n for n in self.deleted if n in now]:
            del self.deleted[name]  # made again: its created_ms now tells old offsets from new
        while len(self.deleted) > DELETED_TOPICS_REMEMBERED_MAX:
            del self.deleted[next(iter(self.deleted))]
        self.incarnations = now
        self.epoch += 1


def stale_offsets(groups: Mapping[str, GroupState], incarnations: Mapping[str, int],
                  deleted: Mapping[str, None],
                  limit: int = OFFSETS_DELETED_PER_WRITE_MAX) -> list[tuple[str, TopicPartition]]:
    """At most ``limit`` (group id, partition) offsets of deleted topics, or of a topic's
    incarnation older than the current one."""
    out: list[tuple[str, TopicPartition]] = []
    for group in groups.values():
        for tp, (_offset, _metadata, commit_ms) in group.offsets.items():
            created_ms = incarnations.get(tp[0])
            if (tp[0] in deleted and created_ms is None) or (created_ms is not None and commit_ms < created_ms):
                out.append((group.group_id, tp))
                if len(out) >= limit:
                    return out
    return out
