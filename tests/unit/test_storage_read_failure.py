"""A store whose reads fail, on a real RocksDB: a table file with one block corrupted on
disk (a checksum mismatch is what RocksDB reports for a disk that returned bad bytes).
No mock, no socket. A failed read is a ``StorageError`` (STORAGE_ERROR to the client, not
UNKNOWN_SERVER_ERROR) and the store's failure, so the node stops at the end of the turn;
an iteration that RocksDB ended on a failed read is not taken for the end of the data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric import errors
from fabric.protocol import batch
from nodes import storage_failure
from nodes.log import PartitionLog, Store

BATCHES = 40
VALUE_BYTES = 8_000  # random, so incompressible: about one 8 kB table block per batch
INDEX_BATCHES = 2_000  # small batches: their index entries fill many blocks of the meta family


def write_batches(store: Store, plog: PartitionLog, count: int, value_bytes: int) -> None:
    for _ in range(count):
        raw = bytearray(batch.encode_batch([1_000], [None], [os.urandom(value_bytes)]))
        wb = store.new_write_batch()
        plog.append(wb, raw, batch.read_header(raw), 0, 0)
        store.write(wb)


def corrupt_the_middle(table_files: list[Path]) -> None:
    """Flip bytes in the middle of the largest table file: a data block there, not the
    index or footer at its end that RocksDB reads as it opens."""
    path = max(table_files, key=lambda p: p.stat().st_size)
    middle = path.stat().st_size // 2
    with open(path, "r+b") as f:
        f.seek(middle)
        data = f.read(16)
        f.seek(middle)
        f.write(bytes(b ^ 0xFF for b in data))


def table_files_of(path: Path, before: set[Path]) -> list[Path]:
    return [p for p in path.glob("*.sst") if p not in before]


def test_a_batch_that_cannot_be_read_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = Store(str(path))
    plog = PartitionLog(store, "t", 0, incarnation=1)
    write_batches(store, plog, BATCHES, VALUE_BYTES)
    store.close()  # flushes both families into table files
    corrupt_the_middle(table_files_of(path, set()))

    store = Store(str(path))
    plog = PartitionLog(store, "t", 0, incarnation=1)
    assert plog.log_end_offset == BATCHES  # the index is intact: only batch bytes are bad
    failures = []
    for offset in range(BATCHES):
        try:
            plog.read(offset, 1, offset + 1)
        except errors.StorageError as exc:
            failures.append(exc)
    assert failures, "no read met the corrupted block"
    first = failures[0]
    assert first.code == 26 and first.retriable  # STORAGE_ERROR: producers and consumers retry elsewhere
    assert first.message.startswith(f"storage read failed in {path}: stored data is damaged")
    assert "Corruption: block checksum mismatch" in first.message  # RocksDB's own words too
    assert first.fields["cause"] == "corruption"
    line = storage_failure.stop_line(2, first)  # says a restart may meet it again, not "once the cause is gone"
    assert "may meet the same damage" in line and "once the cause is gone" not in line
    assert store.failure is first  # the node stops at the end of the turn (nodes/server.py)
    with pytest.raises(errors.StorageError) as later:  # and writes nothing more
        store.write(store.new_write_batch())
    assert later.value is first
    store.close()


def test_an_index_that_cannot_be_read_is_not_taken_for_a_shorter_log(tmp_path: Path) -> None:
    # Before: the index load's iterator stopped at the bad block as if the partition ended
    # there, and the node came up with a shorter log than it had acknowledged.
    path = tmp_path / "db"
    store = Store(str(path))
    plog = PartitionLog(store, "t", 0, incarnation=1)
    write_batches(store, plog, INDEX_BATCHES, 8)
    store.db.flush()  # the batches' family first, so that the meta family's file is the one made last
    before = set(path.glob("*.sst"))
    store.close()
    corrupt_the_middle(table_files_of(path, before))

    store = Store(str(path))
    with pytest.raises(errors.StorageError) as failed:
        PartitionLog(store, "t", 0, incarnation=1)
    assert failed.value.message.startswith(f"storage read failed in {path}") and store.failure is failed.value
    store.close()


def test_a_store_whose_last_batch_cannot_be_read_does_not_open(tmp_path: Path) -> None:
    # Before: the open's seek for the last batch sequence ended on the bad block, the
    # store took itself for empty and numbered the next batch 0, over a stored one.
    path = tmp_path / "db"
    store = Store(str(path))
    plog = PartitionLog(store, "t", 0, incarnation=1)
    write_batches(store, plog, BATCHES, VALUE_BYTES)
    store.db.flush()
    store.close()
    batches_file = max(path.glob("*.sst"), key=lambda p: p.stat().st_size)
    size = batches_file.stat().st_size
    with open(batches_file, "r+b") as f:  # the last data block: just before the index at the end
        f.seek(size - VALUE_BYTES)
        f.write(bytes(64))
    with pytest.raises(errors.StorageError, match=f"storage read failed in {path}"):
        Store(str(path))
