"""The node's ZooKeeper session: registration, session state, pause detection, stepping down.

Kazoo calls ``on_zk_state`` and ``on_routing_change`` on its own thread: they only flip
flags on the ``NodeState`` and wake the loop. The loop then calls ``check`` first thing
every turn, which decides, in one place, what a lost, reconnected or doubtful session
means, by the rule in ``nodes/lease.py``: SUSPENDED stops metadata changes and, once the
lease has run out, acks=0/1 writes and METADATA answers (acks=all goes on while the ISR
holds); LOST steps down from every leadership and re-registers once kazoo has a new
session; a turn that starts late (the process was stopped) confirms the session with
ZooKeeper before anything is answered. Whatever waits for ZooKeeper (registering again,
confirming the session, re-reading the routing map) runs on the ZooKeeper worker, never
in the loop; a heartbeat keeps the lease's last contact fresh.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any, Final

from kazoo.client import KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

import fabric
from fabric import errors
from fabric import zk as zkl
from nodes import metrics, roles, starting
from nodes.lease import CONNECTED, LOST, SUSPENDED
from nodes.log import PartitionLog
from nodes.state import NodeState

log = logging.getLogger("fabric.node")

# The process's start, not this registration's: a node that registers again after its
# session expired has not restarted (`fabric status` shows its uptime from this).
PROCESS_STARTED_MS: Final[int] = int(time.time() * 1000)

REGISTER_WAIT_S = 30.0  # how long a restarted node waits for its old session's znode to expire
PAUSE_SUSPECT_S = 1.0  # a loop turn this late means we were paused: check the session first


# -- kazoo's thread ------------------------------------------------------------------------
def on_routing_change(node: NodeState, what: str) -> None:
    node.routing_dirty = True
    if what in ("nodes", "controller") or what.startswith("partition:"):
        node.controller_dirty = True
    node.wake()


def on_zk_state(node: NodeState, state: str) -> None:
    # Runs on kazoo's thread: only flip flags and wake the loop.
    now = time.monotonic()
    if state == KazooState.CONNECTED:
        node.zk_ok.set()
        node.lease.set_state(CONNECTED, now)
        # Renew the lease at once with a fresh round trip (the state alone proves nothing
        # about when the server last heard us); a heartbeat lost with the old connection
        # must not hold the next one back.
        node.heartbeat_round += 1
        node.heartbeat_sent_s = 0.0
        node.heartbeat_due_s = 0.0
        record_session(node)
    else:
        node.zk_ok.clear()
        if state == KazooState.LOST:
            node.session_lost = True
            node.lease.set_state(LOST, now)
        else:
            node.lease.set_state(SUSPENDED, now)
            log.warning("ZooKeeper connection lost: acks=0/1 writes for %.1f s more, acks=all while the ISR "
                        "holds, no metadata changes", max(0.0, node.lease.lease_end_s() - now))
    node.wake()


def record_session(node: NodeState) -> None:
    """Write the ZooKeeper session id and password to the data dir (mode 0600).

    Operators can see which session a node holds; fault tests use it to expire the
    session from outside, as kazoo's own test harness does (``expire_session``).
    """
    try:
        session_id, password = node.zk.client_id
    except (TypeError, ValueError):
        return
    path = os.path.join(node.config.data_dir, "zk_session.json")
    with node.session_file_lock:  # kazoo's thread and ours may both get here
        tmp = path + ".tmp"
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(f'{{"session_id": "{session_id:x}", "password": "{password.hex()}"}}')
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not record the ZooKeeper session: %s", exc)


# A node's first connection waits longer than a client's (fabric.zk.ZK_START_TIMEOUT_S): a
# cluster's nodes are often started with their ZooKeeper, which may still be loading.
ZK_START_TIMEOUT_S = 30.0


# A node that stops, or whose start failed, waits this long for ZooKeeper to confirm the
# end of its session (a round trip, normally milliseconds); past it the process exits anyway
# and its znode stays until the session times out, as after a crash. kazoo alone would
# wait 10 s or the session timeout, whichever is longer, with ZooKeeper unreachable.
CLOSE_SESSION_TIMEOUT_S: Final[float] = 2.0


# -- the loop thread -----------------------------------------------------------------------
@contextlib.contextmanager
def closed_on_failure(node: NodeState, timeout_s: float = CLOSE_SESSION_TIMEOUT_S) -> Iterator[None]:
    """Around the start: if it fails (a store write that fails on a nearly full disk once the
    node has registered, ZooKeeper errors, Ctrl-C), end the ZooKeeper session before the
    failure goes on to exit the process, as a clean stop does. Otherwise the node's znode,
    its controllership and its leaderships would stay for the session timeout, and nobody
    could take them over meanwhile."""
    try:
        yield
    except BaseException:
        close_within(node, timeout_s)
        raise


def close_within(node: NodeState, timeout_s: float = CLOSE_SESSION_TIMEOUT_S) -> bool:
    """End the ZooKeeper session, waiting at most ``timeout_s`` for it; False if it did not end."""
    node.routing.close()  # its watches must not read again as the session ends (a warning each)
    if zkl.close_client_within(node.zk, timeout_s):
        return True
    log.warning("ZooKeeper did not confirm the end of the session within %.0f s: this node's registration "
                "stays until the session times out (%.0f s)", timeout_s, node.config.session_timeout_ms / 1000.0)
    return False


def start(node: NodeState) -> None:
    """Connect, register and read the world, before the loop serves anyone."""
    node.zk.add_listener(lambda state: on_zk_state(node, state))
    log.info("connecting to ZooKeeper at %s (waiting up to %.0f s)", node.config.zk, ZK_START_TIMEOUT_S)
    starting.start_zookeeper(node, ZK_START_TIMEOUT_S)  # requests meanwhile: NODE_NOT_READY
    node.zk_ok.set()
    record_session(node)
    zkl.ensure_layout(node.zk)  # retried through a connection lost while starting
    reconcile_local_data(node)
    node.routing.start()
    node.metrics = metrics.serve(node)  # before register(), which publishes its address
    sent = time.monotonic()
    register(node)
    node.lease.contact(sent)  # answered: the server heard us at or after ``sent``


def node_info(node: NodeState) -> zkl.NodeInfo:
    """This node's registration: where to reach it, since when, and which release it runs."""
    return zkl.NodeInfo(node_id=node.node_id, address=node.address, replication_address=node.replication_address,
                        host=node.config.host, pid=os.getpid(), started_ms=PROCESS_STARTED_MS,
                        metrics_address=node.metrics.address if node.metrics is not None else "",
                        version=fabric.__version__)


