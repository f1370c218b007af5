"""A storage node's disk fills up (ENOSPC) under acks=all idempotent writes.

One node's data dir is a small tmpfs (48 MiB); two producers write incompressible 8 kB
records until RocksDB on that node refuses a write, in one run into the partition that
node leads and in the other into the partitions it follows. The node must stop in one
CRITICAL line that names its data dir and the full disk, exit with status 74
(``nodes/storage_failure.py``), no traceback; writes go on through the other nodes; a
start on the still-full disk says so in one line with the same status; after space is
freed it starts, catches up, and the history checker finds nothing acknowledged lost or
duplicated and the replicas identical. Needs root (mount); skipped otherwise.

Also: a start on a full disk says so and nothing about O_DIRECT; a store write that
fails while the node starts, after it registered, ends its ZooKeeper session before it
exits (its znode goes at once, not after the session timeout); and ``fabric up`` leaves
a node whose disk filled down, in one line, until SIGUSR1 asks it to start it again.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper
from nodes.storage_failure import EXIT_STORAGE_FAILED
from sdk import Admin, Producer
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
FILL_CHUNK_BYTES = 4096  # one page: the filler takes the last free page of the tmpfs too
LONG_SESSION_TIMEOUT_MS = 30_000  # a registration left behind would stay this long
SESSION_GONE_WITHIN_S = 2.0  # after the exit: the session was closed, not left to expire
UP_TIMEOUT_S = 120.0  # fabric up: ZooKeeper, three nodes, two sequencers
LEFT_DOWN_FOR_S = 8.0  # watched after the stop: the old policy restarted after 1 s, then 2 s, 4 s


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


def fill(directory: Path) -> Path:
    """Take every free byte of the file system of ``directory`` (a tmpfs: no reserve for root)."""
    path = directory / "filler"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk = bytes(FILL_CHUNK_BYTES)
    try:
        while True:
            os.write(fd, chunk)
    except OSError as exc:
        if exc.errno != 28:  # ENOSPC: full, as intended
            raise
    finally:
        os.close(fd)
    return path


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


@pytest.mark.parametrize("direct_io", ["auto", "on"])
def test_a_start_on_a_full_disk_says_the_disk_is_full_and_nothing_about_o_direct(
        tmp_path: Path, small_disk: Callable[[Path, str], Path], direct_io: str) -> None:
    # Before, the O_DIRECT probe's write failed with ENOSPC and the node said the file
    # system "refuses O_DIRECT writes" (auto: a log line; on: the reason it did not start).
    disk = small_disk(tmp_path / "disk", "1m")
    fill(disk)
    started = subprocess.run([sys.executable, "-m", "nodes", "--id", "1", "--zk", "127.0.0.1:1", "--data-dir",
                              str(disk / "node1"), "--direct-io", direct_io],
                             capture_output=True, text=True, timeout=START_ON_FULL_DISK_TIMEOUT_S)
    print(started.stderr)
    assert started.returncode == EXIT_STORAGE_FAILED, started.stderr
    assert f"storage open failed in {disk / 'node1' / 'rocksdb'}: the disk is full" in started.stderr
    assert "O_DIRECT" not in started.stderr and "Traceback" not in started.stderr, started.stderr


def test_a_store_failure_while_starting_ends_the_zookeeper_session(tmp_path: Path,
                                                                  small_disk: Callable[[Path, str], Path]) -> None:
    # The disk fills between RocksDB's open and the node's first write, which comes after
    # it registered (opening a hosted partition's log writes its incarnation): ZooKeeper
    # is paused while the node waits for it, the disk is filled, ZooKeeper resumes. Before,
    # the node exited 74 with its session open, and its znode stayed for the session timeout.
    (tmp_path / "zk").mkdir()
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    zookeeper.start()
    data_dir = small_disk(tmp_path / "cluster" / "node1", "16m")  # below RocksDB's WAL preallocation
    cluster = LocalCluster(1, tmp_path / "cluster", zk_address=zookeeper.address, chroot="/disk-full",
                           session_timeout_ms=LONG_SESSION_TIMEOUT_MS)
    zk = zkl.make_client(zookeeper.address + "/disk-full")
    try:
        cluster.start()
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("hosted", partitions=1, replication_factor=1)
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(10):
                producer.send("hosted", b"%d" % i, partition=0)
            producer.flush(timeout=30)
        cluster.nodes[1].stop()  # drained: its session is closed, its znode gone
        node = cluster.nodes[1]
        log_start = node.process.log_path.stat().st_size
        zookeeper.pause()
        try:
            node.start()
            wait_until(lambda: "connecting to ZooKeeper" in node.process.log_path.read_text()[log_start:],
                       "the node to open its store and wait for ZooKeeper", START_ON_FULL_DISK_TIMEOUT_S)
            fill(data_dir)
        finally:
            zookeeper.resume()
        wait_until(lambda: not node.process.running, "the node to stop on its full disk", STOP_WAIT_S)
        exited_s = time.monotonic()
        said = node.process.log_path.read_text(errors="replace")[log_start:]
        assert node.process.exit_status == EXIT_STORAGE_FAILED, said
        assert f"node 1 cannot start: storage write failed in {data_dir / 'rocksdb'}: the disk is full" in said, said
        assert "Traceback" not in said and "refuses O_DIRECT" not in said, said
        zk.start(timeout=30)
        wait_until(lambda: zk.exists(zkl.node_path(1)) is None, "node 1's znode to go",
                   LONG_SESSION_TIMEOUT_MS / 1000.0 + 10.0, interval_s=0.05)
        gone_after_s = time.monotonic() - exited_s
        print(f"node 1's znode was gone {gone_after_s:.2f} s after the exit (session timeout "
              f"{LONG_SESSION_TIMEOUT_MS / 1000.0:.0f} s)")
        assert gone_after_s < SESSION_GONE_WITHIN_S, "the node exited without closing its ZooKeeper session"
    finally:
        zkl.close_client(zk)
        keep_logs(cluster, "test_disk_full-starting")
        cluster.stop()
        zookeeper.stop()


def test_fabric_up_leaves_a_node_whose_disk_filled_down_until_sigusr1(tmp_path: Path,
                                                                     small_disk: Callable[[Path, str], Path]) -> None:
    # Before, fabric up took exit status 74 for a crash: "node 2 exited; restarting it in
    # 1 s", a restart that failed the same way, backoff, and after the sixth exit "died 6
    # times"; nothing said the disk was full.
    base = tmp_path / "up"
    data_dir = small_disk(base / "node2", "48m")
    env = {**os.environ, "FABRIC_HOME": str(tmp_path / "home")}
    out_path, err_path = tmp_path / "up.out", tmp_path / "up.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        up = subprocess.Popen([sys.executable, "-m", "fabric", "up", "--nodes", "3", "--data-dir", str(base)],
                              stdout=out, stderr=err, text=True, env=env)
    zk = None
    try:
        state = tmp_path / "home" / "local.json"
        wait_until(lambda: state.exists() or up.poll() is not None, "fabric up to start", UP_TIMEOUT_S)
        assert up.poll() is None, err_path.read_text()
        bootstrap, zk_address = (json.loads(state.read_text())[key] for key in ("bootstrap", "zk"))
        zk = zkl.make_client(zk_address)
        zk.start(timeout=30)

        def pid_of(node_id: int) -> int | None:
            try:
                raw, _ = zkl.get(zk, zkl.node_path(node_id))
            except Exception:  # not registered (now)
                return None
            return zkl.NodeInfo.decode(raw).pid

        first_pid = pid_of(2)
        with Admin(bootstrap) as admin:
            admin.create_topic("filling", partitions=1, replication_factor=3)
        fill(data_dir)
        # Node 2 leads or follows the partition: either way it writes what is sent, until
        # its WAL needs a page the disk no longer has (RocksDB may hold a few already).
        padding = random.Random(2).randbytes(VALUE_BYTES)
        with Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=5) as producer:
            deadline = time.monotonic() + STOP_WAIT_S
            while "node 2 stopped" not in err_path.read_text():
                assert time.monotonic() < deadline, f"node 2 did not stop on its full disk: {err_path.read_text()}"
                for _ in range(100):
                    producer.send("filling", padding, partition=0)
                producer.flush(timeout=60)
        time.sleep(LEFT_DOWN_FOR_S)
        said = err_path.read_text()
        print(said)
        node2_lines = [line for line in said.splitlines() if "node 2" in line]
        assert len(node2_lines) == 1, said
        assert "node 2 stopped: its disk is full or failing" in node2_lines[0] and str(data_dir) in node2_lines[0]
        assert f"kill -USR1 {up.pid}" in node2_lines[0], node2_lines[0]
        assert pid_of(2) is None, "node 2 was started again on its full disk"

        (data_dir / "filler").unlink()  # space freed; then the operator asks for the start
        up.send_signal(signal.SIGUSR1)
        wait_until(lambda: pid_of(2) not in (None, first_pid), "node 2 to start again and register", UP_TIMEOUT_S)
        said = err_path.read_text()
        assert "node 2: starting it again" in said and "node 2 restarted" in said, said
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        assert up.returncode == 0 and "stopped." in out_path.read_text()
    finally:
        if zk is not None:
            zkl.close_client(zk)
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # fabric up stops its children before it exits
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait(timeout=30)
