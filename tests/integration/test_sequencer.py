"""The sequencer alone, on real processes: two instances, one active, failover by kill -9
and by SIGSTOP past the session; IDs never repeat and a deposed instance grants nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from kazoo.client import KazooClient

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.sequencer import Grant
from fabric.sequencer_client import SequencerClient, read_active
from fabric.transport import Connections
from tests.conftest import make_cluster

SESSION_TIMEOUT_MS = 2_000


@pytest.fixture
def sequencers(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=0, sequencer_count=2,
                           session_timeout_ms=SESSION_TIMEOUT_MS)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def zk(sequencers: LocalCluster) -> Iterator[KazooClient]:
    client = KazooClient(hosts=sequencers.zk_address)
    client.start(timeout=30)
    try:
        yield client
    finally:
        zkl.close_client(client)


class Load:
    """One thread asking for IDs back to back, keeping every grant."""

    def __init__(self, zk: KazooClient, count: int = 100) -> None:
        self.client = SequencerClient(zk, request_timeout_ms=500)
        self.count = count
        self.grants: list[Grant] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.grants.append(self.client.allocate(self.count, timeout_ms=20_000))
            except errors.SequencerNotAvailableError:
                self.failures += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.client.close()

    def wait_for_more(self, than: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.grants) <= than:
            assert time.monotonic() < deadline, "no grant within the wait"
            time.sleep(0.01)


def assert_unique_and_increasing(grants: list[Grant]) -> None:
    ids = [i for g in grants for i in range(g.first_id, g.end_id)]
    assert len(ids) == len(set(ids)), "an ID was issued twice"
    assert ids == sorted(ids), "IDs went backwards for one client"
    epochs = [g.epoch for g in grants]
    assert epochs == sorted(epochs)


def test_kill_the_active_sequencer_three_times(sequencers: LocalCluster, zk: KazooClient) -> None:
    with Load(zk) as load:
        for _ in range(3):
            load.wait_for_more(len(load.grants) + 5)
            active = sequencers.wait_for_active_sequencer()
            sequencers.sequencers[active].kill()
            sequencers.wait_for_active_sequencer(other_than=active)
            sequencers.sequencers[active].start()  # back as a standby
            load.wait_for_more(len(load.grants) + 5)
    assert load.failures == 0
    assert_unique_and_increasing(load.grants)
    assert len({g.epoch for g in load.grants}) >= 4


def test_an_instance_paused_past_its_session_grants_nothing_after_waking(
        sequencers: LocalCluster, zk: KazooClient) -> None:
    with Load(zk) as load:
        load.wait_for_more(5)
        active = sequencers.wait_for_active_sequencer()
        old = read_active(zk)
        assert old is not None
        sequencers.sequencers[active].pause()
        try:
            successor = sequencers.wait_for_active_sequencer(timeout_s=30, other_than=active)
            load.wait_for_more(len(load.grants) + 5)
            # Queue requests at the paused instance, as a leader that still had its address would.
            # No IMMEDIATE: the paused process cannot finish the ZMTP handshake, so queue.
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(old.address)
            sent = [1, 2, 3]
            for correlation_id in sent:
                sock.send_multipart(apis.encode_request(ApiKey.ALLOCATE_IDS, {"count": 10, "kind": 0}, correlation_id))
            time.sleep(0.2)
        finally:
            sequencers.sequencers[active].resume()
        answers = []
        deadline = time.monotonic() + 15
        while len(answers) < len(sent) and time.monotonic() < deadline:
            if sock.poll(200):
                answers.append(apis.decode_response(sock.recv_multipart()))
        sock.close(linger=0)
        load.wait_for_more(len(load.grants) + 5)
    assert len(answers) == len(sent)
    assert all(a.header.error_code == errors.NotActiveSequencerError.code for a in answers), answers
    assert sequencers.active_sequencer() == successor
    assert load.failures == 0
    assert_unique_and_increasing(load.grants)


def test_bad_requests_get_errors_and_the_sequencer_keeps_serving(sequencers: LocalCluster, zk: KazooClient) -> None:
    sequencers.wait_for_active_sequencer()
    active = read_active(zk)
    assert active is not None
    conns = Connections(zmq.Context.instance())
    try:
        for count, kind in ((-5, 0), (2_000_000, 0), (5, 7)):
            with pytest.raises(errors.InvalidIdCountError):
                conns.request(active.address, ApiKey.ALLOCATE_IDS, {"count": count, "kind": kind}, timeout_ms=5_000)
        with pytest.raises(errors.UnknownApiError):
            conns.request(active.address, ApiKey.METADATA, {"topics": []}, timeout_ms=5_000)
        sock = conns.socket(active.address)
        sock.send_multipart([b"garbage", b"more"])
        reply = apis.decode_response(sock.recv_multipart())
        assert reply.header.error_code == errors.InvalidMagicError.code
        grant = Grant.from_body(conns.request(active.address, ApiKey.ALLOCATE_IDS, {"count": 7, "kind": 0}).body)
        assert grant.id_count == 7 and grant.first_id >= 1 and grant.records_end == grant.end_id
        tick = Grant.from_body(conns.request(active.address, ApiKey.ALLOCATE_IDS, {"count": 2, "kind": 1}).body)
        assert tick.first_id == grant.end_id and tick.records_end == grant.end_id  # ticks do not move it
        peek = Grant.from_body(conns.request(active.address, ApiKey.ALLOCATE_IDS, {"count": 0, "kind": 0}).body)
        assert peek.id_count == 0 and peek.records_end == grant.end_id
    finally:
        conns.close()


def test_an_active_znode_a_standby_left_behind_is_removed(zk_server: LocalZooKeeper) -> None:
    """A create that timed out in a ZooKeeper pause and was applied afterwards leaves the
    active znode owned by an instance that stands by: nobody granted IDs until its session
    ended. The instance now removes it on its next try, and the try after takes over."""
    from fabric.sequencer_client import SEQUENCER_ACTIVE, SEQUENCER_ROOT
    from sequencer.service import ACTIVE, STANDBY, SequencerService

    chroot = f"{zk_server.address}/seq-left-{time.monotonic_ns()}"
    root = KazooClient(hosts=zk_server.address)
    root.start(timeout=30)
    root.ensure_path(chroot.split("/", 1)[1])
    zkl.close_client(root)
    service = SequencerService(chroot, 1, session_timeout_ms=SESSION_TIMEOUT_MS)
    service.zk.start(timeout=30)
    try:
        service.zk.ensure_path(SEQUENCER_ROOT)
        service.zk.create(SEQUENCER_ACTIVE, b"{}", ephemeral=True)  # the late create, in our session
        assert service.state == STANDBY
        service._try_become_active()  # finds it, sees it is ours, removes it
        assert service.zk.exists(SEQUENCER_ACTIVE) is None and service.state == STANDBY
        service._try_become_active()
        assert service.state == ACTIVE
        assert service.zk.exists(SEQUENCER_ACTIVE).ephemeralOwner == service.zk.client_id[0]
    finally:
        service.router.close(linger=0)
        service.ctx.term()
        zkl.close_client(service.zk)


def test_a_starting_sequencer_stops_at_once_on_sigint_or_sigterm() -> None:
    """A sequencer waiting for a ZooKeeper that does not answer ignored Ctrl-C and SIGTERM
    for the whole 30 s wait; it now stops at once, exit status 130, one line."""
    import signal
    import socket
    import sys

    from tests.integration.helpers import interrupted_start

    silent = socket.socket()  # listens, never speaks ZooKeeper
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            code, err = interrupted_start(
                [sys.executable, "-m", "sequencer", "--zk", f"127.0.0.1:{silent.getsockname()[1]}", "--id", "3",
                 "--metrics-port", "-1"], signum, str(Path(__file__).resolve().parents[2]))
            assert code == 130, err[-2000:]
            assert "fabric sequencer: sequencer 3: start interrupted" in err and "Traceback" not in err, err[-2000:]
    finally:
        silent.close()
