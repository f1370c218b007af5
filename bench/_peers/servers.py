"""The peer servers, started by the benchmark on free loopback ports with temporary dirs.

Each server runs as a ``fabric.local.ManagedProcess``, so it dies with the benchmark even
when the benchmark is killed with SIGKILL, and ``stop()`` ends it on every exit path.
The durable settings are written here once and quoted in the report (``DURABILITY``), so
the table says what was compared.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path
from types import TracebackType

from fabric.local import ManagedProcess, free_port

SERVER_READY_TIMEOUT_S = 30.0

NATS_BINARY = "nats-server"
REDIS_BINARY = "redis-server"

# What each system was told about durability, side by side. Fabric's row is filled in by
# the benchmark from the node flags it used (see bench/peers.py FABRIC_NODE_ARGS).
DURABILITY: dict[str, str] = {
    "nats": ("JetStream file storage, 1 replica (one server). A publish is acknowledged once "
             "the server wrote it to its block file (OS page cache); fsync by the server's "
             "background timer (nats-server 2.9 has no `sync_interval` option; 2.10+ defaults "
             "it to 2 min)."),
    "redis": ("AOF on (`appendonly yes`), `appendfsync everysec`: the AOF is written to the OS "
              "before the reply, fsync once a second; RDB snapshots off."),
}


def binary_missing(system: str) -> str | None:
    """Why ``system`` cannot run here, or None when its server binary is installed."""
    binary = {"nats": NATS_BINARY, "redis": REDIS_BINARY}.get(system)
    if binary is not None and shutil.which(binary) is None:
        package = {"nats": "nats-server", "redis": "redis-server"}[system]
        return f"{binary} is not installed (apt-get install {package})"
    return None


def _wait_for_port(process: ManagedProcess, port: int, timeout_s: float = SERVER_READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.running:
            raise RuntimeError(f"{process.name} exited during start:\n{process.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{process.name} did not listen on 127.0.0.1:{port} within {timeout_s} s")


class PeerServer:
    """A server process on a free port; a context manager that always stops it."""

    name = "peer"

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir / self.name
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: ManagedProcess | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> PeerServer:
        self.process = ManagedProcess(self.name, self.argv(), self.base_dir / f"{self.name}.log")
        self.process.start()
        try:
            _wait_for_port(self.process, self.port)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def __enter__(self) -> PeerServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class NatsServer(PeerServer):
    """nats-server with JetStream on, file storage in a temporary dir."""

    name = "nats"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        config = self.base_dir / "nats.conf"
        config.write_text(
            f'listen: "127.0.0.1:{self.port}"\n'
            f'jetstream {{ store_dir: "{self.base_dir / "jetstream"}", max_file_store: 8G, max_memory_store: 256M }}\n'
            # The benchmark's bursts are larger than the default 64 MiB pending buffer per client.
            "max_pending: 256MB\n"
        )
        return [NATS_BINARY, "-c", str(config)]


class RedisServer(PeerServer):
    """redis-server with the append-only file on, fsync every second, no RDB snapshots."""

    name = "redis"

    def argv(self) -> list[str]:
        return [
            REDIS_BINARY,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.base_dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--protected-mode", "no",
            "--daemonize", "no",
        ]
