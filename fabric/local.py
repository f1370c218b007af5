"""A local cluster of real processes: ZooKeeper from Debian's package and storage nodes.

It backs ``fabric up``, the quickstart demo, the benchmarks and the test fixtures, so a
user gets the same harness the tests use (like ``trio.testing``). Every child process is
started with PR_SET_PDEATHSIG, so it dies with its parent even when the parent is killed
with SIGKILL and cannot clean up.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, TypeVar

from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from fabric import errors
from fabric.errors import EXIT_STORAGE_FAILED

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from fabric.local_security import LocalSecurity

_T = TypeVar("_T")

ZOOKEEPER_JARS = ("/usr/share/java/zookeeper.jar",)
# SLF4J's plain stderr logger (Debian's libslf4j-java, which ZooKeeper depends on). Without a
# binding on the classpath ZooKeeper logs nothing at all, so a server that exits at start
# (its port taken, a data dir it cannot create) left no reason in its log to report.
ZOOKEEPER_LOGGER_JAR = "/usr/share/java/slf4j-simple.jar"
ZOOKEEPER_LOG_LEVEL = "warn"  # its warnings and errors only: INFO is a dozen lines per session
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
ZOOKEEPER_READY_TIMEOUT_S = 60.0
ZOOKEEPER_READY_POLL_S = 0.1
ZOOKEEPER_CONTAINER_CHECK_INTERVAL_MS = 1_000  # how often ZooKeeper deletes empty container znodes
NODE_READY_TIMEOUT_S = 60.0
REGISTRATION_POLL_S = 0.05  # how often the wait for a node or sequencer registration asks ZooKeeper
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 30  # of a process's log, shown where it failed
SPAWN_TIMEOUT_S = 60.0  # a fork and exec on the spawner thread; far longer means that thread is stuck


PORT_FLOOR = 20_000  # free_port's lowest pick; the kernel's ephemeral range starts above it
PORT_PICKS_MAX = 200
PORT_FLOOR_ROOM = 1_000  # at least this many ports to pick from, or pick from the lower half
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
# free_port never hands out a port again until this many later picks: a port is only probed,
# not held, and is bound by its process some time after the pick. Far more picks than any
# cluster's processes make before the first of them binds (two ports per node, started at once).
PORTS_REMEMBERED = 1_024
_handed_out: deque[int] = deque(maxlen=PORTS_REMEMBERED)
_handed_out_lock = threading.Lock()


def _ephemeral_floor() -> int:
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, taken from below the kernel's ephemeral range.

    Not port 0: the kernel hands every bind(0) and every outgoing connection a port from its
    ephemeral range. A node's port from there can, once the node is gone, become another
    program's listener, and ZeroMQ sockets still reconnecting to the dead node then send
    their greeting to that program (Spark's Python-worker handshake read a ZMTP greeting as
    a length and failed the query); and before a node restarts on its port, an outgoing
    connection can hold it as its local port.

    Nor a port this process handed out lately (PORTS_REMEMBERED): the probe binds and lets
    go, so until the process it was picked for binds it, the port still probes free. A
    cluster starts its nodes at once, two ports each, and a second pick of the same port
    made one node exit with "Address already in use"."""
    ceiling = _ephemeral_floor()
    floor = PORT_FLOOR if ceiling - PORT_FLOOR >= PORT_FLOOR_ROOM else ceiling // 2  # an ephemeral range starting low
    with _handed_out_lock:
        for _ in range(PORT_PICKS_MAX):
            port = random.randrange(floor, ceiling)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _handed_out.append(port)
            return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # all picks taken: any port
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        _handed_out.append(port)
        return port


def _argv_with_ports(head: list[str], extra_args: list[str], port_flags: tuple[str, ...]) -> list[str]:
    """``head``, a free_port() for each of ``port_flags`` the caller did not pin in
    ``extra_args``, then ``extra_args`` (last, so the caller's arguments win). Called at each
    start: a restarted process may come back on other ports, as with port 0, but never on
    one from the kernel's ephemeral range."""
    pinned = {arg.split("=", 1)[0] for arg in extra_args}
    ports = [arg for flag in port_flags if flag not in pinned for arg in (flag, str(free_port()))]
    return [*head, *ports, *extra_args]


def _die_with_parent() -> None:
    # Linux only: ask the kernel to SIGTERM this child when the parent thread exits.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches only the parent


