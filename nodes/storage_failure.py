"""When the node's storage fails: stop, in one line, and keep what is on disk.

A node whose RocksDB refuses a write (a full disk, a disk quota, a file system gone
read-only, an I/O error; or a background flush or compaction that failed, after which
RocksDB refuses every write) or fails a read (an I/O error, a checksum mismatch) stops:
fail-stop, as a Kafka broker halts when its only log directory fails, and Kafka fails the
directory on a read error as on a write error (docs/DESIGN.md, "A storage failure stops
the node"). Why not keep serving reads: the failed write's batches are already in the
partition's memory (its index, its log end), so a node that went on could acknowledge,
replicate or report what is not on its disk; and a leader that cannot write must give its
partitions up, which its ZooKeeper session ending does at once. So:

* ``nodes/log.py`` ``Store`` turns every failed write into one ``StorageError`` built
  here (``storage_error``: the RocksDB directory and the cause in words) and remembers
  it: every later write raises the same error without touching RocksDB, so a write a
  handler answered with STORAGE_ERROR still stops the node at the end of its turn;
* its reads go through ``GuardedReads``: a failed read raises a ``StorageError`` (the
  request that read gets STORAGE_ERROR, not UNKNOWN_SERVER_ERROR) and is remembered the
  same way, so the node stops at the end of that turn; an iterator that RocksDB ended on
  a failed read raises too, instead of passing for the end of the data;
* ``NodeState.write_staged`` answers the turn's staged produce requests with that error
  (retriable: producers resend to the new leader, idempotently);
* ``nodes/server.py``'s loop logs ``stop_line`` once (CRITICAL), closes its ZooKeeper
  session (its leaderships move at once) without writing anything more, and the process
  exits with ``EXIT_STORAGE_FAILED``; a node whose store fails while it starts exits the
  same way, with the same words, after closing its ZooKeeper session if it opened one
  (``nodes/session.py``, ``closed_on_failure``): a registration left behind would stay
  for the session timeout, its leaderships with it.

What is on disk stays valid (RocksDB's WAL recovery drops a torn last record, which no
one was acknowledged for); once space is freed the node starts and catches up.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

from fabric.errors import EXIT_STORAGE_FAILED, StorageError

__all__ = ["EXIT_STORAGE_FAILED", "FailingStore", "GuardedIterator", "GuardedReads", "cause_of", "read_failed", "stop_line",
           "storage_error"]

# RocksDB's status text (rocksdict raises a plain Exception carrying it) -> the cause in
# words and what the operator does about it. The strings are strerror()'s, as RocksDB
# quotes them ("IO error: No space left on device: While appending to file: ...").
_CAUSES: Final[tuple[tuple[str, str, str], ...]] = (
    ("No space left on device", "disk_full", "the disk is full (No space left on device): free space"),
    ("Disk quota exceeded", "quota", "the disk quota is used up (Disk quota exceeded): raise it or free space"),
    ("Read-only file system", "read_only", "the file system is read-only: remount it read-write"),
    ("Input/output error", "io", "the disk reports an I/O error: check the device"),
    # A checksum mismatch or a damaged file: not a condition that clears (stop_line).
    ("Corruption:", "corruption", "stored data is damaged (RocksDB found a corrupt block or file): check the device"),
)


def cause_of(status: str) -> tuple[str, str]:
    """(kind, words) for RocksDB's ``status`` text: ``disk_full``, ``quota``,
    ``read_only``, ``io``, ``corruption``, or ``other`` with the status itself."""
    for needle, kind, words in _CAUSES:
        if needle in status:
            return kind, words
    return "other", f"RocksDB: {status}"


def storage_error(path: str, exc: BaseException, *, what: str = "write") -> StorageError:
    """The one error for a failed store operation on ``path`` (the RocksDB directory)."""
    status = str(exc) or type(exc).__name__
    kind, words = cause_of(status)
    detail = f" [{status}]" if kind != "other" else ""
    return StorageError(f"storage {what} failed in {path}: {words}{detail}", path=path, cause=kind)


class FailingStore(Protocol):
    """What a failed read needs of ``nodes/log.py``'s ``Store``: where it is, and the
    failure it remembers (the node stops at the end of the turn when there is one)."""

    path: str
    failure: StorageError | None


def read_failed(store: FailingStore, exc: BaseException) -> StorageError:
    """The error for a failed read of ``store``, remembered as its failure unless an
    earlier one is: a disk that fails reads is failing, and the node stops as after a
    failed write (the first cause is the one its last line names)."""
    error = storage_error(store.path, exc, what="read")
    if store.failure is None:
        store.failure = error
    return error


class GuardedIterator:
    """A RocksDB iterator whose ``valid()`` raises the error that ended it. RocksDB ends an
    iteration on a failed read (an I/O error, a checksum mismatch) as it ends one at the end
    of the data: ``valid()`` turns False and only ``status()`` tells the two apart. Taken
    for the end, a failed read while loading a partition's index at startup gave the node
    a shorter log than it had acknowledged, and one under ``Store._last_sequence`` started
    the node's batch sequence again at 0, over batches already stored."""

    __slots__ = ("_it", "_store", "key", "next", "prev", "seek", "seek_for_prev", "seek_to_first", "seek_to_last",
                 "value")

    def __init__(self, it: Any, store: FailingStore) -> None:
        self._it = it
        self._store = store
        # RocksDB's own methods, not wrappers: a restart's index load calls them per entry.
        self.key, self.value, self.next, self.prev = it.key, it.value, it.next, it.prev
        self.seek, self.seek_for_prev, self.seek_to_first, self.seek_to_last = (
            it.seek, it.seek_for_prev, it.seek_to_first, it.seek_to_last)

    def valid(self) -> bool:
        if self._it.valid():
            return True
        try:
            self._it.status()  # raises RocksDB's status if a read ended the iteration
        except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
            raise read_failed(self._store, exc) from None
        return False


class GuardedReads:
    """A RocksDB view (the database, or one column family) whose reads fail with the
    store's ``StorageError``; everything else (writes, which ``Store._guarded`` guards,
    flushes, closing) goes to RocksDB as it is."""

    def __init__(self, view: Any, store: FailingStore) -> None:
        self._view = view
        self._store = store

    def get(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._view.get(key, *args, **kwargs)
        except Exception as exc:  # rocksdict raises plain exceptions carrying RocksDB's status
            raise read_failed(self._store, exc) from None

    def iter(self, *args: Any, **kwargs: Any) -> GuardedIterator:
        return GuardedIterator(self._view.iter(*args, **kwargs), self._store)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)


def stop_line(node_id: int, exc: StorageError) -> str:
    """The node's last word, logged once: which directory, why, what is kept, what next."""
    if exc.fields.get("cause") == "corruption":  # no cause to remove: a restart reads the same damage
        after = ("a restart may meet the same damage: check the device before starting it again "
                 "(docs/OPERATIONS.md, \"Disk full\": damaged data)")
    else:
        after = "what it stored is kept, and once the cause is gone it starts again and catches up"
    return (f"node {node_id} stops so that nothing is acknowledged from memory: {exc.message}; {after} "
            f"(exit status {EXIT_STORAGE_FAILED})")
