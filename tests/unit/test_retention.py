"""Retention (nodes/retention.py): the pure rule, then applied to real logs in a temp RocksDB."""

from __future__ import annotations

from pathlib import Path

from fabric.protocol import batch
from fabric.zk import TopicConfig
from nodes import retention
from nodes.log import IndexEntry, PartitionLog, Store


def entries(append_ms: list[int], size: int = 100) -> list[IndexEntry]:
    return [IndexEntry(i * 10, 10, size, 0, ms, 0) for i, ms in enumerate(append_ms)]


def test_age_counts_from_the_leaders_append_time() -> None:
    old = entries([0, 1_000, 2_000, 3_000])
    assert retention.batches_to_delete(old, 400, retention_ms=2_500, retention_bytes=-1, now_ms=3_000) == 1
    assert retention.batches_to_delete(old, 400, retention_ms=-1, retention_bytes=-1, now_ms=10**12) == 0


def test_size_deletes_the_oldest_until_under_the_limit() -> None:
    four = entries([0, 0, 0, 0])
    assert retention.batches_to_delete(four, 400, retention_ms=-1, retention_bytes=250, now_ms=0) == 2
    assert retention.batches_to_delete(four, 400, retention_ms=-1, retention_bytes=400, now_ms=0) == 0
    assert retention.batches_to_delete(four, 400, retention_ms=-1, retention_bytes=0, now_ms=0) == 4


def test_age_and_size_together_count_what_age_already_freed() -> None:
    four = entries([0, 1_000, 2_000, 3_000])
    # Age deletes 1 batch (100 bytes); size wants 150 freed: one more.
    assert retention.batches_to_delete(four, 400, retention_ms=2_500, retention_bytes=250, now_ms=3_000) == 2


def _append_three_batches(store: Store, logs: dict[tuple[str, int], PartitionLog]) -> None:
    """One record each, appended at 0, 1,000 and 2,000 ms."""
    for plog in logs.values():
        for append_ms in (0, 1_000, 2_000):
            raw = bytearray(batch.encode_batch([0], [None], [b"v" * 50]))
            wb = store.new_write_batch()
            plog.append(wb, raw, batch.read_header(raw), 0, append_ms)
            store.write(wb)


def test_apply_deletes_per_topic_config_and_skips_unknown_topics(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    try:
        logs = {("kept", 0): PartitionLog(store, "kept", 0, 1), ("aged", 0): PartitionLog(store, "aged", 0, 1),
                ("unknown", 0): PartitionLog(store, "unknown", 0, 1)}
        _append_three_batches(store, logs)
        configs = {"kept": TopicConfig(1, retention_ms=-1), "aged": TopicConfig(1, retention_ms=1_500)}
        deleted = retention.apply(logs, configs, now_ms=3_000)
        assert deleted == {("aged", 0): 2}
        assert logs[("aged", 0)].log_start_offset == 2
        assert logs[("kept", 0)].log_start_offset == 0
        assert logs[("unknown", 0)].log_start_offset == 0
    finally:
        store.close()


def test_only_the_leader_deletes_by_age(tmp_path: Path) -> None:
    """A follower deletes below its leader's log start (nodes/follower.py), never by age on
    its own clock: one whose clock was set 2 days forward took every batch it had appended
    as 2 days old and deleted what the leader still served, lost once it led. Size still
    applies everywhere (it needs no clock)."""
    store = Store(str(tmp_path / "db"))
    try:
        logs = {("t", 0): PartitionLog(store, "t", 0, 1), ("t", 1): PartitionLog(store, "t", 1, 1)}
        _append_three_batches(store, logs)
        two_days_on_ms = 2 * 86_400_000
        configs = {"t": TopicConfig(2, retention_ms=86_400_000)}
        assert retention.apply(logs, configs, now_ms=two_days_on_ms, led={("t", 0)}) == {("t", 0): 3}
        assert logs[("t", 1)].log_start_offset == 0  # followed: only below its leader's log start
        sized = {"t": TopicConfig(2, retention_ms=86_400_000, retention_bytes=1)}
        assert retention.apply(logs, sized, now_ms=two_days_on_ms, led=set()) == {("t", 1): 3}
    finally:
        store.close()
