"""A storage node's disk fills up (ENOSPC) under acks=all idempotent writes.

One node's data dir is a small tmpfs (48 MiB); two producers write incompressible 8 kB
records until RocksDB on that node refuses a write, in one run into the partition that
node leads and in the other into the partitions it follows. The node must stop in one
CRITICAL line that names its data dir and the full disk, exit with status 74
(``nodes/storage_failure.py``), no traceback; writes go on through the other nodes; a
start on the still-full disk says so in one line with the same status; after space is
freed it starts, catches up, and the history checker finds nothing acknowledged lost or
duplicated and the replicas identical. Needs root (mount); skipped otherwise.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from nodes.storage_failure import EXIT_STORAGE_FAILED
from sdk import Producer
from tests.conftest import make_cluster
from tests.fault.harness import (
    NODE_ARGS,
    Reader,
    create_replicated_topic,
    describe,
    finish,
    keep_logs,
    wait_until,
)
from tests.fault.history import History

pytestmark = pytest.mark.slow

DISK_SIZE = "48m"  # the full node's tmpfs: fills in seconds, far below a memtable (64 MiB)
DISK_SIZE_FREED = "512m"  # "space freed": the same tmpfs, remounted larger
VALUE_BYTES = 8_000  # random bytes: lz4 cannot shrink them, so the disk fills at the send rate
WRITERS = 2
PARTITIONS = 3
STOP_WAIT_S = 60.0
ACKS_AFTER_STOP = 300  # writes acknowledged after the node stopped: the cluster went on
START_ON_FULL_DISK_TIMEOUT_S = 60.0


def mount_unavailable_reason(directory: Path) -> str | None:
    """Why a tmpfs cannot be mounted here (not root, no mount, a container without the
    capability), or None."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    directory.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(directory)],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"mount -t tmpfs failed: {probe.stderr.strip() or probe.returncode}"
    subprocess.run(["umount", str(directory)], check=True)
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[Path, str], Path]]:
    """``mount(directory, size)`` mounts (or remounts) a tmpfs there; every mount is undone
    at the end, also when the test failed (lazily: a process may still hold a file)."""
    reason = mount_unavailable_reason(tmp_path / "mount-probe")
    if reason is not None:
        pytest.skip(f"disk-full test: {reason}")
    mounted: list[Path] = []

    def mount(directory: Path, size: str) -> Path:
        if directory in mounted:
            subprocess.run(["mount", "-o", f"remount,size={size}", str(directory)], check=True)
            return directory
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], check=True)
        mounted.append(directory)
        return directory

    try:
        yield mount
    finally:
        for directory in reversed(mounted):
            subprocess.run(["umount", "-l", str(directory)], check=False)


class PaddedWriter(threading.Thread):
    """As ``harness.Writer`` (acks=all, idempotent, every outcome in the history), with
    values padded to ``VALUE_BYTES`` and sent as fast as the producer takes them."""

    def __init__(self, bootstrap: str, topic: str, partitions: list[int], history: History, label: str,
                 padding: bytes) -> None:
        super().__init__(name=f"writer-{label}", daemon=True)
        self.producer = Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                                 delivery_timeout_ms=180_000, request_timeout_ms=10_000)
        self.topic, self.partitions, self.history, self.label, self.padding = topic, partitions, history, label, padding
        self.ack_times: list[float] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            i = 0
            while not self.stop_flag.is_set():
                value = f"{self.label}-{i}-".encode() + self.padding
                self.history.record_sent(value)
                future = self.producer.send(self.topic, value, partition=self.partitions[i % len(self.partitions)])
                future.add_callback(self._callback(value))
                i += 1
                time.sleep(0.002)  # about 4 MB/s per writer: the disk fills in seconds, the rest keeps up
            self.producer.flush(timeout=180)
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc
        finally:
            self.producer.close(timeout=30)

    def _callback(self, value: bytes) -> Any:
        def done(meta: Any, exc: BaseException | None) -> None:
            if exc is None:
                self.history.record_ack(value, meta.partition, meta.offset)
                self.ack_times.append(time.monotonic())
            else:
                self.history.record_failure(value, exc)
        return done


