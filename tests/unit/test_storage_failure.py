"""A store whose writes fail (a full disk): the cause in words, a failure that sticks, and
staged requests answered with STORAGE_ERROR. No mount, no socket: RocksDB's refusal is
simulated by a database whose write and sync raise what rocksdict raises."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fabric import errors
from fabric.protocol import batch
from nodes import storage_failure
from nodes.log import PartitionLog, Store
from nodes.state import NodeState

ENOSPC_STATUS = "IO error: No space left on device: While appending to file: /d/rocksdb/000004.log: No space left on device"


class FullDisk:
    """The real database for reads and closing; writes and syncs refused as RocksDB does on ENOSPC."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.writes = 0

    def write(self, _wb: Any, _options: Any) -> None:
        self.writes += 1
        raise Exception(ENOSPC_STATUS)  # rocksdict raises a plain Exception with RocksDB's status

    def flush_wal(self, _sync: bool) -> None:
        raise Exception(ENOSPC_STATUS)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


def stage(plog: PartitionLog, store: Store, values: list[bytes]) -> Any:
    raw = bytearray(batch.encode_batch([1_000] * len(values), [None] * len(values), values))
    wb = store.new_write_batch()
    plog.append(wb, raw, batch.read_header(raw), 0, 0)
    return wb


@pytest.mark.parametrize(("status", "kind", "words"), [
    (ENOSPC_STATUS, "disk_full", "the disk is full"),
    ("IO error: While pwrite to file at offset 0: /d/000011.sst: No space left on device", "disk_full", "disk is full"),
    ("IO error: Disk quota exceeded: While appending to file: /d/000004.log", "quota", "quota"),
    ("IO error: While open a file for appending: /d/000012.log: Read-only file system", "read_only", "read-only"),
    ("IO error: Input/output error", "io", "I/O error"),
    ("Corruption: block checksum mismatch: stored = 1, computed = 2", "corruption", "stored data is damaged"),
    ("Invalid argument: Column family not found", "other", "RocksDB: Invalid argument"),
])
def test_the_cause_in_words(status: str, kind: str, words: str) -> None:
    found_kind, found_words = storage_failure.cause_of(status)
    assert found_kind == kind and words in found_words


def test_the_error_names_the_directory_and_the_cause() -> None:
    error = storage_failure.storage_error("/data/node2/rocksdb", Exception(ENOSPC_STATUS))
    assert isinstance(error, errors.StorageError) and error.retriable and error.code == 26
    assert error.message.startswith("storage write failed in /data/node2/rocksdb: the disk is full")
    assert error.fields == {"path": "/data/node2/rocksdb", "cause": "disk_full"}
    assert ENOSPC_STATUS in error.message  # RocksDB's own words, for whoever digs further
    line = storage_failure.stop_line(2, error)
    assert "\n" not in line and "node 2 stops" in line and "/data/node2/rocksdb" in line
    assert f"exit status {storage_failure.EXIT_STORAGE_FAILED}" in line


def test_a_failed_write_sticks_and_nothing_more_is_written(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    store = Store(path)
    plog = PartitionLog(store, "t", 0, incarnation=1)
    store.write(stage(plog, store, [b"kept"]))
    full = FullDisk(store.db)
    store.db = full
    with pytest.raises(errors.StorageError) as first:
        store.write(stage(plog, store, [b"lost"]))
    assert first.value.fields["cause"] == "disk_full" and path in first.value.message
    # Every later write raises the first failure without asking RocksDB again: the
    # checkpoint of a shutdown, the next turn's batch, a sync.
    for attempt in (plog.checkpoint_high_watermark, lambda: store.write(store.new_write_batch()), store.sync_wal):
        with pytest.raises(errors.StorageError) as later:
            attempt()
        assert later.value is first.value
    assert full.writes == 1
    store.close()  # no sync after a failure: it would fail again
    store = Store(path)
    again = PartitionLog(store, "t", 0, incarnation=1)
    assert again.log_end_offset == 1  # the batch before the failure, not the one after it
    store.close()


def test_a_sync_that_fails_is_the_store_failure(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    store.db = FullDisk(store.db)
    with pytest.raises(errors.StorageError) as failed:
        store.sync_wal()
    assert failed.value.message.startswith("storage sync failed in ") and store.failure is failed.value
    store.close()


def test_write_staged_answers_every_staged_request(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    plog = PartitionLog(store, "t", 0, incarnation=1)
    wb = stage(plog, store, [b"x"])
    store.db = FullDisk(store.db)
    answered: list[tuple[Any, Any, errors.FabricError]] = []
    node = SimpleNamespace(store=store, send_error=lambda envelope, header, exc: answered.append((envelope, header, exc)))
    staged = [([b"client-1"], SimpleNamespace(header="h1"), None), ([b"client-2"], SimpleNamespace(header="h2"), None)]
    with pytest.raises(errors.StorageError):
        NodeState.write_staged(node, wb, staged)  # type: ignore[arg-type]
    assert [(envelope, header) for envelope, header, _ in answered] == [([b"client-1"], "h1"), ([b"client-2"], "h2")]
    assert all(isinstance(exc, errors.StorageError) and exc.retriable for _, _, exc in answered)
    store.close()
