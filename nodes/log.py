"""The partition log on RocksDB: batches in append order, an index per partition.

One RocksDB per node holds every hosted partition, in two column families. Keys (all
integers big-endian so that RocksDB's byte order is numeric order)::

    default family (the batches)
    b"s" + u64 sequence             the batch bytes exactly as stamped by the leader, under
                                    a node-wide sequence taken at append
    b"d" + pkey + u64 base_offset   a batch written by a store older than the sequence
    "meta" family (small)
    b"i" + pkey + u64 base_offset   index entry: record_count, batch bytes, max timestamp,
                                    append time, leader epoch, producer id/epoch/sequence
                                    and the batch's sequence (read at startup, never the batch)
    b"m" + pkey + b"s"              log start offset (survives retention deleting everything)
    b"m" + pkey + b"c"              topic incarnation (created_ms): data of a deleted and
                                    re-created topic of the same name is wiped, never served
    b"m" + pkey + b"e"              leader-epoch history: (epoch, start offset) pairs
    b"m" + pkey + b"h"              high-watermark checkpoint (a lower bound after a restart)

where ``pkey = topic UTF-8 + b"\\x00" + u32 partition`` (topic names cannot hold NUL).

Why a node-wide sequence (docs/DESIGN.md, "Storage"): each batch lands after the one before,
whatever its partition, so a flush is a run of keys after every older file, which compaction
moves down without rewriting; the index has its own family, never widening a flush.

A batch and its index entry go in one WriteBatch (it spans the families): both or
neither. RocksDB's WAL makes an acknowledged write survive a SIGKILL without fsync (it is
in the page cache before put() returns); fsync guards against power loss and kernel
crashes. WAL files are bounded (``WAL_BYTES_MAX``): RocksDB keeps one until every family
flushed its part, the meta family seldom fills its memtable, and WALs piled up to 1 GiB
(RocksDB's default), each written into fresh page cache, all replayed at a restart.
"""

from __future__ import annotations

import bisect
import contextlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import rocksdict

from fabric.errors import OffsetOutOfRangeError, StorageError
from fabric.protocol import batch as batch_format
from nodes.producer_state import ProducerStates
from nodes.retention import batches_to_delete
from nodes.storage_failure import GuardedReads, storage_error
from nodes.store_migration import migrate_to_meta_family

_U64 = struct.Struct(">Q")
# record_count, batch_bytes, max_timestamp, append_ms, leader_epoch, producer_id, producer_epoch, base_sequence,
# and the batch's key sequence. An entry written before the sequence lacks the last field
# (its batch is at b"d" + pkey + base_offset).
_INDEX = struct.Struct("<iiqqiqhiQ")
_INDEX_BEFORE_SEQUENCE = struct.Struct("<iiqqiqhi")
META_FAMILY = "meta"
NO_SEQUENCE = -1
_I64 = struct.Struct("<q")
_EPOCH_ENTRY = struct.Struct("<iq")
WAL_BYTES_MAX = 256 * 1024 * 1024  # then RocksDB flushes the families holding the oldest WAL


def partition_key(topic: str, partition: int) -> bytes:
    return topic.encode("utf-8") + b"\x00" + struct.pack(">I", partition)


def split_partition_key(pkey: bytes) -> tuple[str, int]:
    """The inverse of ``partition_key``."""
    return pkey[:-5].decode("utf-8", "replace"), int.from_bytes(pkey[-4:], "big")


