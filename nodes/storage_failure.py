"""When the node's storage fails: stop, in one line, and keep what is on disk.

A node whose RocksDB refuses a write (a full disk, a disk quota, a file system gone
read-only, an I/O error; or a background flush or compaction that failed, after which
RocksDB refuses every write) stops: fail-stop, as a Kafka broker halts when its only log
directory fails (docs/DESIGN.md, "A storage failure stops the node"). Why not keep
serving reads: the failed write's batches are already in the partition's memory (its
index, its log end), so a node that went on could acknowledge, replicate or report what
is not on its disk; and a leader that cannot write must give its partitions up, which its
ZooKeeper session ending does at once. So:

* ``nodes/log.py`` ``Store`` turns every failed write into one ``StorageError`` built
  here (``storage_error``: the RocksDB directory and the cause in words) and remembers
  it: every later write raises the same error without touching RocksDB, so a write a
  handler answered with STORAGE_ERROR still stops the node at the end of its turn;
* ``NodeState.write_staged`` answers the turn's staged produce requests with that error
  (retriable: producers resend to the new leader, idempotently);
* ``nodes/server.py``'s loop logs ``stop_line`` once (CRITICAL), closes its ZooKeeper
  session (its leaderships move at once) without writing anything more, and the process
  exits with ``EXIT_STORAGE_FAILED``; a node whose store fails while it starts exits the
  same way, with the same words.

What is on disk stays valid (RocksDB's WAL recovery drops a torn last record, which no
one was acknowledged for); once space is freed the node starts and catches up.
"""

from __future__ import annotations

from typing import Final

from fabric.errors import StorageError

# sysexits.h EX_IOERR: a supervisor can tell a storage failure from a crash (systemd:
# RestartPreventExitStatus=74), since restarting on a full disk fails the same way.
EXIT_STORAGE_FAILED: Final[int] = 74

# RocksDB's status text (rocksdict raises a plain Exception carrying it) -> the cause in
# words and what the operator does about it. The strings are strerror()'s, as RocksDB
# quotes them ("IO error: No space left on device: While appending to file: ...").
_CAUSES: Final[tuple[tuple[str, str, str], ...]] = (
    ("No space left on device", "disk_full", "the disk is full (No space left on device): free space"),
    ("Disk quota exceeded", "quota", "the disk quota is used up (Disk quota exceeded): raise it or free space"),
    ("Read-only file system", "read_only", "the file system is read-only: remount it read-write"),
    ("Input/output error", "io", "the disk reports an I/O error: check the device"),
)


def cause_of(status: str) -> tuple[str, str]:
    """(kind, words) for RocksDB's ``status`` text: ``disk_full``, ``quota``,
    ``read_only``, ``io``, or ``other`` with the status itself."""
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


def stop_line(node_id: int, exc: StorageError) -> str:
    """The node's last word, logged once: which directory, why, what is kept, what next."""
    return (f"node {node_id} stops so that nothing is acknowledged from memory: {exc.message}; what it stored "
            f"is kept, and once the cause is gone it starts again and catches up (exit status {EXIT_STORAGE_FAILED})")
