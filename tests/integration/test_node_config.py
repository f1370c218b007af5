"""A real node takes its options from a TOML file and the environment, and logs JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from fabric import zk as zkl
from fabric.local import LocalZooKeeper
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.conftest import make_cluster

ROOT = Path(__file__).resolve().parents[2]


def test_node_from_toml_file_logs_json(zk_server: LocalZooKeeper, tmp_path: Path, topic_name: str) -> None:
    config_file = tmp_path / "node.toml"
    # metrics_host: the endpoint on another loopback address than the node's host (127.0.0.1).
    config_file.write_text('[node]\nfsync = "interval"\nfsync_interval_ms = 200\nlog_format = "json"\n'
                           'log_level = "INFO"\nmetrics_host = "127.0.0.2"\n')
    cluster = make_cluster(zk_server, tmp_path / "cluster", nodes=1, node_args=["--config", str(config_file)])
    cluster.start()
    try:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(topic_name, partitions=1, replication_factor=1)
        with Producer(cluster.bootstrap) as producer:
            producer.send(topic_name, b"hello").result(30)
        with Consumer(cluster.bootstrap) as consumer:
            consumer.assign([TopicPartition(topic_name, 0)])
            assert [r.value for r in consumer.poll(timeout_ms=5000)] == [b"hello"]
        zk = zkl.make_client(cluster.zk_address)
        zk.start(timeout=30)
        try:
            metrics_url = zkl.live_nodes(zk)[1].metrics_address
        finally:
            zkl.close_client(zk)
        assert metrics_url.startswith("http://127.0.0.2:"), metrics_url
        with urllib.request.urlopen(metrics_url, timeout=10) as answer:
            assert b"fabric_requests_total" in answer.read()
    finally:
        cluster.stop()
    lines = [line for line in (tmp_path / "cluster" / "node1.log").read_text().splitlines() if line.startswith("{")]
    assert lines, "the node wrote no JSON log lines"
    records = [json.loads(line) for line in lines]
    assert all(r["process"] == "node1" and r["node"] == 1 and r["level"] for r in records)
    assert any('metrics_host="127.0.0.2" (file)' in r["msg"] for r in records)


def test_bad_option_stops_the_node_with_a_clear_message(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FABRIC_NODE_FSYNC_INTERVAL_MS": "soon"}
    result = subprocess.run([sys.executable, "-m", "nodes", "--id", "1", "--zk", "127.0.0.1:1",
                             "--data-dir", str(tmp_path / "d")], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 2
    assert "environment FABRIC_NODE_FSYNC_INTERVAL_MS: fsync_interval_ms must be an integer (ms), got 'soon'" \
        in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "d").exists()


def test_fabric_up_refuses_a_bad_config_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "node.toml"
    bad.write_text("fsync = \"sometimes\"\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FABRIC_HOME": str(tmp_path / "home")}
    result = subprocess.run([sys.executable, "-m", "fabric", "up", "--config", str(bad)], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "fsync must be one of none, interval, every-batch" in result.stderr
    assert "Traceback" not in result.stderr and "starting" not in result.stdout


def _node(tmp_path: Path, zk: str, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "nodes", "--id", "7", "--zk", zk, *flags], env=env,
                          capture_output=True, text=True, timeout=90, check=False)


def test_a_node_that_cannot_start_says_why_in_one_line(zk_server: LocalZooKeeper, tmp_path: Path) -> None:
    """Past option checking, a node may still fail to start: each cause is one line
    naming it, exit status 1, no traceback, and a missing key file stops it before it
    creates its data dir."""
    import socket

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        cases = [
            (["--data-dir", str(a_file)], "data_dir"),
            (["--data-dir", str(tmp_path / "d1"), "--port", str(taken.getsockname()[1])], "cannot listen on"),
            (["--data-dir", str(tmp_path / "d2"), "--host", "192.0.2.1"], "cannot listen on"),
            (["--data-dir", str(tmp_path / "d3"), "--security", "curve"], "key"),
        ]
        for flags, text in cases:
            result = _node(tmp_path, zk_server.address, *flags, "--metrics-port", "-1")
            assert result.returncode == 1, (flags, result.stderr[-2000:])
            assert "fabric node: error: node 7 cannot start" in result.stderr and text in result.stderr, result.stderr
            assert "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "d3").exists()  # the key check came first
    finally:
        taken.close()


def test_a_starting_node_stops_at_once_on_sigint_or_sigterm(tmp_path: Path) -> None:
    """A node waiting for a ZooKeeper that does not answer (up to 30 s) ignored Ctrl-C and
    SIGTERM until that wait ended; it now stops at once, exit status 130, one line."""
    import signal
    import socket

    from tests.integration.helpers import interrupted_start

    silent = socket.socket()  # listens, never speaks ZooKeeper: the session never starts
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            code, err = interrupted_start(
                [sys.executable, "-m", "nodes", "--id", "7", "--zk", f"127.0.0.1:{silent.getsockname()[1]}",
                 "--data-dir", str(tmp_path / f"d{signum}"), "--metrics-port", "-1"], signum, str(ROOT))
            assert code == 130, err[-2000:]
            assert "fabric node: node 7: start interrupted" in err and "Traceback" not in err, err[-2000:]
    finally:
        silent.close()
