"""The partition log on RocksDB: one value per batch, keyed by partition and base offset.

One RocksDB per node holds every hosted partition. Keys (all integers big-endian so that
RocksDB's byte order is numeric order)::

    b"d" + pkey + u64 base_offset   the batch bytes exactly as stamped by the leader
    b"i" + pkey + u64 base_offset   index entry: record_count, batch bytes, max timestamp,
                                    append time, leader epoch (read at startup, never the batch)
    b"m" + pkey + b"s"              log start offset (survives retention deleting everything)
    b"m" + pkey + b"c"              topic incarnation (created_ms): data of a deleted and
                                    re-created topic of the same name is wiped, never served
    b"m" + pkey + b"e"              leader-epoch history: (epoch, start offset) pairs
    b"m" + pkey + b"h"              high-watermark checkpoint (a lower bound after a restart)

where ``pkey = topic UTF-8 + b"\\x00" + u32 partition`` (topic names cannot hold NUL).

A batch and its index entry go in one WriteBatch, so they appear together or not at all,
and RocksDB's WAL makes an acknowledged write survive a SIGKILL of the process even
without fsync (the WAL is in the OS page cache before put() returns); fsync is only
needed against power loss or a kernel crash.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

import rocksdict

from fabric.errors import OffsetOutOfRangeError, StorageError
from fabric.protocol import batch as batch_format
from nodes.producer_state import ProducerStates
from nodes.retention import batches_to_delete

_U64 = struct.Struct(">Q")
# record_count, batch_bytes, max_timestamp, append_ms, leader_epoch, producer_id, producer_epoch, base_sequence
_INDEX = struct.Struct("<iiqqiqhi")
_I64 = struct.Struct("<q")
_EPOCH_ENTRY = struct.Struct("<iq")


def partition_key(topic: str, partition: int) -> bytes:
    return topic.encode("utf-8") + b"\x00" + struct.pack(">I", partition)


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

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


class Store:
    """The node's one RocksDB, opened in raw mode (bytes keys and values, no pickling)."""

    def __init__(self, path: str, *, fsync: str = "none") -> None:
        if fsync not in ("none", "interval", "every-batch"):
            raise ValueError(f"fsync must be none, interval or every-batch, got {fsync!r}")
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_max_background_jobs(2)
        self.db = rocksdict.Rdict(path, options)
        self.fsync = fsync
        self.write_options = rocksdict.WriteOptions()
        self.write_options.sync = fsync == "every-batch"

    def new_write_batch(self) -> rocksdict.WriteBatch:
        return rocksdict.WriteBatch(raw_mode=True)

    def write(self, wb: rocksdict.WriteBatch) -> None:
        try:
            self.db.write(wb, self.write_options)
        except Exception as exc:  # rocksdict raises plain exceptions for I/O failures
            raise StorageError(f"RocksDB write failed: {exc}") from exc

    def sync_wal(self) -> None:
        self.db.flush_wal(True)

    def close(self) -> None:
        try:
            self.db.flush_wal(True)
        finally:
            self.db.close()