def longest_ack_gap_s(writers: list[PaddedWriter], around_s: float) -> float:
    """The longest time without any acknowledgement in the 30 s after ``around_s``."""
    times = sorted(t for w in writers for t in w.ack_times if around_s - 1.0 <= t <= around_s + 30.0)
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_a_full_disk_stops_the_node_cleanly_and_loses_nothing(zk_server: LocalZooKeeper, tmp_path: Path, seed: int,
                                                              small_disk: Callable[[Path, str], Path], role: str) -> None:
    rng = random.Random(seed)
    victim = rng.choice([1, 2, 3])
    base = tmp_path / "cluster"
    data_dir = small_disk(base / f"node{victim}", DISK_SIZE)  # LocalNode keeps the data in base/nodeN
    cluster: LocalCluster = make_cluster(zk_server, base, node_args=NODE_ARGS)
    topic = "filling"
    try:
        cluster.start()
        create_replicated_topic(cluster.bootstrap, topic, PARTITIONS)
        leaders = {p.partition: p.leader for p in describe(cluster.bootstrap, topic).partitions}
        partitions = sorted(p for p, leader in leaders.items() if (leader == victim) == (role == "leader"))
        assert partitions, f"node {victim} has no partition as {role}: {leaders}"
        history = History()
        writers = [PaddedWriter(cluster.bootstrap, topic, partitions, history, f"w{k}", rng.randbytes(VALUE_BYTES))
                   for k in range(WRITERS)]
        reader = Reader(cluster.bootstrap, topic, PARTITIONS, history)
        for thread in (*writers, reader):
            thread.start()

        node = cluster.nodes[victim]
        wait_until(lambda: not node.process.running, f"node {victim} to stop on its full disk", STOP_WAIT_S)
        stopped_s, acked_at_stop = time.monotonic(), len(history.acked)
        log_text = node.process.log_path.read_text(errors="replace")
        critical = [line for line in log_text.splitlines() if " CRITICAL " in line]
        print(f"node {victim} ({role} of {partitions}) stopped after {acked_at_stop} acknowledged writes: {critical}")
        assert node.process.exit_status == EXIT_STORAGE_FAILED, node.process.log_tail()
        assert len(critical) == 1, node.process.log_tail()
        assert str(data_dir) in critical[0] and "the disk is full" in critical[0]
        assert "Traceback" not in log_text, node.process.log_tail()

        wait_until(lambda: len(history.acked) >= acked_at_stop + ACKS_AFTER_STOP,
                   f"{ACKS_AFTER_STOP} writes acknowledged by the other nodes")
        print(f"longest time without an acknowledgement around the stop: {longest_ack_gap_s(writers, stopped_s):.2f} s")

        # Started again on the full disk: one line, the same status, no traceback.
        started = subprocess.run([sys.executable, "-m", "nodes", "--id", str(victim), "--zk", cluster.zk_address,
                                  "--data-dir", str(data_dir)], capture_output=True, text=True,
                                 timeout=START_ON_FULL_DISK_TIMEOUT_S)
        print(f"start on the full disk: exit status {started.returncode}: {started.stderr.strip().splitlines()[-1:]}")
        assert started.returncode == EXIT_STORAGE_FAILED, started.stderr
        assert "the disk is full" in started.stderr and "Traceback" not in started.stderr, started.stderr

        small_disk(data_dir, DISK_SIZE_FREED)  # space freed: the node starts, catches up, serves
        finish(cluster, topic, PARTITIONS, history, seed, writers, [reader])  # type: ignore[arg-type]
        assert not history.failed, f"writes that failed for good: {sorted(set(history.failed.values()))}"
    finally:
        keep_logs(cluster, f"test_disk_full-{role}")
        cluster.stop()
