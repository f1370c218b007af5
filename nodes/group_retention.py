"""Which empty consumer groups a coordinator forgets, and when (Kafka's offsets retention).

Pure: the clock is passed in (wall-clock ms, as the commit times in ``__consumer_offsets``),
and the coordinator (``nodes/group_coordinator.py``) writes the tombstones this returns.

Without it, every group id ever used stayed in the coordinator's memory and in its
partition of ``__consumer_offsets`` for ever (restated at every compaction): a cluster whose
clients make up group ids (a test run, a per-deploy or per-user group, ``fabric consume
--group`` typed by hand) grew without bound. A soak of 150 abandoned groups took a
coordinator's partitions from 0 to 150 live groups that never went.

The rule, as Kafka's since KIP-211: a group with live members keeps its offsets whatever
their age; once it has been **empty** for ``offsets_retention_ms`` (default 7 days, Kafka's
``offsets.retention.minutes``), counted from the later of its last member leaving and its
last commit, its offsets and the group itself are deleted (a consumer that comes back later
starts at ``auto_offset_reset``). An empty group that never committed holds nothing worth
keeping and goes after ``EMPTY_GROUP_RETENTION_MS`` (Kafka drops such a group at its next
cleanup, ``offsets.retention.check.interval.ms``, 10 minutes), or ``offsets_retention_ms``
when that is shorter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from fabric.limits import OFFSETS_RETENTION_MS_DEFAULT
from fabric.protocol import groups as gp
from nodes.group_state import GroupState

__all__ = ["OFFSETS_RETENTION_MS_DEFAULT", "expired", "last_active_ms", "tombstones"]
EMPTY_GROUP_RETENTION_MS: Final[int] = 600_000  # Kafka's offsets.retention.check.interval.ms
# How often the coordinator looks (at most; a shorter retention is looked at twice per period).
# Each look walks every group of the partitions it leads, so not every loop turn.
RETENTION_CHECK_INTERVAL_MS_MAX: Final[int] = 60_000
# Groups one check deletes per partition, in one write of their tombstones (the rest go at
# the next check): a bound on that write, about 100 bytes per tombstone.
GROUPS_EXPIRED_PER_CHECK_MAX: Final[int] = 1_000

Record = tuple[bytes, bytes | None]


def check_interval_ms(retention_ms: int) -> int:
    """How often to look for expired groups under ``retention_ms``."""
    return max(1, min(RETENTION_CHECK_INTERVAL_MS_MAX, retention_ms // 2))


def last_active_ms(group: GroupState) -> int:
    """When the group last had a member or a commit (wall-clock ms)."""
    return max([group.active_ms, *(commit_ms for _, _, commit_ms in group.offsets.values())])


def expired(groups: Mapping[str, GroupState], wall_ms: int, retention_ms: int) -> list[str]:
    """The ids of the empty groups whose retention has passed at ``wall_ms``."""
    out = []
    for group_id, group in groups.items():
        if group.members:
            continue
        keep_ms = retention_ms if group.offsets else min(retention_ms, EMPTY_GROUP_RETENTION_MS)
        if wall_ms - last_active_ms(group) >= keep_ms:
            out.append(group_id)
    return out


def tombstones(group: GroupState) -> list[Record]:
    """The records that delete ``group``: every committed offset, then the group itself."""
    records: list[Record] = [(gp.offset_key(group.group_id, *tp), None) for tp in group.offsets]
    records.append((gp.group_key(group.group_id), None))
    return records
