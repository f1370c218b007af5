"""The partition log on a real RocksDB in a temp dir (no sockets)."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest
import rocksdict

from fabric import errors
from fabric.protocol import batch
from nodes.log import PartitionLog, Store


def make_batch(values: list[bytes], ts: int = 1_000, producer_id: int = -1, seq: int = -1) -> bytearray:
    raw = batch.encode_batch([ts] * len(values), [None] * len(values), values,
                             producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1, base_sequence=seq)
    return bytearray(raw)


def append(log: PartitionLog, store: Store, values: list[bytes], append_ms: int = 0, epoch: int = 0, **kw: int) -> int:
    buf = make_batch(values, **kw)
    wb = store.new_write_batch()
    base, _stored = log.append(wb, buf, batch.read_header(buf), epoch, append_ms)
    store.write(wb)
    return base


def test_append_read_and_reload(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    assert append(log, store, [b"a", b"b"]) == 0
    assert append(log, store, [b"c"]) == 2
    assert append(log, store, [b"d", b"e", b"f"], ts=5_000) == 3
    got = [batch.decode_batch(b) for b in log.read(1, 1 << 20, log.log_end_offset)]
    assert [d.header.base_offset for d in got] == [0, 2, 3]
    assert got[0].values == [b"a", b"b"]
    assert log.offset_for_timestamp(2_000) == (3, 5_000)
    with pytest.raises(errors.OffsetOutOfRangeError):
        log.read(7, 1 << 20, 100)
    store.close()
    store = Store(str(tmp_path / "db"))
    again = PartitionLog(store, "t", 0, incarnation=1)
    assert again.log_end_offset == 6 and again.bases == [0, 2, 3]
    store.close()


def test_read_respects_budget_and_limit(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    for _i in range(5):
        append(log, store, [b"x" * 100] * 10)
    one = log.read(0, 1, log.log_end_offset)
    assert len(one) == 1  # at least one batch, however small the budget
    assert len(log.read(0, 1 << 20, 30)) == 3  # never past the limit (high watermark)
    store.close()


def test_truncate_then_append_reuses_offsets(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    append(log, store, [b"a"], epoch=0)
    append(log, store, [b"b", b"c"], epoch=1)
    append(log, store, [b"d"], epoch=1)
    log.truncate_to(1)
    assert log.log_end_offset == 1 and log.epochs == [(0, 0)]
    assert append(log, store, [b"z"], epoch=2) == 1
    assert [batch.decode_batch(b).values for b in log.read(0, 1 << 20, 10)] == [[b"a"], [b"z"]]
    store.close()


def test_retention_by_time_and_bytes_and_restart(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    for i in range(10):
        append(log, store, [b"x" * 100], append_ms=i * 1000)
    # Appended at 0, 1000, ... 9000 ms; at 10,000 ms with 5,500 ms retention, 0-4000 go.
    assert log.apply_retention(retention_ms=5_500, retention_bytes=-1, now_ms=10_000) == 5
    assert log.log_start_offset == 5
    size = log.entries[0].batch_bytes
    assert log.apply_retention(retention_ms=-1, retention_bytes=3 * size, now_ms=10_000) == 2
    assert log.log_start_offset == 7
    with pytest.raises(errors.OffsetOutOfRangeError):
        log.read(0, 1 << 20, 100)
    log.apply_retention(retention_ms=1, retention_bytes=-1, now_ms=100_000)
    assert log.log_start_offset == log.log_end_offset == 10
    store.close()
    store = Store(str(tmp_path / "db"))
    again = PartitionLog(store, "t", 0, incarnation=1)
    assert again.log_start_offset == again.log_end_offset == 10  # offsets never go back
    store.close()


def test_new_incarnation_wipes_old_data(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    append(log, store, [b"old"])
    again = PartitionLog(store, "t", 0, incarnation=2)
    assert again.log_end_offset == 0 and again.read(0, 100, 100) == []
    store.close()


def test_producer_state_rebuilt_from_index(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    append(log, store, [b"a", b"b"], producer_id=9, seq=0)
    store.close()
    store = Store(str(tmp_path / "db"))
    again = PartitionLog(store, "t", 0, incarnation=1)
    assert again.producers.check(9, 0, 0, 2) == ("duplicate", 0)
    store.close()


def test_read_at_the_log_end_returns_nothing(tmp_path: Path) -> None:
    # A fetch at the end must find no batch (and so wait), not the last batch again.
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    assert log.read(0, 1 << 20, log.log_end_offset) == []
    append(log, store, [b"a", b"b"])
    append(log, store, [b"c"])
    assert log.log_end_offset == 3
    assert log.read(3, 1 << 20, 3) == []
    assert [batch.decode_batch(b).values for b in log.read(2, 1 << 20, 3)] == [[b"c"]]
    assert [batch.decode_batch(b).values for b in log.read(1, 1 << 20, 3)] == [[b"a", b"b"], [b"c"]]
    store.close()


def data_keys(store: Store) -> list[bytes]:
    """Every key in the default family (the batches)."""
    it = store.db.iter()
    it.seek_to_first()
    keys = []
    while it.valid():
        keys.append(it.key())
        it.next()
    del it
    return keys


def test_batches_take_node_wide_sequences_that_continue_after_a_reopen(tmp_path: Path) -> None:
    # Batches of every partition go under one increasing sequence, so each flush lands
    # after the older data (docs/DESIGN.md, "Storage"); a reopen must never reuse a live key.
    store = Store(str(tmp_path / "db"))
    a, b = PartitionLog(store, "t", 0, incarnation=1), PartitionLog(store, "t", 1, incarnation=1)
    append(a, store, [b"a0"])
    append(b, store, [b"b0"])
    append(a, store, [b"a1"])
    assert [e.sequence for e in a.entries] == [0, 2] and [e.sequence for e in b.entries] == [1]
    assert data_keys(store) == [b"s" + i.to_bytes(8, "big") for i in range(3)]
    store.close()
    store = Store(str(tmp_path / "db"))
    a, b = PartitionLog(store, "t", 0, incarnation=1), PartitionLog(store, "t", 1, incarnation=1)
    append(b, store, [b"b1"])
    assert b.entries[-1].sequence == 3
    assert [batch.decode_batch(x).values for x in a.read(0, 1 << 20, 9)] == [[b"a0"], [b"a1"]]
    assert [batch.decode_batch(x).values for x in b.read(0, 1 << 20, 9)] == [[b"b0"], [b"b1"]]
    store.close()


def test_wal_files_stay_within_their_bound(tmp_path: Path) -> None:
    # RocksDB keeps a WAL file until every family has flushed what it holds; the meta
    # family seldom fills its memtable, so without a bound WAL files piled up to RocksDB's
    # default of 1 GiB, each new one written into fresh page cache (docs/DESIGN.md,
    # "Storage"). Here the bound is 4 MiB and 48 MiB go in, a 1 MiB batch at a time.
    bound = 4 * 1024 * 1024
    store = Store(str(tmp_path / "db"), wal_bytes_max=bound)
    log = PartitionLog(store, "t", 0, incarnation=1)
    chunk = os.urandom(1024 * 1024 - 1024)
    for i in range(48):
        append(log, store, [i.to_bytes(4, "big") + chunk[:-4]])

    def wal_bytes() -> int:
        return sum(f.stat().st_size for f in (tmp_path / "db").glob("*.log"))

    # Flushes run in RocksDB's background threads, and the bound is checked when a write
    # comes (DBImpl::PreprocessWrite): a loaded machine's flushes can lag the 48 writes,
    # and a node keeps writing, so small writes go on while the test waits.
    deadline = time.monotonic() + 20
    while wal_bytes() > 2 * bound and time.monotonic() < deadline:
        append(log, store, [b"small"])
        time.sleep(0.05)
    assert wal_bytes() <= 2 * bound
    store.close()
    store = Store(str(tmp_path / "db"), wal_bytes_max=bound)  # nothing lost with the WALs
    log = PartitionLog(store, "t", 0, incarnation=1)
    read = [v for raw in log.read(0, 1 << 30, log.log_end_offset) for v in batch.decode_batch(raw).values]
    assert [v[:4] for v in read if v != b"small"] == [i.to_bytes(4, "big") for i in range(48)]
    store.close()


def test_retention_truncation_and_wipe_delete_the_batches_too(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "db"))
    log, other = PartitionLog(store, "t", 0, incarnation=1), PartitionLog(store, "t", 1, incarnation=1)
    for i in range(6):
        append(log, store, [b"x%d" % i])
        append(other, store, [b"y%d" % i])
    assert len(data_keys(store)) == 12
    assert log.delete_before(2) == 2
    log.truncate_to(4)
    assert [e.base_offset for e in log.entries] == [2, 3]
    assert len(data_keys(store)) == 6 + 2  # the other partition's six, this one's two
    store.close()
    store = Store(str(tmp_path / "db"))
    PartitionLog(store, "t", 0, incarnation=2)  # re-created topic: the old incarnation is wiped at load
    assert len(data_keys(store)) == 6
    assert store.partitions() == [("t", 0), ("t", 1)]
    assert [batch.decode_batch(x).values for x in PartitionLog(store, "t", 1, incarnation=1).read(0, 1 << 20, 9)] == [
        [b"y%d" % i] for i in range(6)]
    store.close()


def test_a_store_from_before_the_sequence_is_migrated(tmp_path: Path) -> None:
    # The layout before: batches under b"d" + pkey + offset, index entries without a
    # sequence and metadata, all in the default family.
    path = str(tmp_path / "db")
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    old = rocksdict.Rdict(path, options)
    written: dict[bytes, bytes] = {}
    pkey = b"t\x00" + (0).to_bytes(4, "big")
    for base, values in ((0, [b"a", b"b"]), (2, [b"c"])):
        raw = bytes(make_batch(values))
        header = batch.read_header(bytearray(raw))
        buf = batch.stamped(raw, base, 3)
        old[b"d" + pkey + base.to_bytes(8, "big")] = buf
        old[b"i" + pkey + base.to_bytes(8, "big")] = struct.pack(
            "<iiqqiqhi", header.record_count, len(buf), header.max_timestamp, 0, 3, -1, -1, -1)
    old[b"m" + pkey + b"c"] = struct.pack("<q", 1)
    old[b"m" + pkey + b"e"] = struct.pack("<iq", 3, 0)
    old[b"m" + pkey + b"h"] = struct.pack("<q", 3)
    written.update((key, value) for key, value in old.items() if key[:1] in (b"i", b"m"))
    assert len(written) == 5  # two index entries, three metadata keys
    old.close()

    store = Store(path)
    store.close()
    # A node killed after the copy and before the delete: the old keys are still in the
    # default family beside their copies. The next open copies again, the same result.
    again = rocksdict.Rdict(path, options, column_families={"meta": options})
    for key, value in written.items():
        again[key] = value
    again.close()
    store = Store(path)
    log = PartitionLog(store, "t", 0, incarnation=1)
    assert log.bases == [0, 2] and log.high_watermark == 3 and log.latest_epoch() == 3
    assert [batch.decode_batch(x).values for x in log.read(0, 1 << 20, 3)] == [[b"a", b"b"], [b"c"]]
    assert [k[:1] for k in data_keys(store)] == [b"d", b"d"]  # index and metadata moved to the meta family
    append(log, store, [b"d"], epoch=3)
    store.close()
    store = Store(path)
    log = PartitionLog(store, "t", 0, incarnation=1)
    assert [batch.decode_batch(x).values for x in log.read(0, 1 << 20, 9)] == [[b"a", b"b"], [b"c"], [b"d"]]
    log.delete_before(1)
    assert [k[:1] for k in data_keys(store)] == [b"d", b"s"]
    log.wipe()
    assert data_keys(store) == []
    store.close()


def test_an_unchanged_high_watermark_is_not_written_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node checkpoints every partition's HW each second; at 2,000 partitions writing the
    unchanged ones was a tenth of an idle node. Only a change is written, and a wipe (which
    deletes the stored one) makes the next checkpoint write again, so a restart always
    reads what the HW was."""
    store = Store(str(tmp_path / "db"))
    log = PartitionLog(store, "t", 0, incarnation=1)
    append(log, store, [b"a", b"b", b"c"])
    writes: list[bytes] = []
    put_meta = store.put_meta
    monkeypatch.setattr(store, "put_meta", lambda key, value, **kw: (writes.append(value), put_meta(key, value, **kw)))
    log.high_watermark = 3
    for _ in range(3):
        log.checkpoint_high_watermark()
    assert len(writes) == 1
    log.high_watermark = 2
    log.checkpoint_high_watermark()
    assert len(writes) == 2
    store.close()
    store = Store(str(tmp_path / "db"))
    again = PartitionLog(store, "t", 0, incarnation=1)
    assert again.high_watermark == 2
    again.checkpoint_high_watermark()  # the first after a load is written: what is stored may differ
    again.reset_to(2)  # a wipe deletes the stored HW with everything else
    writes2: list[bytes] = []
    put2 = store.put_meta
    monkeypatch.setattr(store, "put_meta", lambda key, value, **kw: (writes2.append(value), put2(key, value, **kw)))
    again.checkpoint_high_watermark()
    assert writes2 == [struct.pack("<q", 2)]
    store.close()
