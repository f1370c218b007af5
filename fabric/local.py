"""A local cluster of real processes: ZooKeeper from Debian's package and storage nodes.

It backs ``fabric up``, the quickstart demo, the benchmarks and the test fixtures, so a
user gets the same harness the tests use (like ``trio.testing``). Every child process is
started with PR_SET_PDEATHSIG, so it dies with its parent even when the parent is killed
with SIGKILL and cannot clean up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from kazoo.client import KazooClient

_T = TypeVar("_T")

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar",)
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
ZOOKEEPER_READY_TIMEOUT_S = 60.0
NODE_READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    # Linux only: ask the kernel to SIGTERM this child when the parent thread exits.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches only the parent


def zookeeper_available() -> bool:
    return all(os.path.exists(p) for p in ZOOKEEPER_JARS) and shutil.which("java") is not None


class ManagedProcess:
    """A child process with kill/pause/resume helpers and a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        if self.running:
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            preexec_fn=_die_with_parent,
        )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.pid

    def signal(self, signum: int) -> None:
        if self.running and self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as in a crash."""
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT_S)
        self._close_log()

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class LocalZooKeeper:
    """One ZooKeeper server on a free port with a temporary data dir (never 2181 by default)."""

    def __init__(self, base_dir: Path, port: int | None = None, tick_ms: int = 200) -> None:
        self.base_dir = base_dir
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.data_dir = base_dir / "zookeeper"
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if not zookeeper_available():
            raise RuntimeError(
                "ZooKeeper is not installed: apt-get install -y zookeeper default-jre-headless "
                "(the README's first command does this)"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg = self.base_dir / "zoo.cfg"
        cfg.write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_ms}",
                    f"dataDir={self.data_dir}",
                    f"clientPort={self.port}",
                    "clientPortAddress=127.0.0.1",
                    "admin.enableServer=false",
                    # Sessions from 2 ticks to 60 s, so tests can use short sessions.
                    f"minSessionTimeout={2 * self.tick_ms}",
                    "maxSessionTimeout=60000",
                    "4lw.commands.whitelist=ruok,srvr",
                    "",
                ]
            )
        )
        classpath = ":".join([ZOOKEEPER_CONF_DIR, *ZOOKEEPER_JARS])
        argv = [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(cfg),
        ]
        self.process = ManagedProcess("zookeeper", argv, self.base_dir / "zookeeper.log")
        self.process.start()
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + ZOOKEEPER_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and not self.process.running:
                raise RuntimeError(f"ZooKeeper exited during start:\n{self.process.log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                    sock.sendall(b"ruok")
                    if sock.recv(16) == b"imok":
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"ZooKeeper did not answer on {self.address} within {ZOOKEEPER_READY_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class LocalNode:
    """One storage node process (``python -m nodes``)."""

    def __init__(self, node_id: int, zk_address: str, base_dir: Path, extra_args: list[str] | None = None,
                 session_timeout_ms: int = 6_000, env: dict[str, str] | None = None) -> None:
        self.node_id = node_id
        self.zk_address = zk_address
        self.data_dir = base_dir / f"node{node_id}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "nodes",
            "--id",
            str(node_id),
            "--zk",
            zk_address,
            "--data-dir",
            str(self.data_dir),
            "--session-timeout-ms",
            str(session_timeout_ms),
            *(extra_args or []),
        ]
        # Extra environment, e.g. LD_PRELOAD of libfaketime for a skewed clock. (A wrapper
        # command like `faketime` would fork, and then the pid we signal is not the node's.)
        self.process = ManagedProcess(f"node{node_id}", argv, base_dir / f"node{node_id}.log",
                                      env={**os.environ, **env} if env else None)

    def start(self) -> None:
        self.process.start()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def restart(self) -> None:
        self.stop()
        self.start()


class LocalSequencer:
    """One sequencer instance process (``python -m sequencer``); one of several is active."""

    def __init__(self, sequencer_id: int, zk_address: str, base_dir: Path, session_timeout_ms: int = 6_000) -> None:
        self.sequencer_id = sequencer_id
        argv = [sys.executable, "-m", "sequencer", "--id", str(sequencer_id), "--zk", zk_address,
                "--session-timeout-ms", str(session_timeout_ms)]
        self.process = ManagedProcess(f"sequencer{sequencer_id}", argv, base_dir / f"sequencer{sequencer_id}.log")

    def start(self) -> None:
        self.process.start()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()


class LocalCluster:
    """ZooKeeper plus ``node_count`` storage nodes (and ``sequencer_count`` sequencer
    instances), all real processes on loopback."""

    def __init__(
        self,
        node_count: int = 3,
        base_dir: str | Path | None = None,
        *,
        zk_address: str | None = None,
        node_args: list[str] | None = None,
        session_timeout_ms: int = 6_000,
        chroot: str | None = None,
        sequencer_count: int = 0,
    ) -> None:
        self.sequencer_count = sequencer_count
        self.sequencers: dict[int, LocalSequencer] = {}
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="fabric-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.zookeeper: LocalZooKeeper | None = None
        self._external_zk = zk_address
        self.chroot = chroot
        self.node_count = node_count
        self.node_args = node_args or []
        self.session_timeout_ms = session_timeout_ms
        self.nodes: dict[int, LocalNode] = {}

    @property
    def zk_address(self) -> str:
        base = self._external_zk or (self.zookeeper.address if self.zookeeper else "")
        return base + (self.chroot or "")

    def start(self) -> LocalCluster:
        try:
            if self._external_zk is None:
                self.zookeeper = LocalZooKeeper(self.base_dir)
                self.zookeeper.start()
            if self.chroot:
                from kazoo.client import KazooClient

                from fabric import zk as zkl

                zk = KazooClient(hosts=self._external_zk or self.zookeeper.address)  # type: ignore[union-attr]
                zk.start(timeout=30)
                zk.ensure_path(self.chroot)
                zkl.close_client(zk)
            for node_id in range(1, self.node_count + 1):
                self.add_node(node_id, wait=False)
            self.wait_for_nodes(list(self.nodes))
            for sequencer_id in range(1, self.sequencer_count + 1):
                self.add_sequencer(sequencer_id)
            if self.sequencer_count:
                self.wait_for_active_sequencer()
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, node_id: int, *, wait: bool = True, env: dict[str, str] | None = None) -> LocalNode:
        node = LocalNode(node_id, self.zk_address, self.base_dir, self.node_args, self.session_timeout_ms, env)
        self.nodes[node_id] = node
        node.start()
        if wait:
            self.wait_for_nodes([node_id])
        return node

    def wait_for_nodes(self, node_ids: list[int], timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        """Wait until each node's process registered its current pid in ZooKeeper."""
        from kazoo.client import KazooClient

        from fabric import zk as zkl

        zk = KazooClient(hosts=self.zk_address)
        zk.start(timeout=30)
        try:
            deadline = time.monotonic() + timeout_s
            pending = set(node_ids)
            while pending:
                for node_id in list(pending):
                    node = self.nodes[node_id]
                    if not node.process.running:
                        raise RuntimeError(f"node {node_id} exited during start:\n{node.process.log_tail()}")
                    if zk.exists(zkl.node_path(node_id)):
                        raw, _ = zk.get(zkl.node_path(node_id))
                        if zkl.NodeInfo.decode(raw).pid == node.process.pid:
                            pending.discard(node_id)
                if pending:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"nodes {sorted(pending)} did not register within {timeout_s} s")
                    time.sleep(0.05)
        finally:
            zkl.close_client(zk)

    def add_sequencer(self, sequencer_id: int) -> LocalSequencer:
        sequencer = LocalSequencer(sequencer_id, self.zk_address, self.base_dir, self.session_timeout_ms)
        self.sequencers[sequencer_id] = sequencer
        sequencer.start()
        return sequencer

    def active_sequencer(self) -> int | None:
        """The id of the sequencer instance registered as active, if any."""
        return self._with_zk(lambda zk: self._read_active_id(zk))

    def wait_for_active_sequencer(self, timeout_s: float = NODE_READY_TIMEOUT_S, *,
                                  other_than: int | None = None) -> int:
        """Wait until a running sequencer instance (not ``other_than``) is registered as active."""

        def wait(zk: KazooClient) -> int:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                active = self._read_active_id(zk)
                sequencer = self.sequencers.get(active) if active is not None else None
                if active is not None and active != other_than and sequencer is not None \
                        and sequencer.process.running:
                    return active
                time.sleep(0.05)
            raise RuntimeError(f"no sequencer became active within {timeout_s} s")

        return self._with_zk(wait)

    @staticmethod
    def _read_active_id(zk: KazooClient) -> int | None:
        from fabric import sequencer_client

        active = sequencer_client.read_active(zk)
        return None if active is None else active.sequencer_id

    def _with_zk(self, action: Callable[[KazooClient], _T]) -> _T:
        from kazoo.client import KazooClient

        from fabric import zk as zkl

        zk = KazooClient(hosts=self.zk_address)
        zk.start(timeout=30)
        try:
            return action(zk)
        finally:
            zkl.close_client(zk)

    @property
    def bootstrap(self) -> str:
        """A bootstrap string for the SDK: ZooKeeper (the SDK asks it for node addresses)."""
        return f"zk://{self.zk_address}"

    def stop(self) -> None:
        for sequencer in self.sequencers.values():
            sequencer.stop()
        for node in self.nodes.values():
            node.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