def _prefixed(view: Any, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every key of ``view`` (the database or a family) starting with ``prefix``."""
    it = view.iter()
    it.seek(prefix)
    try:
        while it.valid():
            key = it.key()
            if not key.startswith(prefix):
                return
            yield key, it.value()
            it.next()
    finally:
        del it


@dataclass
class IndexEntry:
    base_offset: int
    record_count: int
    batch_bytes: int
    max_timestamp: int
    append_ms: int
    leader_epoch: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    sequence: int = NO_SEQUENCE  # where the batch is: b"s" + sequence (NO_SEQUENCE: b"d" + pkey + base)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class Store:
    """The node's one RocksDB, raw mode: batches in the default family, the rest in "meta"."""

    def __init__(self, path: str, *, fsync: str = "none", direct_io: bool = False, wal_bytes_max: int = WAL_BYTES_MAX) -> None:
        if fsync not in ("none", "interval", "every-batch"):
            raise ValueError(f"fsync must be none, interval or every-batch, got {fsync!r}")
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_max_background_jobs(2)
        options.set_use_direct_io_for_flush_and_compaction(direct_io)  # nodes/storage_setup.py
        options.set_max_total_wal_size(wal_bytes_max)
        try:
            names = rocksdict.Rdict.list_cf(path, options)
        except Exception:  # rocksdict raises a plain exception when there is no store yet
            names = []
        families = {name: options for name in names if name != "default"}
        self.db = GuardedReads(rocksdict.Rdict(path, options, column_families=families or None), self)
        if META_FAMILY not in families:
            self.db.create_column_family(META_FAMILY, options).close()
        # A view to read and put single keys, a handle for WriteBatches. The view keeps the
        # database open until it is closed: close() closes it first.
        self.meta = GuardedReads(self.db.get_column_family(META_FAMILY), self)  # reads: storage_failure.py
        self.meta_cf: Any = self.db.get_column_family_handle(META_FAMILY)
        self.path = path
        self.fsync = fsync
        self.write_options = rocksdict.WriteOptions()
        self.write_options.sync = fsync == "every-batch"
        self._unsynced = rocksdict.WriteOptions()  # metadata checkpoints: never an fsync of their own
        self.failure: StorageError | None = None  # the first failed write: later ones raise it (_guarded)
        migrate_to_meta_family(self)
        self.next_sequence = self._last_sequence() + 1

    def _last_sequence(self) -> int:
        it = self.db.iter()
        it.seek_for_prev(b"s" + b"\xff" * 8)
        key = it.key() if it.valid() else b""
        del it
        return _U64.unpack_from(key, 1)[0] if len(key) == 9 and key[:1] == b"s" else -1

    def take_sequence(self) -> int:
        """The key sequence of the next batch appended on this node (any partition)."""
        sequence = self.next_sequence
        self.next_sequence += 1
        return sequence

    def partitions(self) -> list[tuple[str, int]]:
        """(topic, partition) of every partition this store holds (its incarnation key is there)."""
        return [split_partition_key(key[1:-1]) for key, _ in _prefixed(self.meta, b"m")
                if key.endswith(b"c") and len(key) >= 7]

    def stored_batches(self, topic: str, partition: int) -> dict[int, bytes]:
        """Every batch stored for the partition, by base offset, as its index names them
        (for checkers that read a stopped node's store)."""
        out: dict[int, bytes] = {}
        pkey = partition_key(topic, partition)
        for entry in _stored_entries(self, pkey):
            value = self.db.get(_data_key(pkey, entry))
            if value is not None:
                out[entry.base_offset] = value
        return out

    def new_write_batch(self) -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def _guarded(self, what: str, operation: Callable[[], object]) -> None:
        """Run a RocksDB call that writes, or raise the store's ``StorageError``. The first
        failure sticks: RocksDB refuses every later write anyway (its background error)."""
        if self.failure is not None:
            raise self.failure
        try:
            operation()
        except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
            self.failure = storage_error(self.path, exc, what=what)
            raise self.failure from None

    def write(self, wb: rocksdict.WriteBatch, *, follow_fsync: bool = True) -> None:
        """Write ``wb``, synced as the ``fsync`` setting says (never, with ``follow_fsync`` False)."""
        self._guarded("write", lambda: self.db.write(wb, self.write_options if follow_fsync else self._unsynced))

    def put_meta(self, key: bytes, value: bytes, *, follow_fsync: bool = False) -> None:
        wb = self.new_write_batch()
        wb.put(key, value, self.meta_cf)
        self.write(wb, follow_fsync=follow_fsync)

    def sync_wal(self) -> None:
        self._guarded("sync", lambda: self.db.flush_wal(True))

    def close(self) -> None:
        """Sync and close. After a failure only close: rocksdict flushes the memtables as it
        closes, which then fails again (not news, so not raised)."""
        try:
            if self.failure is None:
                self.sync_wal()
        finally:
            if self.failure is None:
                self._guarded("close", self._close_handles)
            else:
                with contextlib.suppress(Exception):
                    self._close_handles()

    def _close_handles(self) -> None:
        self.meta.close()  # the family's view and handle each keep the database (and its LOCK) open
        self.meta_cf = None
        self.db.close()


def _data_key(pkey: bytes, entry: IndexEntry) -> bytes:
    if entry.sequence == NO_SEQUENCE:
        return b"d" + pkey + _U64.pack(entry.base_offset)
    return b"s" + _U64.pack(entry.sequence)


def _decode_entry(base_offset: int, value: bytes) -> IndexEntry:
    if len(value) == _INDEX_BEFORE_SEQUENCE.size:
        return IndexEntry(base_offset, *_INDEX_BEFORE_SEQUENCE.unpack(value))
    return IndexEntry(base_offset, *_INDEX.unpack(value))


def _stored_entries(store: Store, pkey: bytes) -> list[IndexEntry]:
    """The partition's index entries as stored, in offset order."""
    prefix = b"i" + pkey
    return [_decode_entry(_U64.unpack_from(key, len(prefix))[0], value) for key, value in _prefixed(store.meta, prefix)]


class PartitionLog:
    """One partition replica: an ordered run of batches with dense offsets. Memory holds
    only the index (a few dozen bytes per batch); batch bytes stay in RocksDB."""

    def __init__(self, store: Store, topic: str, partition: int, incarnation: int) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self.pkey = partition_key(topic, partition)
        self._index_prefix = b"i" + self.pkey
        self._meta_prefix = b"m" + self.pkey
        self.incarnation = incarnation
        self.bases: list[int] = []
        self.entries: list[IndexEntry] = []
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.total_bytes = 0
        self.epochs: list[tuple[int, int]] = []  # (leader_epoch, start_offset), ascending
        self.producers = ProducerStates()
        self.high_watermark = 0
        self._checkpointed_hw = -1  # what the "h" key holds (-1: not known); an unchanged HW is not rewritten
        self._load(incarnation)

    # -- startup -------------------------------------------------------------------------
    def _load(self, incarnation: int) -> None:
        db = self.store.meta
        stored = db.get(self._meta_prefix + b"c")
        if stored is not None and _I64.unpack(stored)[0] != incarnation:
            # The topic was deleted and re-created while this node was away.
            self.wipe()
        self.store.put_meta(self._meta_prefix + b"c", _I64.pack(incarnation))
        start = db.get(self._meta_prefix + b"s")
        self.log_start_offset = _I64.unpack(start)[0] if start is not None else 0
        raw_epochs = db.get(self._meta_prefix + b"e")
        if raw_epochs:
            self.epochs = [
                _EPOCH_ENTRY.unpack_from(raw_epochs, i) for i in range(0, len(raw_epochs), _EPOCH_ENTRY.size)
            ]
        for entry in _stored_entries(self.store, self.pkey):
            self._remember(entry)
        if self.entries and self.entries[0].base_offset < self.log_start_offset:
            self.log_start_offset = self.entries[0].base_offset
        self.log_end_offset = max(self.entries[-1].next_offset if self.entries else 0, self.log_start_offset)
        hw = db.get(self._meta_prefix + b"h")
        checkpoint = _I64.unpack(hw)[0] if hw is not None else 0
        self.high_watermark = min(max(checkpoint, self.log_start_offset), self.log_end_offset)

    def _remember(self, entry: IndexEntry) -> None:
        self.bases.append(entry.base_offset)
        self.entries.append(entry)
        self.total_bytes += entry.batch_bytes
        self.producers.record(entry.producer_id, entry.producer_epoch, entry.base_sequence, entry.record_count, entry.base_offset)

    # -- writes --------------------------------------------------------------------------
    def append(
        self,
        wb: rocksdict.WriteBatch,
        data: bytes | bytearray | memoryview,
        header: batch_format.BatchHeader,
        leader_epoch: int,
        append_ms: int,
        *,
        stamp: bool = True,
    ) -> tuple[int, bytes]:
        """Stage one batch in ``wb``, stamped when leading; return its base offset and the
        bytes staged (what a leader publishes). Memory is updated at once; the caller writes
        ``wb`` before answering anyone. A failed write is fatal for the node (it exits), as
        Kafka halts on a log-dir failure, so memory never gets ahead of disk."""
        if stamp:
            base = self.log_end_offset
            stored = batch_format.stamped(data, base, leader_epoch)
        else:
            base = header.base_offset
            if base != self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"replica append at {base} but log end is {self.log_end_offset}", log_end_offset=self.log_end_offset
                )
            stored = data if isinstance(data, bytes) else bytes(data)
        meta_cf = self.store.meta_cf
        if not self.epochs or self.epochs[-1][0] < leader_epoch:
            self.epochs.append((leader_epoch, base))
            wb.put(self._meta_prefix + b"e", self._encode_epochs(), meta_cf)
        entry = IndexEntry(base, header.record_count, len(stored), header.max_timestamp, append_ms, leader_epoch,
                           header.producer_id, header.producer_epoch, header.base_sequence, self.store.take_sequence())
        wb.put(b"s" + _U64.pack(entry.sequence), stored)
        wb.put(
            self._index_prefix + _U64.pack(base),
            _INDEX.pack(entry.record_count, entry.batch_bytes, entry.max_timestamp, append_ms, leader_epoch,
                        entry.producer_id, entry.producer_epoch, entry.base_sequence, entry.sequence),
            meta_cf,
        )
        self._remember(entry)
        self.log_end_offset = entry.next_offset
        return base, stored

    def assign_epoch(self, leader_epoch: int) -> None:
        """A new leader starts its epoch at its log end (persisted before it takes writes)."""
        if self.epochs and self.epochs[-1][0] >= leader_epoch:
            return
        self.epochs.append((leader_epoch, self.log_end_offset))
        self.store.put_meta(self._meta_prefix + b"e", self._encode_epochs(), follow_fsync=True)

    def checkpoint_high_watermark(self) -> None:
        if self.high_watermark != self._checkpointed_hw:  # each second: at 2,000 partitions 10 % of an idle node
            self.store.put_meta(self._meta_prefix + b"h", _I64.pack(self.high_watermark))
            self._checkpointed_hw = self.high_watermark

    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch`` in this log, the offset where it ends here).

        It ends where the next larger epoch starts, or at the log end for the latest one;
        (-1, -1) if the log has no epoch that old (the asker must truncate everything).
        """
        found = -1
        for i, (e, _start) in enumerate(self.epochs):
            if e > epoch:
                return (found, self.epochs[i][1]) if found >= 0 else (-1, -1)
            found = e
        return (found, self.log_end_offset) if found >= 0 else (-1, -1)

    def reset_to(self, start_offset: int) -> None:
        """Drop everything and start empty at ``start_offset`` (a follower that fell below
        the leader's log start after retention)."""
        self.wipe()
        self.log_start_offset = self.log_end_offset = self.high_watermark = start_offset
        self.store.put_meta(self._meta_prefix + b"s", _I64.pack(start_offset))
        self.store.put_meta(self._meta_prefix + b"c", _I64.pack(self.incarnation))

    def _encode_epochs(self) -> bytes:
        return b"".join(_EPOCH_ENTRY.pack(e, s) for e, s in self.epochs)

    def truncate_to(self, offset: int) -> None:
        """Drop every batch that ends above ``offset`` (a batch straddling it goes whole).

        Replication truncates at batch boundaries (a leader epoch starts at a batch), so
        in practice nothing is lost that the caller did not ask to drop.
        """
        index = bisect.bisect_right(self.bases, offset - 1) if offset > 0 else 0
        if index > 0 and self.entries[index - 1].next_offset > offset:
            index -= 1
        if index >= len(self.entries):
            return
        first = self.entries[index].base_offset
        wb = self.store.new_write_batch()
        for entry in self.entries[index:]:
            wb.delete(_data_key(self.pkey, entry))
        wb.delete_range(self._index_prefix + _U64.pack(first), self._index_prefix + b"\xff" * 8 + b"\xff",
                        self.store.meta_cf)
        self.epochs = [(e, s) for e, s in self.epochs if s < first]
        wb.put(self._meta_prefix + b"e", self._encode_epochs(), self.store.meta_cf)
        self.store.write(wb)
        for entry in self.entries[index:]:
            self.total_bytes -= entry.batch_bytes
        del self.entries[index:]
        del self.bases[index:]
        self.log_end_offset = max(first, self.log_start_offset)
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        self.producers.clear()
        for entry in self.entries:
            self.producers.record(entry.producer_id, entry.producer_epoch, entry.base_sequence, entry.record_count, entry.base_offset)

    def delete_before(self, index: int) -> int:
        """Retention: delete the first ``index`` batches whole; return records deleted."""
        if index <= 0:
            return 0
        index = min(index, len(self.entries))
        new_start = self.entries[index - 1].next_offset
        wb = self.store.new_write_batch()
        # One point delete per batch: the batches of a partition are spread among every
        # other partition's in sequence order, so no key range holds only them.
        for entry in self.entries[:index]:
            wb.delete(_data_key(self.pkey, entry))
        wb.delete_range(self._index_prefix + _U64.pack(0), self._index_prefix + _U64.pack(new_start),
                        self.store.meta_cf)
        wb.put(self._meta_prefix + b"s", _I64.pack(new_start), self.store.meta_cf)
        self.store.write(wb)
        deleted = new_start - self.log_start_offset
        for entry in self.entries[:index]:
            self.total_bytes -= entry.batch_bytes
        del self.entries[:index]
        del self.bases[:index]
        self.log_start_offset = new_start
        return deleted

    def delete_below(self, offset: int) -> int:
        """Delete the batches wholly below ``offset``; return the records deleted. A follower
        so follows the leader's log start (batches are the same on every replica; our own
        retention counts from when we copied a batch, which for a replica that caught up
        late is long after the leader appended it), and a coordinator compacts."""
        index = bisect.bisect_left(self.bases, offset)
        if index > 0 and self.entries[index - 1].next_offset > offset:
            index -= 1  # a batch the offset falls inside is not ours to cut
        return self.delete_before(index)

    def apply_retention(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int:
        """Delete whole batches older than retention_ms or beyond retention_bytes (the
        rule is ``nodes.retention.batches_to_delete``). Returns the number of records deleted."""
        return self.delete_before(batches_to_delete(self.entries, self.total_bytes, retention_ms, retention_bytes, now_ms))

    def wipe(self) -> None:
        """Delete everything stored for the partition. The batches are found through the
        index as stored, not as loaded: a wipe at startup comes before the load."""
        wb = self.store.new_write_batch()
        for entry in _stored_entries(self.store, self.pkey):
            wb.delete(_data_key(self.pkey, entry))
        wb.delete_range(b"d" + self.pkey, b"d" + self.pkey + b"\xff" * 9)  # a store older than the sequence
        for prefix in (self._index_prefix, self._meta_prefix):
            wb.delete_range(prefix, prefix + b"\xff" * 9, self.store.meta_cf)
        self.store.write(wb)
        self.bases.clear()
        self.entries.clear()
        self.epochs.clear()
        self.producers.clear()
        self.total_bytes, self._checkpointed_hw = 0, -1  # the "h" key went too
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0

    # -- reads ---------------------------------------------------------------------------
    def read(self, offset: int, bytes_max: int, offset_limit: int) -> list[bytes]:
        """Batches from the one holding ``offset`` up to ``bytes_max`` (at least one batch,
        so a consumer always makes progress) and never at or above ``offset_limit``."""
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside [{self.log_start_offset}, {self.log_end_offset}]",
                log_start_offset=self.log_start_offset,
                log_end_offset=self.log_end_offset,
            )
        index = bisect.bisect_right(self.bases, offset) - 1
        if index < 0:
            index = 0
        elif self.entries[index].next_offset <= offset:
            # ``offset`` is the log end: the batch before it holds nothing at or above it.
            # Returning it would make a fetch at the end answer with old data at once
            # instead of waiting (docs/PROTOCOL.md section 5.3).
            index += 1
        out: list[bytes] = []
        total = 0
        db = self.store.db
        while index < len(self.entries):
            entry = self.entries[index]
            if entry.next_offset > offset_limit:
                break
            if out and total + entry.batch_bytes > bytes_max:
                break
            value = db.get(_data_key(self.pkey, entry))
            if value is None:
                break  # deleted by retention between the index read and now
            out.append(value)
            total += entry.batch_bytes
            index += 1
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms, or (-1, -1)."""
        for entry in self.entries:
            if entry.max_timestamp < timestamp_ms:
                continue
            value = self.store.db.get(_data_key(self.pkey, entry))
            if value is None:
                continue
            decoded = batch_format.decode_batch(value, check_crc=False)
            for i, ts in enumerate(decoded.timestamps):
                if ts >= timestamp_ms:
                    return entry.base_offset + i, ts
        return -1, -1