_Reply = queue.SimpleQueue[tuple[object, BaseException | None]]  # (result, error) of one spawn


class _Spawner:
    """Forks every child from one daemon thread that lives as long as this process.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process:
    a node restarted from a short-lived thread (a fault test's nemesis thread, a user's
    supervisor thread) was sent SIGTERM, drained and exited 0 the moment that thread
    ended. A daemon thread ends only with the process, so children still die with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], _Reply]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, make: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # not alive: we are a forked child
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="fabric-local-spawner",
                                                daemon=True)
                self._thread.start()
            jobs = self._jobs
        reply: _Reply = queue.SimpleQueue()
        jobs.put((make, reply))
        try:
            result, error = reply.get(timeout=SPAWN_TIMEOUT_S)
        except queue.Empty:
            raise RuntimeError(f"starting a process took over {SPAWN_TIMEOUT_S:g} s on the spawner thread") from None
        if error is not None:
            raise error
        return result  # type: ignore[return-value]

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[tuple[Callable[[], object], _Reply]]) -> None:
        while True:
            make, reply = jobs.get()
            try:
                reply.put((make(), None))
            except BaseException as exc:  # handed to the caller's thread
                reply.put((None, exc))


_SPAWNER = _Spawner()


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
        # Where this start's output begins in the log, which is appended to across restarts:
        # why this start failed is below it, an earlier run's reason above.
        self.log_start_offset = 0

    def start(self) -> None:
        if self.running:
            return
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        self.log_start_offset = self._log.seek(0, os.SEEK_END)
        log_file = self._log
        self.proc = _SPAWNER.run(lambda: subprocess.Popen(
            self.argv,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            preexec_fn=_die_with_parent,
        ))

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def exit_status(self) -> int | None:
        """The status it exited with (negative: the signal that ended it); None while it runs."""
        return None if self.proc is None else self.proc.poll()

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

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, signum: int | None = None) -> None:
        """SIGTERM (or ``signum``), then SIGKILL if it has not exited within ``timeout_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM if signum is None else signum)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = LOG_TAIL_LINES, *, this_start: bool = False) -> str:
        """The log's last ``lines``; with ``this_start``, of what the current (or last) start wrote only."""
        try:
            with open(self.log_path, "rb") as log:
                if this_start:
                    log.seek(self.log_start_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# What a Fabric process that cannot start prints as it exits (nodes/launch.py,
# sequencer/service.py): its own reason, after one of these.
START_ERROR_MARKS = ("fabric node: error: ", "fabric sequencer: error: ")
# Who the reason is about, left out: the error names the process already.
_START_ERROR_WHO = re.compile(r"^(?:node|sequencer) \d+ (?:cannot start|stopped): ")
# Its last lines are searched for that line, no more: the log is appended to across
# restarts, and an earlier run's reason must not stand in for this run's crash.
START_ERROR_LINES_SEARCHED = 5
# ZooKeeper (a JVM, logging through slf4j-simple) ends with an ERROR line, its exception's
# stack trace and "Exiting JVM with code N"; the ERROR line is searched for this far up.
JAVA_ERROR_LINES_SEARCHED = 60
_JAVA_ERROR = re.compile(r"^\[[^\]]*\] ERROR \S+ - (.*)$")
_JAVA_EXIT = "Exiting JVM with code"
_JAVA_EXCEPTION = re.compile(r"^[\w.$]+(?:Exception|Error)(?::.*)?$")


def _java_error(lines: list[str]) -> str | None:
    """The last ERROR of a JVM's log (not its "Exiting JVM" line), with the exception the
    next line names: ``Unable to access datadir, exiting abnormally: ...DatadirException: ...``."""
    window = lines[-JAVA_ERROR_LINES_SEARCHED:]
    for index in range(len(window) - 1, -1, -1):
        found = _JAVA_ERROR.match(window[index])
        if found is None or found.group(1).startswith(_JAVA_EXIT):
            continue
        following = window[index + 1] if index + 1 < len(window) else ""
        return f"{found.group(1)}: {following}" if _JAVA_EXCEPTION.match(following) else found.group(1)
    return None


def start_failure_reason(log_text: str) -> str:
    """Why a process exited before it served, in one line, from its log: the reason in a
    Fabric process's own error line near the end (``fabric node: error: node 1 cannot
    start: cannot listen on ...``, without its prefix), else a JVM's last ERROR with its
    exception (ZooKeeper), else the log's last line (a crash's exception), else that the
    log is empty."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines[-START_ERROR_LINES_SEARCHED:]):
        for mark in START_ERROR_MARKS:
            if mark in line:
                reason = line.split(mark, 1)[1]
                return _START_ERROR_WHO.sub("", reason, count=1)
    java = _java_error(lines)
    if java is not None:
        return java
    return lines[-1] if lines else "it wrote nothing to its log"


class ProcessStartError(RuntimeError):
    """A process of a local cluster (ZooKeeper server, storage node, sequencer) exited, or
    did not become ready in time, while the cluster started. ``process`` names it
    (``node 1``, ``sequencer 2``, ``zookeeper (127.0.0.1:2181)``); ``reason`` is its own
    one-line reason from its log (``start_failure_reason``); ``log_path`` its log;
    ``exit_status`` None if it still ran (it was too slow)."""

    def __init__(self, process: str, reason: str, log_path: Path, exit_status: int | None,
                 log_tail: str = "") -> None:
        self.process = process
        self.reason = reason
        self.log_path = log_path
        self.exit_status = exit_status
        self.log_tail = log_tail
        # The message keeps the log's last lines, which a test fixture's failure shows (its
        # temporary directory may be gone by the time someone reads the report); `fabric up`
        # prints ``summary`` and the path only.
        super().__init__(f"{self.summary} (log: {log_path})" + (f"\n{log_tail}" if log_tail else ""))

    @property
    def summary(self) -> str:
        """The reason without the log's path, for when that log is gone (a temporary dir)."""
        return f"{self.process} could not start: {self.reason}"

    @classmethod
    def of(cls, process: str, managed: ManagedProcess, reason: str | None = None) -> ProcessStartError:
        """The error for ``managed``: ``reason``, or (it exited) the one its log gives for this start."""
        searched = managed.log_tail(JAVA_ERROR_LINES_SEARCHED, this_start=True)
        return cls(process, reason or start_failure_reason(searched), managed.log_path, managed.exit_status,
                   "\n".join(searched.splitlines()[-LOG_TAIL_LINES:]))


class NodeStartError(ProcessStartError):
    """A node process exited before it registered in ZooKeeper (or did not register in time)."""

    def __init__(self, node_id: int, reason: str, log_path: Path, exit_status: int | None, log_tail: str = "") -> None:
        self.node_id = node_id
        super().__init__(f"node {node_id}", reason, log_path, exit_status, log_tail)

    @classmethod
    def of_node(cls, node_id: int, managed: ManagedProcess, reason: str | None = None) -> NodeStartError:
        found = ProcessStartError.of(f"node {node_id}", managed, reason)
        return cls(node_id, found.reason, found.log_path, found.exit_status, found.log_tail)


class LocalZooKeeper:
    """One ZooKeeper server on a free port with a temporary data dir (never 2181 by default).

    As a member of an ensemble (``ZooKeeperEnsemble``) it also gets a ``server_id`` (its
    ``myid``) and the ``server.N=host:peerPort:electionPort`` lines of every member.
    """

    def __init__(self, base_dir: Path, port: int | None = None, tick_ms: int = 200, *, host: str = "127.0.0.1",
                 server_id: int = 0, peers: list[str] | None = None, netns: str | None = None) -> None:
        self.base_dir = base_dir
        self.host = host
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.server_id = server_id
        self.peers = peers or []
        self.netns = netns
        suffix = f"-{server_id}" if server_id else ""
        self.name = f"zookeeper{suffix}"
        self.data_dir = base_dir / self.name
        self.cfg_path = base_dir / f"zoo{suffix}.cfg"
        self.process: ManagedProcess | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, *, wait: bool = True) -> None:
        """Start (or restart, keeping its data) the server; ``wait`` for it to serve."""
        if not zookeeper_available():
            raise RuntimeError(
                "ZooKeeper is not installed: apt-get install -y zookeeper default-jre-headless "
                "(the README's first command does this)"
            )
        if self.process is not None and self.process.running:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "admin.enableServer=false",
            # Sessions from 2 ticks to 60 s, so tests can use short sessions.
            f"minSessionTimeout={2 * self.tick_ms}",
            "maxSessionTimeout=60000",
            "4lw.commands.whitelist=ruok,srvr,mntr",  # mntr: znode and watch counts (bench.partitions_scale)
        ]
        if self.peers:
            (self.data_dir / "myid").write_text(f"{self.server_id}\n")
            # Followers get 10 ticks to connect to a leader and 5 to stay in sync with it.
            lines += ["initLimit=10", "syncLimit=5", "reconfigEnabled=false", *self.peers]
        self.cfg_path.write_text("\n".join([*lines, ""]))
        logger = [ZOOKEEPER_LOGGER_JAR] if os.path.exists(ZOOKEEPER_LOGGER_JAR) else []
        classpath = ":".join([ZOOKEEPER_CONF_DIR, *ZOOKEEPER_JARS, *logger])
        argv = [
            "java",
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={ZOOKEEPER_LOG_LEVEL}",
            # Empty container znodes (a direct-plane service name whose instances all went,
            # sdk/direct/_registry.py) are deleted within this, not the default minute.
            f"-Dznode.container.checkIntervalMs={ZOOKEEPER_CONTAINER_CHECK_INTERVAL_MS}",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.cfg_path),
        ]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns, *argv]  # exec, not fork: the pid stays the server's
        self.process = ManagedProcess(self.name, argv, self.base_dir / f"{self.name}.log")
        self.process.start()
        if wait:
            self.wait_ready()

    def mode(self) -> str:
        """``standalone``, ``leader`` or ``follower`` from the ``srvr`` command; "" if it does not serve."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                sock.sendall(b"srvr")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return ""
        for line in reply.decode(errors="replace").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""  # "This ZooKeeper instance is not currently serving requests"

    @property
    def label(self) -> str:
        """How a start error names this server: its name and client address."""
        return f"{self.name} ({self.address})"

    def ready(self) -> bool:
        """Whether it serves; ProcessStartError, with the reason from its log, if it exited."""
        if self.process is not None and not self.process.running:
            raise ProcessStartError.of(self.label, self.process)
        return self.mode() in ("standalone", "leader", "follower")

    def wait_ready(self, timeout_s: float = ZOOKEEPER_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                return
            time.sleep(ZOOKEEPER_READY_POLL_S)
        raise self.too_slow(timeout_s)

    def too_slow(self, timeout_s: float) -> RuntimeError:
        """The error for a server that still did not serve after ``timeout_s``."""
        why = f"did not serve within {timeout_s:g} s"
        if self.process is None:
            return RuntimeError(f"{self.label} {why}: it was never started")
        return ProcessStartError.of(self.label, self.process, why)

    # Fault injection, as on nodes.
    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def pause(self) -> None:
        if self.process is not None:
            self.process.pause()

    def resume(self) -> None:
        if self.process is not None:
            self.process.resume()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class ZooKeeperEnsemble:
    """``count`` ZooKeeper servers forming one quorum (a majority must run for it to serve)."""

    def __init__(self, base_dir: Path, count: int = 3, tick_ms: int = 200, *, host: str = "127.0.0.1",
                 netns: list[str | None] | None = None, hosts: list[str] | None = None) -> None:
        if count < 1:
            raise ValueError(f"a ZooKeeper ensemble needs at least 1 server, not {count}")
        hosts = hosts or [host] * count
        peer_ports = [(free_port(), free_port()) for _ in range(count)]
        peers = [f"server.{i + 1}={hosts[i]}:{p}:{e}" for i, (p, e) in enumerate(peer_ports)]
        spaces = netns or [None] * count
        self.servers = [
            LocalZooKeeper(base_dir, tick_ms=tick_ms, host=hosts[i], server_id=i + 1, peers=peers, netns=spaces[i])
            for i in range(count)
        ]

    @property
    def address(self) -> str:
        return ",".join(server.address for server in self.servers)

    def start(self, timeout_s: float = ZOOKEEPER_READY_TIMEOUT_S) -> None:
        # All at once: a server alone cannot serve until a majority has joined the election.
        for server in self.servers:
            server.start(wait=False)
        # Each turn asks every server still starting, so one that exited is reported at once,
        # not after the others' wait for a quorum it was needed for has timed out.
        deadline = time.monotonic() + timeout_s
        starting = list(self.servers)
        while starting:
            starting = [server for server in starting if not server.ready()]
            if starting and time.monotonic() > deadline:
                raise starting[0].too_slow(timeout_s)
            if starting:
                time.sleep(ZOOKEEPER_READY_POLL_S)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class LocalNode:
    """One storage node process (``python -m nodes``)."""

    def __init__(self, node_id: int, zk_address: str, base_dir: Path, extra_args: list[str] | None = None,
                 session_timeout_ms: int = 6_000, env: dict[str, str] | None = None, netns: str | None = None) -> None:
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
        ]
        self._argv_head = ["ip", "netns", "exec", netns, *argv] if netns else argv
        # `ip netns exec` enters the namespace and execs: the pid we signal stays the node's.
        self._extra_args = list(extra_args or [])
        # Extra environment, e.g. LD_PRELOAD of libfaketime for a skewed clock. (A wrapper
        # command like `faketime` would fork, and then the pid we signal is not the node's.)
        self.process = ManagedProcess(f"node{node_id}", self._argv(), base_dir / f"node{node_id}.log",
                                      env={**os.environ, **env} if env else None)

    def _argv(self) -> list[str]:
        return _argv_with_ports(self._argv_head, self._extra_args, ("--port", "--replication-port"))

    def start(self) -> None:
        if not self.process.running:
            self.process.argv = self._argv()
        self.process.start()

    def kill(self) -> None:
        self.process.kill()

    def stop(self, *, drain: bool = True) -> None:
        """A controlled shutdown (SIGTERM: leaderships move first, nodes/drain.py), or with
        ``drain=False`` an immediate clean stop (SIGINT)."""
        self.process.stop(signum=signal.SIGTERM if drain else signal.SIGINT)

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    def restart(self) -> None:
        self.stop()
        self.start()


class LocalSequencer:
    """One sequencer instance process (``python -m sequencer``); one of several is active."""

    def __init__(self, sequencer_id: int, zk_address: str, base_dir: Path, session_timeout_ms: int = 6_000,
                 extra_args: list[str] | None = None) -> None:
        self.sequencer_id = sequencer_id
        self._argv_head = [sys.executable, "-m", "sequencer", "--id", str(sequencer_id), "--zk", zk_address,
                           "--session-timeout-ms", str(session_timeout_ms)]
        self._extra_args = list(extra_args or [])
        self.process = ManagedProcess(f"sequencer{sequencer_id}", self._argv(), base_dir / f"sequencer{sequencer_id}.log")

    def _argv(self) -> list[str]:
        return _argv_with_ports(self._argv_head, self._extra_args, ("--port",))

    def start(self) -> None:
        if not self.process.running:
            self.process.argv = self._argv()
        self.process.start()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop()

    def pause(self) -> None:
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()


RESTART_DELAY_S = 1.0  # the first automatic restart of a dead node waits this long ...
RESTART_DELAY_MAX_S = 30.0  # ... doubling per crash up to this
RESTARTS_MAX = 5  # automatic restarts after crashes within RESTART_WINDOW_S; the next crash is left down
RESTART_WINDOW_S = 300.0
MIB = 1024 * 1024


class Supervisor:
    """Restarts dead child processes with exponential backoff, a bounded number of times.

    ``fabric up`` calls ``check()`` once a second: a node (or ZooKeeper server) that died
    is reported, restarted after RESTART_DELAY_S (doubling up to RESTART_DELAY_MAX_S), and
    restarted at most RESTARTS_MAX times for crashes within RESTART_WINDOW_S (the crash
    after that is left down). A process that exited
    with status 0 stopped cleanly (``fabric node drain``, a SIGTERM): it is restarted after
    RESTART_DELAY_S and not counted as a crash, so rehearsing rolling restarts does not use
    up the crash budget. A process that exited with EXIT_STORAGE_FAILED (74, EX_IOERR: its
    disk is full or failing, ``nodes/storage_failure.py``) is left down at once and said so
    in one line, as systemd does with ``RestartPreventExitStatus=74``: a restart would fail
    the same way until someone frees space. ``start_again()`` (``fabric up``: SIGUSR1) is
    the operator's ``systemctl start``: it restarts whatever was left down. Processes
    stopped on purpose (``LocalCluster.stop_node``) are left alone. The clock is a
    parameter, so the policy is testable without sleeping.
    """

    def __init__(self) -> None:
        self.crashes: dict[str, list[float]] = {}
        self.due: dict[str, float] = {}  # name -> when to restart it
        self.given_up: set[str] = set()
        # How the operator starts a process left down again; ``fabric up`` names its signal.
        self.start_again_how = "restart it"

    def check(self, processes: dict[str, tuple[bool, Callable[[], None], int | None]],
              now: float | None = None, data_dirs: dict[str, Path] | None = None) -> list[str]:
        """``processes``: name -> (running, restart, exit status or None); ``data_dirs``:
        name -> where it keeps its data, named when its storage failed. Returns what
        happened, one line each."""
        now = time.monotonic() if now is None else now
        said: list[str] = []
        for name, (running, restart, status) in processes.items():
            if running or name in self.given_up:
                if running:
                    self.due.pop(name, None)
                continue
            if name not in self.due and status == 0:
                self.due[name] = now + RESTART_DELAY_S
                said.append(f"{name} stopped cleanly (exit status 0: drained or told to stop); "
                            f"restarting it in {RESTART_DELAY_S:.0f} s")
                continue
            if name not in self.due and status == EXIT_STORAGE_FAILED:
                self.given_up.add(name)
                said.append(self._storage_failed(name, (data_dirs or {}).get(name)))
                continue
            if name not in self.due:
                recent = [t for t in self.crashes.get(name, []) if now - t < RESTART_WINDOW_S]
                recent.append(now)
                self.crashes[name] = recent
                if len(recent) > RESTARTS_MAX:
                    self.given_up.add(name)
                    said.append(f"{name} died {len(recent)} times within {RESTART_WINDOW_S:.0f} s; "
                                f"not restarting it again (its log says why; {self.start_again_how} "
                                f"once that is fixed)")
                    continue
                delay = min(RESTART_DELAY_S * 2 ** (len(recent) - 1), RESTART_DELAY_MAX_S)
                self.due[name] = now + delay
                said.append(f"{name} exited; restarting it in {delay:.0f} s "
                            f"(restart {len(recent)} of at most {RESTARTS_MAX} within {RESTART_WINDOW_S:.0f} s)")
                continue
            if now >= self.due[name]:
                del self.due[name]
                try:
                    restart()
                except Exception as exc:  # a restart that fails counts as the next crash
                    said.append(f"{name} did not restart: {exc}")
                    continue
                said.append(f"{name} restarted")
        return said

    def _storage_failed(self, name: str, data_dir: Path | None) -> str:
        """The one line for a process that stopped on a storage failure: what, where, what next."""
        where, free = "its data dir", ""
        if data_dir is not None:
            where = str(data_dir)
            with contextlib.suppress(OSError):  # gone, or unmounted: the line says the rest
                usage = shutil.disk_usage(data_dir)
                free = f"; {usage.free // MIB:,} MiB of {usage.total // MIB:,} MiB free there now"
        return (f"{name} stopped: its disk is full or failing (exit status {EXIT_STORAGE_FAILED}, storage failure "
                f"in {where}{free}; its log says which); not restarting it, it would fail the same way. Free space "
                f"there (or fix the disk), then {self.start_again_how}: it keeps its data and catches up")

    def start_again(self, now: float | None = None) -> list[str]:
        """Restart, at the next ``check()``, every process left down (a storage failure or
        too many crashes), with a fresh crash budget; returns one line each."""
        now = time.monotonic() if now is None else now
        names = sorted(self.given_up)
        for name in names:
            self.given_up.discard(name)
            self.crashes.pop(name, None)
            self.due[name] = now
        return [f"{name}: starting it again" for name in names]


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
        zk_servers: int = 1,
        sequencer_count: int = 0,
        secure: bool = False,
        stable_ports: bool = False,
    ) -> None:
        # stable_ports: each node gets its client and replication ports once and keeps them
        # when it is restarted (`fabric up`: the addresses it printed, which C clients and
        # tools are given, stay right); otherwise a node picks free ones at every start.
        self.stable_ports = stable_ports
        self.secure = secure  # CURVE, ACLs and ZooKeeper digest ACLs (fabric/local_security.py)
        self.security: LocalSecurity | None = None
        self.sequencer_count = sequencer_count
        self.sequencers: dict[int, LocalSequencer] = {}
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="fabric-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.zookeeper: LocalZooKeeper | None = None  # a single server (zk_servers=1)
        self.ensemble: ZooKeeperEnsemble | None = None  # or an ensemble (zk_servers>1)
        if zk_servers < 1:
            raise ValueError(f"zk_servers must be at least 1, not {zk_servers}")
        self.zk_servers = zk_servers
        self.supervisor = Supervisor()
        self._stopped_on_purpose: set[int] = set()
        self._external_zk = zk_address
        self.chroot = chroot
        self.node_count = node_count
        self.node_args = node_args or []
        self.session_timeout_ms = session_timeout_ms
        self.nodes: dict[int, LocalNode] = {}

    @property
    def zk_address(self) -> str:
        base = self._external_zk or (self.zookeeper.address if self.zookeeper else "")
        if self.ensemble is not None:
            base = self.ensemble.address
        return base + (self.chroot or "")

    def start(self) -> LocalCluster:
        try:
            if self._external_zk is None and self.zk_servers > 1:
                self.ensemble = ZooKeeperEnsemble(self.base_dir, self.zk_servers)
                self.ensemble.start()
            elif self._external_zk is None:
                self.zookeeper = LocalZooKeeper(self.base_dir)
                self.zookeeper.start()
            if self.chroot:
                from fabric import zk as zkl

                zk = zkl.make_client(self.zk_address.removesuffix(self.chroot))
                zk.start(timeout=30)
                try:
                    zkl.ensure_path(zk, self.chroot)
                finally:
                    zkl.close_client(zk)
            if self.secure:
                from fabric.local_security import LocalSecurity

                self.security = LocalSecurity.create(self.base_dir / "security", self.zk_address)
            for node_id in range(1, self.node_count + 1):
                self.add_node(node_id, wait=False)
            self.wait_for_nodes(list(self.nodes))
            for sequencer_id in range(1, self.sequencer_count + 1):
                self.add_sequencer(sequencer_id)
            if self.sequencer_count:
                self.wait_for_active_sequencer(starting=True)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self, node_id: int, *, wait: bool = True, env: dict[str, str] | None = None,
                 netns: str | None = None, extra_args: list[str] | None = None) -> LocalNode:
        """Start node ``node_id``; ``netns`` runs it inside that network namespace (give it a
        ``--host`` reachable there in ``extra_args``)."""
        secure_args = self.security.node_args(node_id) if self.security is not None else []
        port_args = ["--port", str(free_port()), "--replication-port", str(free_port())] if self.stable_ports else []
        if self.stable_ports and "--metrics-port" not in [*self.node_args, *(extra_args or [])]:
            port_args += ["--metrics-port", str(free_port())]  # scrape targets stay right across restarts
        node = LocalNode(node_id, self.zk_address, self.base_dir,
                         [*self.node_args, *secure_args, *port_args, *(extra_args or [])], self.session_timeout_ms, env, netns)
        self.nodes[node_id] = node
        node.start()
        if wait:
            self.wait_for_nodes([node_id])
        return node

    def wait_for_nodes(self, node_ids: list[int], timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        """Wait until each node's process registered its current pid in ZooKeeper."""
        from fabric import zk as zkl

        pending = set(node_ids)

        def registered(zk: KazooClient) -> bool | None:
            for node_id in list(pending):
                node = self.nodes[node_id]
                if not node.process.running:
                    raise NodeStartError.of_node(node_id, node.process)
                try:
                    raw, _ = zkl.get(zk, zkl.node_path(node_id))
                except (NoNodeError, errors.RequestTimedOutError, ConnectionLoss, SessionExpiredError):
                    # Not yet, or ZooKeeper is slow, between leaders, or the server we talk to
                    # went away (an ensemble member restarting: kazoo moves to another): ask again.
                    continue
                if zkl.NodeInfo.decode(raw).pid == node.process.pid:
                    pending.discard(node_id)
            return True if not pending else None

        def too_slow() -> NodeStartError:
            late = sorted(pending)
            others = f" (nor did nodes {late[1:]})" if len(late) > 1 else ""
            return NodeStartError.of_node(late[0], self.nodes[late[0]].process,
                                          f"did not register in ZooKeeper within {timeout_s:g} s{others}")

        self._with_zk(lambda zk: self._poll_registration(zk, registered, timeout_s, too_slow))

    def add_sequencer(self, sequencer_id: int) -> LocalSequencer:
        secure_args = self.security.sequencer_args() if self.security is not None else []
        sequencer = LocalSequencer(sequencer_id, self.zk_address, self.base_dir, self.session_timeout_ms, secure_args)
        self.sequencers[sequencer_id] = sequencer
        sequencer.start()
        return sequencer

    def active_sequencer(self) -> int | None:
        """The id of the sequencer instance registered as active, if any."""
        return self._with_zk(lambda zk: self._read_active_id(zk))

    def wait_for_active_sequencer(self, timeout_s: float = NODE_READY_TIMEOUT_S, *,
                                  other_than: int | None = None, starting: bool = False) -> int:
        """Wait until a running sequencer instance (not ``other_than``) is registered as active.
        ``starting`` (the cluster's start): every instance was just started, so one that
        exited could not start, and ProcessStartError says why (as a timeout does)."""

        def active(zk: KazooClient) -> int | None:
            if starting:
                for sequencer_id in sorted(self.sequencers):
                    process = self.sequencers[sequencer_id].process
                    if not process.running:
                        raise ProcessStartError.of(f"sequencer {sequencer_id}", process)
            found = self._read_active_id(zk)
            sequencer = self.sequencers.get(found) if found is not None else None
            if found is not None and found != other_than and sequencer is not None and sequencer.process.running:
                return found
            return None

        def too_slow() -> RuntimeError:
            why = f"no sequencer became active within {timeout_s:g} s"
            if starting and self.sequencers:
                first_id = min(self.sequencers)
                return ProcessStartError.of(f"sequencer {first_id}", self.sequencers[first_id].process, why)
            return RuntimeError(why)

        return self._with_zk(lambda zk: self._poll_registration(zk, active, timeout_s, too_slow))

    @staticmethod
    def _poll_registration(zk: KazooClient, probe: Callable[[KazooClient], _T | None], timeout_s: float,
                           failure: Callable[[], RuntimeError]) -> _T:
        """The one wait-for-registration loop (nodes and sequencers): ask ``probe`` every
        50 ms until it returns a value; raises ``failure()`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = probe(zk)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise failure()
            time.sleep(REGISTRATION_POLL_S)

    @staticmethod
    def _read_active_id(zk: KazooClient) -> int | None:
        from fabric import sequencer_client

        active = sequencer_client.read_active(zk)
        return None if active is None else active.sequencer_id

    def _with_zk(self, action: Callable[[KazooClient], _T]) -> _T:
        from fabric import zk as zkl

        zk = zkl.make_client(self.zk_address)
        zk.start(timeout=30)
        try:
            return action(zk)
        finally:
            zkl.close_client(zk)

    @property
    def bootstrap(self) -> str:
        """A bootstrap string for the SDK: ZooKeeper (the SDK asks it for node addresses)."""
        return f"zk://{self.zk_address}"

    def zookeeper_servers(self) -> list[LocalZooKeeper]:
        """The ZooKeeper servers this cluster started (none with an external ZooKeeper)."""
        if self.ensemble is not None:
            return list(self.ensemble.servers)
        return [self.zookeeper] if self.zookeeper is not None else []

    def stop_node(self, node_id: int) -> None:
        """Stop a node on purpose: supervision leaves it stopped until ``start_node``."""
        self._stopped_on_purpose.add(node_id)
        self.nodes[node_id].stop()

    def start_node(self, node_id: int) -> None:
        self._stopped_on_purpose.discard(node_id)
        self.nodes[node_id].start()

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart whatever died (nodes, sequencers, ZooKeeper servers) by the Supervisor's policy;
        returns one line per event for the caller to print."""
        processes: dict[str, tuple[bool, Callable[[], None], int | None]] = {}
        data_dirs = {f"node {node_id}": node.data_dir for node_id, node in self.nodes.items()}
        for server in self.zookeeper_servers():
            if server.process is not None:
                processes[server.name] = (server.process.running, functools.partial(server.start, wait=False),
                                          server.process.exit_status)
        for node_id, node in self.nodes.items():
            if node_id not in self._stopped_on_purpose:
                processes[f"node {node_id}"] = (node.process.running, node.start, node.process.exit_status)
        for sequencer_id, sequencer in self.sequencers.items():
            processes[f"sequencer {sequencer_id}"] = (sequencer.process.running, sequencer.start,
                                                      sequencer.process.exit_status)
        return self.supervisor.check(processes, now, data_dirs)

    def stop(self) -> None:
        for sequencer in self.sequencers.values():
            sequencer.stop()
        for node in self.nodes.values():
            node.stop(drain=False)  # the whole cluster goes: no leadership to hand over
        for server in self.zookeeper_servers():
            server.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
