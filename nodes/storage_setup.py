"""Opening the node's store: its data directory, then RocksDB, with or without O_DIRECT.

The node's ``direct_io`` option: when it is on, memtable flushes and compactions write
their table files with O_DIRECT; the write-ahead log and all reads still go through the
page cache. Why (docs/DESIGN.md, "Table files past the page cache"): a node that stores
every byte it takes writes it twice, once to the WAL and once to a table file at the next
flush, and the second copy is of no use in the page cache (readers of the tail are served
from the memtable). Buffered, that copy grows the page cache by the whole ingest rate. On
this project's benchmark VMs every page of memory the guest touches for the first time
costs about 10 us in the hypervisor, and the flush thread spent most of its time there:
node CPU per stored byte doubled once a few hundred MB had been written
(docs/BENCHMARKS.md, "Flushes past the page cache").

``auto`` (the default) probes the RocksDB directory: file systems without O_DIRECT (tmpfs
on older kernels, some FUSE and network file systems, macOS) keep buffered writes. ``on``
refuses to start where the probe fails, rather than have RocksDB fail its first flush.
A probe that fails because the disk is full (or over quota, read-only, failing) says
nothing about O_DIRECT: ``auto`` then stays quiet and lets RocksDB's open report the
cause, ``on`` reports it itself, both as the storage failure they are (exit status 74).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import tempfile
from typing import Final

from fabric.errors import ConfigError, StorageError
from nodes.log import Store
from nodes.state import NodeConfig
from nodes.storage_failure import storage_error

MODES = ("auto", "on", "off")
PROBE_BYTES = 4096  # one aligned block: what O_DIRECT needs at least, on any device here
# Failures of the probe that are the disk's, not O_DIRECT's: the probe cannot tell whether
# O_DIRECT would work, and RocksDB will meet the same failure.
STORAGE_ERRNOS: Final[frozenset[int]] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})

log = logging.getLogger("fabric.node")


def open_store(config: NodeConfig) -> Store:
    """The node's RocksDB in ``data_dir/rocksdb``, made first if missing. The probe runs in
    that directory, not in ``data_dir``: an operator may have mounted or linked it
    elsewhere, and the table files go where it is."""
    path = os.path.join(config.data_dir, "rocksdb")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"data_dir {config.data_dir!r} cannot be a directory: {exc.strerror}") from None
    direct_io = use_direct_io(config.direct_io, path)
    try:
        return Store(path, fsync=config.fsync, direct_io=direct_io)
    except StorageError:
        raise  # a read or write of the opening store failed: already in words (nodes/storage_failure.py)
    except Exception as exc:  # rocksdict raises a plain Exception carrying RocksDB's status
        if "lock" in str(exc).lower():  # "IO error: While lock file: .../LOCK: Resource temporarily unavailable"
            raise ConfigError(f"data_dir {config.data_dir!r} is in use by another process (RocksDB's LOCK file "
                              "is held): each node needs a data_dir of its own") from None
        raise storage_error(path, exc, what="open") from None  # a full disk says so (nodes/storage_failure.py)


def supported(directory: str) -> bool:
    """True if a file in ``directory`` opens with O_DIRECT and takes an aligned write.
    Some file systems accept the flag at open and refuse the write, so both are tried.
    Raises the ``OSError`` when it is the disk's (``STORAGE_ERRNOS``: a full disk refuses
    the write whatever the flag), not an answer about O_DIRECT."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        handle, path = tempfile.mkstemp(prefix=".direct-io-probe-", dir=directory)
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise
        return False
    os.close(handle)
    buffer = mmap.mmap(-1, PROBE_BYTES)  # page-aligned, as O_DIRECT wants
    try:
        fd = os.open(path, os.O_WRONLY | flag)
        try:
            return os.write(fd, buffer) == PROBE_BYTES
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise
        return False
    finally:
        buffer.close()
        os.unlink(path)


def use_direct_io(mode: str, directory: str) -> bool:
    """The node's ``direct_io`` setting resolved against its data directory."""
    if mode not in MODES:
        raise ConfigError(f"direct_io must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return False
    try:
        works = supported(directory)
    except OSError as exc:  # the disk's failure: "refuses O_DIRECT" would send the reader the wrong way
        if mode == "on":
            raise storage_error(directory, exc, what="open") from None
        log.debug("O_DIRECT probe in %r failed (%s): the store's open will say why", directory, exc.strerror)
        return False
    if works:
        log.info("table files (flushes, compactions) are written with O_DIRECT")
        return True
    if mode == "on":
        raise ConfigError(f"direct_io = on, but the file system of {directory!r} refuses O_DIRECT writes "
                          f"(use auto or off)")
    log.info("%r refuses O_DIRECT writes: table files go through the page cache", directory)
    return False
