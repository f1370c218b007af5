"""Retention: delete whole old batches by age and by size, per topic config.

The rule (``batches_to_delete``) is pure: it reads the index entries a ``PartitionLog``
keeps in memory and says how many leading batches go. Age is the leader's append time,
not the producer's timestamp, so a producer's wrong clock can neither pin data forever
nor delete it early. The loop runs ``run`` every ``retention_check_interval_ms``; each
partition's deletion is one range delete (``PartitionLog.delete_before``).

Only a partition's leader deletes by age, by its own clock; a follower deletes below its
leader's log start (nodes/follower.py) and by size. A follower's clock so never decides
what a new leader could serve: one whose clock was set 2 days forward (an NTP step, a VM
restored with a wrong clock) read every batch it had appended as 2 days older and deleted
data the leader still served, lost for good once it became leader (Kafka's followers
judge age on their own clocks too). docs/DESIGN.md, "Clocks".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fabric.zk import TopicConfig
    from nodes.log import IndexEntry, PartitionLog
    from nodes.state import NodeState, TopicPartition

log = logging.getLogger("fabric.node")


def batches_to_delete(entries: Sequence[IndexEntry], total_bytes: int, retention_ms: int, retention_bytes: int,
                      now_ms: int) -> int:
    """How many of the oldest batches to delete (a negative limit means no limit)."""
    drop = 0
    if retention_ms >= 0:
        cutoff = now_ms - retention_ms
        while drop < len(entries) and entries[drop].append_ms < cutoff:
            drop += 1
    if retention_bytes >= 0:
        excess = total_bytes - retention_bytes
        freed = sum(e.batch_bytes for e in entries[:drop])
        while drop < len(entries) and freed < excess:
            freed += entries[drop].batch_bytes
            drop += 1
    return drop


def apply(logs: Mapping[TopicPartition, PartitionLog], configs: Mapping[str, TopicConfig], now_ms: int,
          led: Container[TopicPartition] | None = None) -> dict[TopicPartition, int]:
    """Apply every topic's retention to its hosted partitions; records deleted per partition.
    ``led``: the partitions this node leads, the only ones aged here (None: all)."""
    deleted_by_partition: dict[TopicPartition, int] = {}
    for (topic, partition), plog in logs.items():
        config = configs.get(topic)
        if config is None:
            continue
        retention_ms = config.retention_ms if led is None or (topic, partition) in led else -1
        deleted = plog.apply_retention(retention_ms, config.retention_bytes, now_ms)
        if deleted:
            deleted_by_partition[(topic, partition)] = deleted
            log.info("retention deleted %d records of %s/%d; log starts at %d", deleted, topic, partition, plog.log_start_offset)
    return deleted_by_partition


def run(node: NodeState, _now: float) -> None:
    """The loop duty."""
    apply(node.logs, node.configs, int(time.time() * 1000), led=node.leaders)
