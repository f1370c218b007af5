"""Find the active sequencer through ZooKeeper and ask it for global IDs.

Lives in ``fabric`` (not ``sequencer``) because partition leaders use it and nodes may
import only ``fabric``. The ZooKeeper layout of the sequencer (docs/ZOOKEEPER.md)::

    /fabric/sequencer/active   ephemeral  {"sequencer_id", "address", "pid", "started_ms"}
    /fabric/sequencer/state    persistent {"epoch", "reserved_end"}, version-checked writes

The client watches ``active`` and follows failovers: a request that times out or is
answered NOT_ACTIVE_SEQUENCER is resent to whichever instance holds ``active`` now,
until the caller's deadline. It refuses a grant from an epoch older than one it has
already seen (a deposed instance that answered late), so its caller sees epochs only
rise.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric.protocol.apis import ApiKey
from fabric.protocol.sequencer import ID_KIND_RECORDS, Grant, check_count
from fabric.transport import FROM_ENV, Connections
from fabric.zk import ROOT

SEQUENCER_ROOT = f"{ROOT}/sequencer"
SEQUENCER_ACTIVE = f"{SEQUENCER_ROOT}/active"
SEQUENCER_STATE = f"{SEQUENCER_ROOT}/state"

ZK_CALL_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_MS_DEFAULT = 1_000
ALLOCATE_TIMEOUT_MS_DEFAULT = 10_000
RETRY_BACKOFF_S = 0.02


@dataclass(frozen=True)
class ActiveSequencer:
    sequencer_id: int
    address: str
    pid: int
    started_ms: int
    metrics_address: str = ""  # its Prometheus endpoint (sequencer/metrics.py); "" when off

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ActiveSequencer:
        data = json.loads(raw)
        return cls(int(data["sequencer_id"]), str(data["address"]), int(data["pid"]), int(data["started_ms"]),
                   str(data.get("metrics_address", "")))


def read_active(zk: KazooClient, timeout_s: float = ZK_CALL_TIMEOUT_S) -> ActiveSequencer | None:
    """The active instance as registered now, or None while there is none (or no answer
    within ``timeout_s``)."""
    try:
        raw, _ = zk.get_async(SEQUENCER_ACTIVE).get(timeout=timeout_s)
    except Exception:  # NoNodeError, connection loss, timeout: all mean "none known now"
        return None
    try:
        return ActiveSequencer.decode(raw)
    except (ValueError, KeyError):
        return None


class SequencerClient:
    """Asks the active sequencer for IDs. The object and its sockets belong to one thread;
    only the ZooKeeper watch runs on kazoo's thread, and it only swaps one reference."""

    def __init__(self, zk: KazooClient, *, context: zmq.Context[Any] | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS_DEFAULT, security: Any = FROM_ENV) -> None:
        # security: a node passes its own key on a secure cluster (the sequencer admits node keys only).
        self.zk = zk
        self.request_timeout_ms = request_timeout_ms
        self.connections = Connections(context, security=security)
        self.highest_epoch = 0
        self._active: ActiveSequencer | None = None
        self._lock = threading.Lock()
        self._closed = False
        # On a thread of kazoo's, not here: kazoo's DataWatch makes its first read on the
        # thread that creates it and retries it without limit while ZooKeeper does not
        # answer, and a node makes this client on its loop (the first strict-order
        # partition it leads), which must never wait for ZooKeeper (docs/DESIGN.md). Until
        # the watch delivers, allocate() reads the active instance itself, within its deadline.
        zk.handler.spawn(zk.DataWatch, SEQUENCER_ACTIVE, self._on_active)

    def _on_active(self, data: bytes | None, _stat: Any, _event: Any = None) -> bool | None:
        if self._closed:
            return False  # removes the watch
        active = None
        if data:
            try:
                active = ActiveSequencer.decode(data)
            except (ValueError, KeyError):
                active = None
        with self._lock:
            self._active = active
        return None

    @property
    def active(self) -> ActiveSequencer | None:
        with self._lock:
            return self._active

    def allocate(self, count: int, timeout_ms: int = ALLOCATE_TIMEOUT_MS_DEFAULT, *,
                 kind: int = ID_KIND_RECORDS) -> Grant:
        """``count`` consecutive IDs (0: none, only ``records_end``), or
        SequencerNotAvailableError after ``timeout_ms``."""
        check_count(count, allow_zero=True)
        deadline = time.monotonic() + timeout_ms / 1000.0
        self.connections.drain()  # late replies to requests we gave up on: discard
        last_problem = "no sequencer registered in ZooKeeper"
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise errors.SequencerNotAvailableError(
                    f"no grant of {count} IDs within {timeout_ms} ms: {last_problem}")
            active = self.active
            if active is None:
                # The watch may lag a reconnect. Within the caller's deadline: a node's loop
                # waits on this, and a paused ZooKeeper used to hold it for ZK_CALL_TIMEOUT_S
                # (plain topics on that node stalled for seconds with it).
                active = read_active(self.zk, timeout_s=remaining_ms / 1000.0)
                if active is None:
                    time.sleep(min(RETRY_BACKOFF_S, max(0.0, deadline - time.monotonic())))
                    continue
            try:
                # Bounded by the caller's deadline, connecting included: a paused instance
                # accepts the TCP connection but never finishes the ZeroMQ handshake.
                try_ms = max(1, min(self.request_timeout_ms, remaining_ms))
                message = self.connections.request(
                    active.address, ApiKey.ALLOCATE_IDS, {"count": count, "kind": kind},
                    timeout_ms=try_ms, wait_connect_ms=try_ms)
            except (errors.NotActiveSequencerError, errors.RequestTimedOutError, errors.NodeNotReadyError) as exc:
                last_problem = f"sequencer {active.sequencer_id} at {active.address}: {exc}"
                with self._lock:
                    if self._active == active:
                        self._active = None  # re-read ZooKeeper on the next turn
                time.sleep(RETRY_BACKOFF_S)
                continue
            grant = Grant.from_body(message.body)
            if grant.epoch < self.highest_epoch or grant.id_count != count:
                last_problem = f"refused grant {grant} (highest epoch seen {self.highest_epoch})"
                continue
            self.highest_epoch = grant.epoch
            return grant

    def close(self) -> None:
        self._closed = True
        self.connections.close()
