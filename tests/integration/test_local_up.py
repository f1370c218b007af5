"""``fabric up`` keeps the cluster running: a node killed with SIGKILL is reported and
restarted; a 3-server ZooKeeper ensemble; Ctrl-C still stops every process."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper, ManagedProcess, Supervisor

UP_TIMEOUT_S = 90.0


def test_supervisor_backs_off_and_gives_up() -> None:
    supervisor = Supervisor()
    restarts: list[float] = []
    running = False
    now = 0.0
    said: list[str] = []
    for _ in range(2000):  # a process that dies at once after every restart
        now += 0.5
        said += supervisor.check({"node 1": (running, lambda t=now: restarts.append(t), -9)}, now)
    assert len(restarts) == 5, said  # RESTARTS_MAX within the window, then it stays down
    gaps = [b - a for a, b in itertools.pairwise(restarts)]
    assert gaps == sorted(gaps), f"backoff must grow: {gaps}"
    assert "not restarting it again" in said[-1]
    assert supervisor.check({"node 2": (True, lambda: None, None)}, now) == []


def test_supervisor_restarts_a_cleanly_stopped_node_without_counting_a_crash() -> None:
    # fabric node drain ends the node with status 0: ten drains in a row are ten restarts
    # a second after each, never "given up" (before, the sixth drain left the node down).
    supervisor = Supervisor()
    restarts: list[float] = []
    now = 0.0
    for _ in range(10):
        said = supervisor.check({"node 2": (False, lambda t=now: restarts.append(t), 0)}, now)
        assert said and "stopped cleanly" in said[0]
        now += 1.0
        assert supervisor.check({"node 2": (False, lambda t=now: restarts.append(t), 0)}, now) == ["node 2 restarted"]
        now += 5.0
        assert supervisor.check({"node 2": (True, lambda: None, None)}, now) == []
    assert len(restarts) == 10 and not supervisor.given_up


def _wait_for(condition: object, what: str, proc: subprocess.Popen[str], timeout_s: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"fabric up exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_child_started_from_a_thread_outlives_that_thread(tmp_path: Path) -> None:
    # PR_SET_PDEATHSIG fires when the forking *thread* ends: a node a fault test restarted
    # from its nemesis thread got SIGTERM, drained and exited 0 as soon as that thread ended.
    child = ManagedProcess("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    starter = threading.Thread(target=child.start)
    starter.start()
    starter.join()
    try:
        time.sleep(1.0)  # the kernel signals at the thread's exit; give the child time to die of it
        assert child.running, f"the child died with the thread that started it (status {child.exit_status})"
    finally:
        child.kill()


@pytest.mark.slow
def test_wait_for_nodes_rides_out_a_lost_zookeeper_connection(tmp_path: Path) -> None:
    # A soak on a 3-server ensemble died in LocalCluster.wait_for_nodes with a bare
    # kazoo ConnectionLoss: the server its client talked to went away mid-request. Here the
    # request is held in flight (ZooKeeper stopped), then the server is killed (the
    # connection drops: ConnectionLoss) and restarted; the wait must go on and succeed.
    zookeeper = LocalZooKeeper(tmp_path / "zk")
    (tmp_path / "zk").mkdir()
    zookeeper.start()
    cluster = LocalCluster(0, tmp_path / "cluster", zk_address=zookeeper.address)

    def bounce() -> None:
        time.sleep(1.0)  # the wait is polling by now (NoNodeError: ask again)
        zookeeper.pause()  # its next get stays in flight
        time.sleep(1.0)
        zookeeper.kill()  # the connection drops under that get: ConnectionLoss
        zookeeper.start()
        cluster.nodes[1].resume()

    bouncer = threading.Thread(target=bounce)
    try:
        cluster.add_node(1, wait=False)
        cluster.nodes[1].pause()  # it cannot register until resumed
        bouncer.start()
        cluster.wait_for_nodes([1])
    finally:
        if bouncer.is_alive():
            bouncer.join(timeout=60)  # before stopping: it restarts ZooKeeper
        cluster.stop()
        zookeeper.stop()


@pytest.mark.slow
def test_fabric_up_restarts_a_killed_node_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    env = {**os.environ, "FABRIC_HOME": str(tmp_path / "home")}
    stderr_path = tmp_path / "up.err"
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "fabric", "up", "--nodes", "2", "--zk-servers", "3",
                                 "--data-dir", str(tmp_path / "data")],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    zk = None
    try:
        state = tmp_path / "home" / "local.json"
        _wait_for(state.exists, "the cluster to come up", proc)
        zk_address = json.loads(state.read_text())["zk"]
        assert zk_address.count(",") == 2, f"expected a 3-server ensemble, got {zk_address}"
        zk = zkl.make_client(zk_address)
        zk.start(timeout=30)

        def info_of(node_id: int) -> zkl.NodeInfo:
            raw, _ = zkl.get(zk, zkl.node_path(node_id))
            return zkl.NodeInfo.decode(raw)

        def pid_of(node_id: int) -> int:
            return info_of(node_id).pid

        before = info_of(1)
        victim = before.pid
        os.kill(victim, signal.SIGKILL)

        def restarted() -> bool:
            try:
                return pid_of(1) != victim
            except Exception:  # not registered yet
                return False

        _wait_for(restarted, "node 1 to be restarted", proc)
        after = info_of(1)  # on the same ports: the addresses fabric up printed stay right
        assert (after.address, after.replication_address, after.metrics_address) == \
            (before.address, before.replication_address, before.metrics_address)
        assert after.metrics_address, "fabric up's nodes serve metrics"
        said = stderr_path.read_text()
        assert "node 1 exited; restarting it" in said and "node 1 restarted" in said, said
        assert proc.poll() is None, "fabric up must keep running"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "stopped." in out
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), \
                f"child {pid} survived Ctrl-C"
    finally:
        if zk is not None:
            zkl.close_client(zk)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_fabric_up_secure_prints_the_keys_and_refuses_plaintext(tmp_path: Path) -> None:
    import queue
    import threading

    from fabric import errors
    from fabric.auth.curve import ClientSecurity
    from sdk import Admin

    env = {**os.environ, "FABRIC_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "fabric", "up", "--secure", "--nodes", "1",
                             "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue[str] = queue.Queue(maxsize=10_000)
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)  # type: ignore[union-attr]
    reader.start()
    exports: dict[str, str] = {}
    bootstrap = ""
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while "FABRIC_ZK_DIGEST_FILE" not in exports:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("fabric up --secure printed no exports in time") from None
            if line.strip().startswith("export "):
                name, _, value = line.strip()[len("export "):].partition("=")
                exports[name] = value
            elif line.startswith("bootstrap"):
                bootstrap = line.split()[1]
        security = ClientSecurity.from_files(exports["FABRIC_KEY_FILE"], exports["FABRIC_SERVER_KEY"])
        with Admin(bootstrap, security=security) as admin:
            admin.create_topic("secure-up", partitions=1, replication_factor=1)
            assert "secure-up" in admin.list_topics()
        with pytest.raises(errors.AuthenticationFailedError), Admin(bootstrap, security=None) as plain:
            plain.list_topics()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
