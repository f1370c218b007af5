"""Public blocking calls return within their documented bound while the cluster is in
trouble: every node paused (SIGSTOP), or ZooKeeper paused. A call that outlives its bound
by more than a generous margin fails the test; one that hangs is cut off by a guard.

Found by a sweep of every public call against paused nodes and a paused ZooKeeper:

* ``Consumer.poll(timeout_ms=500)`` of a group member took 10-30 s with every node
  paused: the auto commit at its start waited a whole group request (10 s) and retried
  until ``request_timeout_ms``, a heartbeat asked every node for the coordinator and then
  re-read the map, and a map re-read alone took 12 s. A poll now returns within
  ``timeout_ms`` plus ``POLL_WORK_MS`` (5 s), ``close()`` within ``request_timeout_ms``.
* ``Admin.describe_group`` took twice its ``request_timeout_ms`` (60 s at the default):
  each node asked for the coordinator got the whole timeout. Any node answers that alike,
  so each now gets a metadata request's 5 s, and the call ends within the timeout.
* The direct plane's ``subscribe()`` never returned while ZooKeeper was paused (kazoo's
  DataWatch retries its first read without limit), and ``serve()``, a first ``publish()``
  and ``services()`` raised kazoo's own ``KazooTimeoutError``; all now raise
  ``NoServiceAvailable`` within the registry's 5 s.
* A node's first strict-order partition makes its SequencerClient on the node's loop, and
  that constructor waited for ZooKeeper without limit (the same DataWatch): the loop,
  every partition the node leads, stood still until ZooKeeper came back.
* Reading the live nodes from a ``zk://`` bootstrap took 15 s with ZooKeeper paused
  (kazoo's default client waited out its 10 s connect attempt after the 5 s start had
  failed): a producer's ``close(5)`` took 10 s and left its sender thread running.
* The active sequencer took 9-10 s to exit on SIGTERM with ZooKeeper paused: it waited for
  its lease thread's ZooKeeper calls (two of 5 s each) and then 5 s more to delete its
  active znode. Its stop now waits on ZooKeeper ``SHUTDOWN_ZK_S`` (2 s) in all; the
  session timeout hands its place over when the delete cannot be made.
* A secure direct client's start (its reads and watches of principals and ACLs) had no
  bound with ZooKeeper paused right after the client connected (kazoo's first watch read
  again); it now raises ``NoServiceAvailable`` within the registry's 5 s.

One cluster with a ZooKeeper of its own (the test pauses it) and a session timeout longer
than any pause here, so nothing fails over meanwhile and each test finds it as it was.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import zmq

import sdk
from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster
from fabric.sequencer_client import SequencerClient
from sdk import Admin, Consumer, Producer
from sdk._client import BOOTSTRAP_SESSION_S, METADATA_TIMEOUT_MS, Bootstrap
from sdk.consumer import POLL_WORK_MS
from sdk.direct._registry import ZK_TIMEOUT_S
from sdk.direct._secure import DirectCredentials, DirectSecurity
from sequencer.service import SHUTDOWN_ZK_S
from tests.fault.harness import wait_until

pytestmark = pytest.mark.slow

T = TypeVar("T")
SESSION_TIMEOUT_MS = 30_000  # nodes keep their sessions through every pause below
MARGIN_S = 2.5  # on top of a documented bound: thread scheduling on a loaded machine
HANG_GUARD_S = 30.0  # a call still running this long is taken as a hang
TOPIC = "bounded"
POLL_TIMEOUT_MS = 500
AUTO_COMMIT_INTERVAL_MS = 100
REQUEST_TIMEOUT_MS = 4_000  # the group member's: close() is bounded by it
GROUP_REQUEST_MS = 10_000  # one group request's own wait (sdk._group.GROUP_REQUEST_TIMEOUT_MS), what the old poll waited


@pytest.fixture(scope="module")
def bounded_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(3, tmp_path_factory.mktemp("bounded"), session_timeout_ms=SESSION_TIMEOUT_MS,
                           sequencer_count=1)
    cluster.start()
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=2)
        yield cluster
    finally:
        cluster.stop()  # SIGCONT first: whatever a failed test left paused stops too


def timed(call: Callable[[], T]) -> tuple[float, T | BaseException]:
    """How long ``call`` took, and what it returned or raised."""
    start = time.monotonic()
    try:
        outcome: T | BaseException = call()
    except Exception as exc:
        outcome = exc
    return time.monotonic() - start, outcome


def test_group_poll_and_close_are_bounded_with_every_node_paused(bounded_cluster: LocalCluster) -> None:
    with Producer(bounded_cluster.bootstrap) as producer:
        for i in range(10):
            producer.send(TOPIC, b"record-%d" % i)
    consumer = Consumer(bounded_cluster.bootstrap, group_id="bounded-group",
                        auto_commit_interval_ms=AUTO_COMMIT_INTERVAL_MS, request_timeout_ms=REQUEST_TIMEOUT_MS)
    consumer.subscribe([TOPIC])
    read: list[object] = []

    def read_all() -> bool:
        read.extend(consumer.poll(timeout_ms=200))
        return len(read) >= 10

    # Records handed out: positions to commit, so the poll below starts with an auto commit.
    wait_until(read_all, "the member reading every record", timeout_s=60)
    admin = Admin(bounded_cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    admin.describe_group("bounded-group")  # connected to every node it asks
    described: list[tuple[float, object]] = []
    describer = threading.Thread(target=lambda: described.append(timed(lambda: admin.describe_group("bounded-group"))),
                                 name="describer", daemon=True)
    nodes = list(bounded_cluster.nodes.values())
    for node in nodes:
        node.pause()
    try:
        describer.start()
        # The last records handed out are not committed yet: the poll begins with a commit
        # to a coordinator that does not answer, then a heartbeat to it.
        time.sleep(2 * AUTO_COMMIT_INTERVAL_MS / 1000)
        poll_s, polled = timed(lambda: consumer.poll(timeout_ms=POLL_TIMEOUT_MS))
        close_s, closed = timed(consumer.close)
        describer.join(HANG_GUARD_S)
    finally:
        for node in nodes:
            node.resume()
        admin.close()
    assert not isinstance(polled, BaseException), polled
    bound_s = POLL_TIMEOUT_MS / 1000 + POLL_WORK_MS / 1000
    assert poll_s <= bound_s + MARGIN_S < GROUP_REQUEST_MS / 1000, (
        f"poll(timeout_ms={POLL_TIMEOUT_MS}) took {poll_s:.1f} s with every node paused (bound {bound_s:.1f} s)")
    assert closed is None, closed
    assert close_s <= REQUEST_TIMEOUT_MS / 1000 + MARGIN_S, (
        f"close() took {close_s:.1f} s with every node paused (bound request_timeout_ms={REQUEST_TIMEOUT_MS})")
    [(describe_s, description)] = described
    assert isinstance(description, errors.RetriableError), description  # no coordinator answered
    assert describe_s <= REQUEST_TIMEOUT_MS / 1000 + MARGIN_S, (
        f"Admin.describe_group took {describe_s:.1f} s with every node paused "
        f"(bound request_timeout_ms={REQUEST_TIMEOUT_MS})")


def test_registry_and_bootstrap_calls_are_bounded_with_zookeeper_paused(bounded_cluster: LocalCluster) -> None:
    zookeeper = bounded_cluster.zookeeper
    assert zookeeper is not None
    bootstrap_result: list[tuple[float, object]] = []

    def read_bootstrap() -> None:
        bootstrap_result.append(timed(lambda: Bootstrap(bounded_cluster.bootstrap).node_addresses()))

    async def guarded(coro: Coroutine[Any, Any, object]) -> tuple[float, object]:
        start = time.monotonic()
        try:
            # The guard only turns a hang into a failure (a TimeoutError).
            outcome: object = await asyncio.wait_for(coro, HANG_GUARD_S)
        except Exception as exc:
            outcome = exc
        return time.monotonic() - start, outcome

    def make_sequencer_client() -> object:
        made = SequencerClient(node_zk, request_timeout_ms=100)
        made.close()
        return made

    def start_direct_security() -> object:
        public_key, secret_key = zmq.curve_keypair()
        security = DirectSecurity(DirectCredentials(public_key, secret_key), node_zk, zmq.Context())
        try:
            security.start()
        finally:
            security.close()
        return security

    def stop_active_sequencer() -> object:
        """SIGTERM the active sequencer; what it exited with (its stop is timed by the caller)."""
        process = bounded_cluster.sequencers[active].process
        process.signal(signal.SIGTERM)
        while process.running:
            time.sleep(0.02)
        return process.exit_status

    async def direct_calls() -> dict[str, tuple[float, object]]:
        client = await sdk.connect(bounded_cluster.bootstrap)  # connected before the pause
        try:
            zookeeper.pause()
            try:
                reader = threading.Thread(target=read_bootstrap, name="bootstrap-reader", daemon=True)
                reader.start()
                calls = {
                    "subscribe": client.subscribe("bounded.>"),
                    "serve": client.serve("bounded-new", lambda request: request.payload),
                    "publish": client.publish("bounded.first", b"x"),
                    "services": client.services(),
                    "SequencerClient": asyncio.to_thread(make_sequencer_client),
                    "sequencer SIGTERM": asyncio.to_thread(stop_active_sequencer),
                    "secure direct start": asyncio.to_thread(start_direct_security),
                }
                results = await asyncio.gather(*(guarded(coro) for coro in calls.values()))
                await asyncio.to_thread(reader.join, HANG_GUARD_S)
            finally:
                zookeeper.resume()
            return dict(zip(calls, results, strict=True))
        finally:
            await client.close()

    active = bounded_cluster.wait_for_active_sequencer()
    node_zk = zkl.make_client(bounded_cluster.zk_address)  # as a node's, connected before the pause
    node_zk.start(timeout=30)
    try:
        direct = asyncio.run(direct_calls())
    finally:
        zkl.close_client(node_zk)
    took_s, exit_status = direct.pop("sequencer SIGTERM")
    assert exit_status == 0, f"the active sequencer's stop with ZooKeeper paused: {exit_status!r}"
    # kazoo's own close (the connection thread's current attempt) comes on top of the 2 s.
    assert took_s <= SHUTDOWN_ZK_S + 2 + MARGIN_S, f"the active sequencer took {took_s:.1f} s to stop with ZooKeeper paused"
    took_s, made = direct.pop("SequencerClient")
    assert isinstance(made, SequencerClient), f"SequencerClient() with ZooKeeper paused: {made!r}"
    assert took_s <= MARGIN_S, f"SequencerClient() took {took_s:.1f} s with ZooKeeper paused: the node's loop waits on it"
    for name, (took_s, outcome) in direct.items():
        assert isinstance(outcome, errors.NoServiceAvailable), f"{name}() with ZooKeeper paused: {outcome!r}"
        assert took_s <= ZK_TIMEOUT_S + MARGIN_S, f"{name}() took {took_s:.1f} s with ZooKeeper paused"
    [(took_s, outcome)] = bootstrap_result
    assert isinstance(outcome, errors.NoBrokersAvailableError), outcome
    bound_s = METADATA_TIMEOUT_MS / 1000 + BOOTSTRAP_SESSION_S / 3  # the start, then one connect attempt
    assert took_s <= bound_s + MARGIN_S, f"reading the bootstrap took {took_s:.1f} s with ZooKeeper paused"


def test_calls_work_again_once_resumed(bounded_cluster: LocalCluster) -> None:
    """Nothing the pauses left behind gets in the way: the same calls succeed at once."""
    with Producer(bounded_cluster.bootstrap) as producer:
        producer.send(TOPIC, b"after").result(timeout=30)
    with sdk.Client(bounded_cluster.bootstrap) as client:
        client.serve("bounded-after", lambda request: request.payload)
        assert client.request("bounded-after", b"x", timeout_ms=10_000).payload == b"x"
