"""The node's rule for what it may do while ZooKeeper is away (nodes/lease.py)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from fabric import errors
from fabric import zk as zkl
from nodes.lease import CONNECTED, LEASE_FRACTION, LOST, SUSPENDED, SessionLease
from nodes.state import TURN_STALL_SUSPECT_S, NodeState


def test_connected_allows_everything_while_contact_is_fresh() -> None:
    lease = SessionLease(6.0, now=100.0)
    assert lease.within_lease(100.0 + 6.0 * LEASE_FRACTION - 0.01) and lease.replicated_writes_allowed()


def test_connected_is_not_enough_after_a_stop() -> None:
    """A process stopped past its session still reads CONNECTED after waking (kazoo's
    thread has not run yet): the monotonic clock ran on, so the lease is over."""
    lease = SessionLease(2.0, now=100.0)
    lease.contact(100.5)  # the last heartbeat answered before SIGSTOP
    woke = 100.5 + 3.0  # stopped for 1.5 session timeouts
    assert lease.state == CONNECTED
    assert not lease.within_lease(woke)
    assert "last ZooKeeper contact 3.0 s ago" in lease.describe(woke)
    lease.contact(woke + 0.1)  # a heartbeat sent after waking was answered: the session lives
    assert lease.within_lease(woke + 0.2)


def test_suspended_allows_acks1_only_until_the_session_could_have_expired() -> None:
    lease = SessionLease(6.0, now=100.0)
    lease.contact(103.0)
    lease.contact(102.0)  # an older answer never moves the lease back
    lease.set_state(SUSPENDED, 104.0)
    assert lease.within_lease(103.0 + 6.0 * LEASE_FRACTION - 0.01)
    assert not lease.within_lease(103.0 + 6.0 * LEASE_FRACTION)
    assert lease.replicated_writes_allowed()  # acks=all waits for the ISR, which cannot shrink
    lease.set_state(CONNECTED, 120.0)
    assert not lease.within_lease(120.0)  # reconnected, but nothing answered since 103.0
    lease.contact(120.0)
    assert lease.within_lease(120.0)


def test_lost_allows_neither() -> None:
    lease = SessionLease(6.0, now=0.0)
    lease.set_state(LOST, 1.0)
    assert not lease.within_lease(1.0) and not lease.replicated_writes_allowed()
    assert "lost" in lease.describe(2.0)


def test_heartbeat_interval_is_bounded() -> None:
    assert SessionLease(60.0, 0.0).heartbeat_interval_s == 1.0
    assert SessionLease(2.0, 0.0).heartbeat_interval_s == 0.5


def test_worker_runs_jobs_off_thread_and_hands_results_back() -> None:
    woken = threading.Event()
    worker = zkl.Worker(woken.set, queue_max=2)
    results: list[tuple[object, object]] = []
    try:
        gate = threading.Event()
        worker.submit(lambda: gate.wait(5) and threading.current_thread().name,
                      lambda r, e: results.append((r, e)))
        for _ in range(100):  # the worker took the first job and waits at the gate
            if worker.queued == 0:
                break
            threading.Event().wait(0.01)
        worker.submit(lambda: 1 / 0, lambda r, e: results.append((r, type(e))))
        worker.submit(lambda: 3, lambda r, e: results.append((r, e)))
        with pytest.raises(errors.NodeNotReadyError):  # bounded: the third waits, the fourth is refused
            worker.submit(lambda: 4, lambda r, e: None)
        gate.set()
        for _ in range(100):
            if len(results) == 3:
                break
            woken.wait(0.1)
            woken.clear()
            worker.run_completions()
        assert results == [("zk-worker", None), (None, ZeroDivisionError), (3, None)]
    finally:
        worker.stop()
    assert not worker._thread.is_alive()


@pytest.mark.parametrize(("hosts", "servers"), [
    ("127.0.0.1:2181", [("127.0.0.1", 2181)]),
    ("127.0.0.1:2181/fabric/prod", [("127.0.0.1", 2181)]),
    ("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4/c", [("127.0.0.1", p) for p in (1, 2, 3, 4)]),
])
def test_a_connect_attempt_waits_at_most_a_third_of_the_session(hosts: str, servers: list[tuple[str, int]]) -> None:
    """kazoo gives a connect request session_timeout / len(client.hosts) to be answered:
    with one server, the whole session, and a restarted server that answered late took it.
    The list counts as three or more, and kazoo still tries each server once per round."""
    client = zkl.make_client(hosts, session_timeout_s=6.0)
    assert len(client.hosts) == max(zkl.ZK_CONNECT_ATTEMPTS_PER_SESSION, len(servers))
    assert list(client.hosts) == servers and client.hosts[0] == servers[0]
    assert sorted((h, p) for h, _ip, p in client._connection._expand_client_hosts()) == servers  # each once
    chroot = hosts.partition("/")[2]
    assert client.chroot == (f"/{chroot}" if chroot else "")


def test_a_loop_turn_stopped_in_its_middle_is_a_stall_to_verify() -> None:
    # A SIGSTOP lands anywhere in a turn, not only in its poll: the rest of the turn, run on
    # waking, must not act as a leader before ZooKeeper confirms the session.
    node = SimpleNamespace(verify_session=False, turn_started_s=time.monotonic())
    assert not NodeState.stalled_in_turn(node)  # type: ignore[arg-type]
    node.turn_started_s = time.monotonic() - TURN_STALL_SUSPECT_S - 0.5
    assert NodeState.stalled_in_turn(node)  # type: ignore[arg-type]
    assert node.verify_session  # the next turn's session check asks ZooKeeper


def test_no_metadata_change_in_the_rest_of_a_stopped_turn() -> None:
    # The ISR check (and the controller's round) ask session_ok(): in a turn stopped in its
    # middle they must not act on what they saw before the stop (an ISR shrunk to the
    # leader alone, found by a fault hunt) until ZooKeeper has confirmed the session.
    zk_ok = threading.Event()
    zk_ok.set()
    node = SimpleNamespace(verify_session=False, session_lost=False, zk_ok=zk_ok, turn_started_s=time.monotonic())
    node.stalled_in_turn = lambda: NodeState.stalled_in_turn(node)  # type: ignore[arg-type]
    assert NodeState.session_ok(node)  # type: ignore[arg-type]
    node.turn_started_s = time.monotonic() - TURN_STALL_SUSPECT_S - 0.5
    assert not NodeState.session_ok(node)  # type: ignore[arg-type]
    assert node.verify_session