def register(node: NodeState) -> None:
    info = node_info(node)
    deadline = time.monotonic() + REGISTER_WAIT_S
    while True:
        try:
            zkl.create(node.zk, zkl.node_path(node.node_id), info.encode(), ephemeral=True, makepath=True)
            return
        except NodeExistsError:
            # Our previous incarnation's session has not expired yet; it will.
            try:
                _, stat = zkl.get(node.zk, zkl.node_path(node.node_id))
                if stat.owner_session_id == node.zk.client_id[0]:
                    return
            except NoNodeError:
                continue
            if time.monotonic() > deadline:
                raise errors.ConfigError(
                    f"node id {node.node_id} is registered by another live process (its ZooKeeper session "
                    f"outlived {REGISTER_WAIT_S:.0f} s of waiting): each node needs an id of its own") from None
            # Before the loop runs (start() only): requests meanwhile are answered NODE_NOT_READY.
            starting.refuse_for(node, 0.2, "waiting for its previous ZooKeeper session to expire")


def reconcile_local_data(node: NodeState) -> None:
    """At startup, wipe partitions whose topic was deleted (or re-created) while away, and
    copies of partitions this node no longer hosts: a replica removed by a reassignment (or
    a move cancelled) while it was down. A running node wipes those when the change reaches
    it (nodes/roles.py); a restarted one never opens them, so they would stay for ever."""
    topics: dict[str, zkl.TopicConfig] = {}
    for name in zkl.get_children(node.zk, zkl.TOPICS):
        try:
            raw, _ = zkl.get(node.zk, zkl.topic_path(name))
        except NoNodeError:
            continue
        topics[name] = zkl.TopicConfig.decode(raw)
    stale: list[tuple[str, int, str]] = []
    for topic, partition in node.store.partitions():
        config = topics.get(topic)
        if config is None or partition >= config.partitions:
            stale.append((topic, partition, "deleted partition"))
            continue
        try:
            raw, _ = zkl.get(node.zk, zkl.partition_path(topic, partition))
        except NoNodeError:
            continue  # not written yet (a topic being created): leave it
        state = zkl.PartitionState.decode(partition, raw)
        if node.node_id not in state.replicas:  # replicas include those being added or removed
            stale.append((topic, partition, f"partition now on nodes {list(state.replicas)}"))
    for topic, partition, why in stale:
        log.info("wiping local data of %s/%d: %s", topic, partition, why)
        PartitionLog(node.store, topic, partition, incarnation=-1).wipe()


