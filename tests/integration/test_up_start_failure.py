"""``fabric up`` whose node cannot start says why in one line, the node's own reason, and
exits 1 (docs/PROTOCOL.md section 13). OPERATIONS' sample node1.toml sets ``host`` to an
address of another machine; `fabric up` keeps ``host``, so its node cannot listen there.
A ZooKeeper server or a sequencer that cannot start is the same ProcessStartError, with
the reason from its own log, and what started before it is stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fabric.local import LocalZooKeeper, ProcessStartError
from tests.conftest import make_cluster

REPO = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 60.0  # ZooKeeper's start and one node's failure take about 2 s; a hang is what this catches
NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_a_node_that_cannot_listen_fails_fabric_up_in_one_clean_line(tmp_path: Path) -> None:
    config = tmp_path / "node1.toml"
    config.write_text(f'host = "{NOT_HERE}"\nlog_format = "json"\n')  # json: its lines were pasted into the error
    data_dir = tmp_path / "data"
    env = {**os.environ, "FABRIC_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)}
    env.pop("FABRIC_DEBUG", None)
    done = subprocess.run([sys.executable, "-m", "fabric", "up", "--nodes", "1", "--config", str(config),
                           "--data-dir", str(data_dir)],
                          env=env, capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"fabric: error: node 1 could not start: cannot listen on tcp://{NOT_HERE}:"), lines[0]
    assert "Cannot assign requested address" in lines[0]
    assert lines[0].endswith(f"(log: {data_dir / 'node1.log'})"), lines[0]
    assert "internal error" not in done.stderr and "RuntimeError" not in done.stderr and '"ts"' not in done.stderr
    assert not (tmp_path / "home" / "local.json").exists()  # nothing recorded: there is no cluster


def test_a_zookeeper_whose_port_is_taken_says_so_from_its_log(tmp_path: Path) -> None:
    # It exited with nothing in its log (no SLF4J binding), and the error pasted that log
    # under "ZooKeeper exited during start": `fabric up` printed "internal error RuntimeError".
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = LocalZooKeeper(tmp_path, port=port)
        try:
            with pytest.raises(ProcessStartError) as caught:
                server.start()
        finally:
            server.stop()
    error = caught.value
    assert error.summary == (f"zookeeper (127.0.0.1:{port}) could not start: Unexpected exception, exiting "
                             "abnormally: java.net.BindException: Address already in use"), error.summary
    assert error.log_path == tmp_path / "zookeeper.log" and error.exit_status == 1
    assert server.process is not None and not server.process.running


def test_a_sequencer_that_cannot_start_fails_the_cluster_start_at_once(zk_server: LocalZooKeeper,
                                                                       tmp_path: Path) -> None:
    # `fabric up --config` with session_timeout_ms = 700: a node takes it, the sequencer
    # (1 s at least) exits at its argument check; the start waited 60 s for an active one.
    cluster = make_cluster(zk_server, tmp_path, nodes=0, sequencer_count=2, session_timeout_ms=700)
    with pytest.raises(ProcessStartError) as caught:
        cluster.start()
    error = caught.value
    which = error.process.removeprefix("sequencer ")  # whichever exited first: both do
    assert which in ("1", "2") and error.log_path == tmp_path / f"sequencer{which}.log", error
    assert error.summary == (f"sequencer {which} could not start: argument --session-timeout-ms: 700 outside "
                             "[1000, 600000] (see `fabric sequencer --help`)"), error.summary
    assert error.exit_status == 2
    assert not any(sequencer.process.running for sequencer in cluster.sequencers.values())