class PartitionLog:
    """One partition replica: an ordered run of batches with dense offsets.

    Memory holds only the index (a few dozen bytes per batch); batch bytes stay in RocksDB.
    """

    def __init__(self, store: Store, topic: str, partition: int, incarnation: int) -> None:
        self.store = store
        self.topic = topic
        self.partition = partition
        self.pkey = partition_key(topic, partition)
        self._data_prefix = b"d" + self.pkey
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
        self._load(incarnation)

    # -- startup -------------------------------------------------------------------------
    def _load(self, incarnation: int) -> None:
        db = self.store.db
        stored = db.get(self._meta_prefix + b"c")
        if stored is not None and _I64.unpack(stored)[0] != incarnation:
            # The topic was deleted and re-created while this node was away.
            self.wipe()
        db.put(self._meta_prefix + b"c", _I64.pack(incarnation))
        start = db.get(self._meta_prefix + b"s")
        self.log_start_offset = _I64.unpack(start)[0] if start is not None else 0
        raw_epochs = db.get(self._meta_prefix + b"e")
        if raw_epochs:
            self.epochs = [
                _EPOCH_ENTRY.unpack_from(raw_epochs, i) for i in range(0, len(raw_epochs), _EPOCH_ENTRY.size)
            ]
        it = db.iter()
        it.seek(self._index_prefix)
        plen = len(self._index_prefix)
        while it.valid():
            key = it.key()
            if not key.startswith(self._index_prefix):
                break
            base = _U64.unpack_from(key, plen)[0]
            self._remember(IndexEntry(base, *_INDEX.unpack(it.value())))
            it.next()
        del it
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
        buf: bytearray,
        header: batch_format.BatchHeader,
        leader_epoch: int,
        append_ms: int,
        *,
        stamp: bool = True,
    ) -> int:
        """Stamp (when leading) and stage one batch in ``wb``; return its base offset.

        Memory is updated at once; the caller writes ``wb`` before answering anyone. A
        failed write is fatal for the node (it exits), as Kafka halts on a log-dir failure,
        so memory never gets ahead of disk in a process that keeps serving.
        """
        if stamp:
            base = self.log_end_offset
            batch_format.stamp(buf, base, leader_epoch)
        else:
            base = header.base_offset
            if base != self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"replica append at {base} but log end is {self.log_end_offset}", log_end_offset=self.log_end_offset
                )
        if not self.epochs or self.epochs[-1][0] < leader_epoch:
            self.epochs.append((leader_epoch, base))
            wb.put(self._meta_prefix + b"e", self._encode_epochs())
        entry = IndexEntry(base, header.record_count, len(buf), header.max_timestamp, append_ms, leader_epoch,
                           header.producer_id, header.producer_epoch, header.base_sequence)
        key = _U64.pack(base)
        wb.put(self._data_prefix + key, bytes(buf))
        wb.put(
            self._index_prefix + key,
            _INDEX.pack(entry.record_count, entry.batch_bytes, entry.max_timestamp, append_ms, leader_epoch,
                        entry.producer_id, entry.producer_epoch, entry.base_sequence),
        )
        self._remember(entry)
        self.log_end_offset = entry.next_offset
        return base

    def assign_epoch(self, leader_epoch: int) -> None:
        """A new leader starts its epoch at its log end (persisted before it takes writes)."""
        if self.epochs and self.epochs[-1][0] >= leader_epoch:
            return
        self.epochs.append((leader_epoch, self.log_end_offset))
        self.store.db.put(self._meta_prefix + b"e", self._encode_epochs(), self.store.write_options)

    def checkpoint_high_watermark(self) -> None:
        self.store.db.put(self._meta_prefix + b"h", _I64.pack(self.high_watermark))

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
        self.store.db.put(self._meta_prefix + b"s", _I64.pack(start_offset))
        self.store.db.put(self._meta_prefix + b"c", _I64.pack(self.incarnation))

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
        wb.delete_range(self._data_prefix + _U64.pack(first), self._data_prefix + b"\xff" * 8 + b"\xff")
        wb.delete_range(self._index_prefix + _U64.pack(first), self._index_prefix + b"\xff" * 8 + b"\xff")
        self.epochs = [(e, s) for e, s in self.epochs if s < first]
        wb.put(self._meta_prefix + b"e", self._encode_epochs())
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
        wb.delete_range(self._data_prefix + _U64.pack(0), self._data_prefix + _U64.pack(new_start))
        wb.delete_range(self._index_prefix + _U64.pack(0), self._index_prefix + _U64.pack(new_start))
        wb.put(self._meta_prefix + b"s", _I64.pack(new_start))
        self.store.write(wb)
        deleted = new_start - self.log_start_offset
        for entry in self.entries[:index]:
            self.total_bytes -= entry.batch_bytes
        del self.entries[:index]
        del self.bases[:index]
        self.log_start_offset = new_start
        return deleted

    def apply_retention(self, retention_ms: int, retention_bytes: int, now_ms: int) -> int:
        """Delete whole batches older than retention_ms or beyond retention_bytes (the
        rule is ``nodes.retention.batches_to_delete``). Returns the number of records deleted."""
        return self.delete_before(batches_to_delete(self.entries, self.total_bytes, retention_ms, retention_bytes, now_ms))

    def wipe(self) -> None:
        wb = self.store.new_write_batch()
        for prefix in (self._data_prefix, self._index_prefix, self._meta_prefix):
            wb.delete_range(prefix, prefix + b"\xff" * 9)
        self.store.write(wb)
        self.bases.clear()
        self.entries.clear()
        self.epochs.clear()
        self.producers.clear()
        self.total_bytes = 0
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
            value = db.get(self._data_prefix + _U64.pack(entry.base_offset))
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
            value = self.store.db.get(self._data_prefix + _U64.pack(entry.base_offset))
            if value is None:
                continue
            decoded = batch_format.decode_batch(value, check_crc=False)
            for i, ts in enumerate(decoded.timestamps):
                if ts >= timestamp_ms:
                    return entry.base_offset + i, ts
        return -1, -1