def note_turn(node: NodeState, now: float, last_turn: float, timeout_ms: int) -> None:
    """Pause detection: a turn that starts much later than the poll allowed means we were stopped
    (within a turn: ``NodeState.stalled_in_turn``)."""
    node.turn_started_s = now
    if now - last_turn > PAUSE_SUSPECT_S + timeout_ms / 1000.0:
        # We were stopped (SIGSTOP, a long GC, a swapped-out host): the world may
        # have moved on. Answer nobody until ZooKeeper confirms our session.
        log.warning("loop stalled for %.1f s; verifying the ZooKeeper session", now - last_turn)
        node.verify_session = True


def check(node: NodeState, now: float) -> None:
    """Act on the session's state; run first every turn, before any request is handled."""
    heartbeat(node, now)
    if node.session_lost:
        roles.step_down_everywhere(node, "ZooKeeper session lost")
        node.is_controller = False
        if node.zk_ok.is_set() and "session" not in node.jobs:
            # kazoo reconnected with a new session: register again and re-read
            # everything, on the worker; until then this node leads nothing.
            _submit_session_job(node, lambda: register_again(node), lambda r, e: registered_again(node, e))
        return
    if node.verify_session and node.zk_ok.is_set() and "session" not in node.jobs:
        _submit_session_job(node, lambda: owns_session(node), lambda r, e: session_verified(node, r, e))
        return
    if node.routing.needs_resync and node.session_ok():
        node.resync_soon()


def heartbeat(node: NodeState, now: float) -> None:
    """Keep the lease fresh: a cheap request whose answer proves the server heard us."""
    lease = node.lease
    if node.heartbeat_sent_s and now - node.heartbeat_sent_s > lease.session_timeout_s:
        node.heartbeat_sent_s = 0.0  # lost with a dropped connection: send another
    if lease.state != CONNECTED or node.heartbeat_sent_s or now < node.heartbeat_due_s:
        return
    node.heartbeat_sent_s = sent = now
    node.heartbeat_due_s = now + lease.heartbeat_interval_s
    round_ = node.heartbeat_round

    def answered(result: Any) -> None:  # on kazoo's thread: a float and a flag
        if result.successful():
            lease.contact(sent)
        if node.heartbeat_round == round_:  # not one from before a reconnection
            node.heartbeat_sent_s = 0.0
        node.wake()  # acks=1 writes refused past the lease may go on now

    node.zk.exists_async(zkl.node_path(node.node_id)).rawlink(answered)


def _submit_session_job(node: NodeState, job: Any, done: Any) -> None:
    try:
        node.zk_worker.submit(job, done)
    except errors.NodeNotReadyError:
        return  # the worker is full: the next turn tries again
    node.jobs.add("session")


def register_again(node: NodeState) -> None:
    """On the worker, after a lost session: one attempt to register (the loop retries)."""
    info = node_info(node)
    try:
        zkl.create(node.zk, zkl.node_path(node.node_id), info.encode(), ephemeral=True, makepath=True)
    except NodeExistsError:
        _, stat = zkl.get(node.zk, zkl.node_path(node.node_id))
        if stat.owner_session_id != node.zk.client_id[0]:
            raise errors.NodeNotReadyError("our previous session's znode has not expired yet") from None
    node.routing.resync()


def registered_again(node: NodeState, error: BaseException | None) -> None:
    node.jobs.discard("session")
    if error is not None:
        log.warning("registering again after a lost session failed (will retry): %s", error)
        return
    log.info("registered again with a new ZooKeeper session")
    node.session_lost = False
    node.verify_session = False
    node.routing_dirty = True
    node.controller_dirty = True


def owns_session(node: NodeState) -> bool:
    """On the worker: is our ephemeral znode still ours? Then re-read the routing map."""
    _, stat = zkl.get(node.zk, zkl.node_path(node.node_id))
    if stat.owner_session_id != node.zk.client_id[0]:
        return False
    node.routing.resync()
    return True


def session_verified(node: NodeState, owned: Any, error: BaseException | None) -> None:
    node.jobs.discard("session")
    if error is not None:  # expired session, connection loss, timeout: all mean "not sure"
        log.warning("session check failed: %s: %s", type(error).__name__, error)
        owned = False
    if owned:
        node.verify_session = False
        node.routing_dirty = True
        # Deaf since the stall until now (nothing answered while unconfirmed): followers'
        # lag is counted from here, not through our own pause (leader.isr_change).
        node.listening_since_s = time.monotonic()
    else:
        roles.step_down_everywhere(node, "could not confirm our ZooKeeper session after a stall")
