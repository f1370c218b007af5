"""Opening the node's store: the data dir, the O_DIRECT probe and the ``direct_io`` modes,
on real files and a real RocksDB."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.errors import ConfigError
from fabric.protocol import batch
from nodes import storage_setup
from nodes.log import PartitionLog
from nodes.state import NodeConfig


def test_the_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    assert isinstance(storage_setup.supported(str(tmp_path)), bool)
    assert os.listdir(tmp_path) == []


def test_the_probe_says_no_where_it_cannot_make_a_file(tmp_path: Path) -> None:
    assert storage_setup.supported("/proc") is False
    assert storage_setup.supported(str(tmp_path / "missing")) is False


def test_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert storage_setup.use_direct_io("off", str(tmp_path)) is False
    assert storage_setup.use_direct_io("auto", str(tmp_path)) is storage_setup.supported(str(tmp_path))
    with pytest.raises(ConfigError, match="direct_io must be one of auto, on, off"):
        storage_setup.use_direct_io("yes", str(tmp_path))
    # A file system that refuses O_DIRECT: auto falls back, on refuses to start.
    monkeypatch.setattr(storage_setup, "supported", lambda directory: False)
    assert storage_setup.use_direct_io("auto", str(tmp_path)) is False
    with pytest.raises(ConfigError, match="refuses O_DIRECT writes"):
        storage_setup.use_direct_io("on", str(tmp_path))


def test_open_store_makes_the_data_dir_or_says_why_not(tmp_path: Path) -> None:
    config = NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir=str(tmp_path / "a" / "b"), direct_io="off")
    storage_setup.open_store(config).close()
    assert (tmp_path / "a" / "b" / "rocksdb").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot be a directory"):
        storage_setup.open_store(NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir=str(tmp_path / "file" / "x")))


def test_the_probe_runs_where_the_table_files_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rocksdb").symlink_to(elsewhere)  # RocksDB linked to another file system
    probed: list[str] = []
    monkeypatch.setattr(storage_setup, "supported", lambda directory: probed.append(directory) or False)
    storage_setup.open_store(NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir=str(tmp_path / "data"))).close()
    assert probed == [str(tmp_path / "data" / "rocksdb")]
    assert (elsewhere / "CURRENT").exists()


def test_batches_flushed_with_o_direct_read_back_after_a_restart(tmp_path: Path) -> None:
    if not storage_setup.supported(str(tmp_path)):
        pytest.skip("this file system refuses O_DIRECT")
    config = NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir=str(tmp_path), direct_io="on")
    store = storage_setup.open_store(config)
    log = PartitionLog(store, "t", 0, incarnation=1)
    values = [os.urandom(1000) for _ in range(3000)]  # incompressible, several table blocks
    for start in range(0, len(values), 100):
        buf = bytearray(batch.encode_batch([1] * 100, [None] * 100, values[start : start + 100]))
        wb = store.new_write_batch()
        log.append(wb, buf, batch.read_header(buf), 0, 0)
        store.write(wb)
    store.db.flush()  # a table file, written with O_DIRECT
    store.close()
    assert list((tmp_path / "rocksdb").glob("*.sst"))
    assert "Options.use_direct_io_for_flush_and_compaction: 1" in (tmp_path / "rocksdb" / "LOG").read_text()
    store = storage_setup.open_store(config)
    again = PartitionLog(store, "t", 0, incarnation=1)
    read = [v for raw in again.read(0, 1 << 30, again.log_end_offset) for v in batch.decode_batch(raw).values]
    assert read == values
    store.close()


def test_a_data_dir_in_use_is_a_one_line_error(tmp_path: Path) -> None:
    """A second node started on a running node's data_dir: RocksDB's LOCK refuses it, and
    the node said so with a traceback (rocksdict raises a plain Exception)."""
    config = NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir=str(tmp_path))
    store = storage_setup.open_store(config)
    try:
        with pytest.raises(ConfigError, match="in use by another process"):
            storage_setup.open_store(NodeConfig(node_id=2, zk="127.0.0.1:1", data_dir=str(tmp_path)))
    finally:
        store.close()
