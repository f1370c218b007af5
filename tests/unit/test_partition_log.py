"""The partition log on a real RocksDB in a temp dir (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    base = log.append(wb, buf, batch.read_header(buf), epoch, append_ms)
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
