"""What an operator sees of a node's options: the effective-configuration log line (every
option, its value and where it came from), the log levels the table promises, the one-line
reason ``fabric up`` gives for a node that could not start, and a bad ``fabric up
--config`` refused before its ``--data-dir`` is made. No sockets, no processes."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest

import fabric.local
from fabric import config, logs
from fabric.cli import build_parser
from fabric.cli._common import CliError
from fabric.cli.cluster import cmd_up
from fabric.errors import ConfigError

REQUIRED = ["--id", "1", "--zk", "127.0.0.1:2181", "--data-dir", "/tmp/n1"]


def test_every_option_is_reported_with_its_source(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('host = "10.0.0.11"\nfsync = "interval"\n')
    settings, sources = config.resolve_node_settings(
        [*REQUIRED, "--config", str(path), "--port", "9092"], {"FABRIC_NODE_FSYNC_INTERVAL_MS": "250"})
    assert (sources["port"], sources["fsync_interval_ms"], sources["host"], sources["replication_hwm"]) == \
        (config.SOURCE_FLAG, config.SOURCE_ENV, config.SOURCE_FILE, config.SOURCE_DEFAULT)
    line = config.effective_config_line(settings, sources)
    assert line.startswith("effective configuration: id=1 (flag), zk=\"127.0.0.1:2181\" (flag), ")
    assert 'host="10.0.0.11" (file), port=9092 (flag), ' in line
    assert "fsync_interval_ms=250 (env)" in line and 'fsync="interval" (file)' in line
    assert 'key_file="" (default)' in line and line.endswith('log_format="text" (default)')
    assert 'metrics_port=0 (default), metrics_host="10.0.0.11" (default), ' in line  # `host`'s value
    assert line.count(" (") == len(config.NODE_OPTIONS) and "\n" not in line


def test_a_string_with_spaces_or_quotes_stays_one_value() -> None:
    settings, sources = config.resolve_node_settings(["--id", "2", "--zk", "z:1", "--data-dir", '/srv/my "data" dir'], {})
    assert r'data_dir="/srv/my \"data\" dir" (flag)' in config.effective_config_line(settings, sources)


def test_the_node_logs_its_effective_configuration_first(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from nodes import launch

    started: list[list[str]] = []
    monkeypatch.setattr(launch, "server_main", lambda argv: started.append(argv) or 0)
    monkeypatch.setattr(logs, "setup", lambda *args, **kwargs: None)  # keep pytest's capture handler
    with caplog.at_level(logging.INFO, logger="fabric.node"):
        assert launch.main([*REQUIRED, "--log-level", "info"]) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "fabric.node"]
    assert len(lines) == 1 and lines[0].startswith("effective configuration: id=1 (flag)")
    assert 'log_level="INFO" (flag)' in lines[0] and started


def test_the_table_lists_exactly_the_log_levels_the_node_takes() -> None:
    # It said "DEBUG, INFO, WARNING, ERROR"; the node also takes CRITICAL, and any case.
    row = next(line for line in config.markdown_table().splitlines() if line.startswith("| `log_level`"))
    for level in logs.LOG_LEVELS:
        assert f"`{level}`" in row, row
        for given in (level, level.lower(), level.capitalize()):
            assert config.load_node_settings([*REQUIRED, "--log-level", given], {})["log_level"] == level
    assert "case does not matter" in row
    with pytest.raises(ConfigError, match="log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"):
        config.load_node_settings([*REQUIRED, "--log-level", "trace"], {})


@pytest.mark.parametrize(("log", "reason"), [
    # The node's own line, after JSON log lines (they were pasted into fabric up's error).
    ('{"ts": "x", "level": "INFO", "msg": "effective configuration: ..."}\n'
     "fabric node: error: node 1 cannot start: cannot listen on tcp://192.0.2.1:9092: Cannot assign requested address\n",
     "cannot listen on tcp://192.0.2.1:9092: Cannot assign requested address"),
    ("fabric node: error: missing required option(s): zk\n", "missing required option(s): zk"),
    # A crash: its exception, the traceback's last line.
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad\n\n", "ValueError: bad"),
    # An earlier run's reason far above this run's crash is not this run's.
    ("fabric node: error: node 1 cannot start: old reason\n" + "line\n" * 10 + "KeyError: 'x'\n", "KeyError: 'x'"),
    ("", "it wrote nothing to its log"),
    # A sequencer's own lines (sequencer/service.py), at start and when it stops at once.
    ("fabric sequencer: error: sequencer 2 cannot start: [Errno 2] No such file or directory: 'k'\n",
     "[Errno 2] No such file or directory: 'k'"),
    ("fabric sequencer: error: sequencer 1 stopped: Address already in use (addr='tcp://127.0.0.1:9')\n",
     "Address already in use (addr='tcp://127.0.0.1:9')"),
    # ZooKeeper (slf4j-simple): its ERROR and the exception under it, not the stack trace's
    # last frame or its "Exiting JVM" line.
    ("[main] WARN org.apache.zookeeper.server.quorum.QuorumPeerMain - Either no config or no quorum\n"
     "[main] ERROR org.apache.zookeeper.server.ZooKeeperServerMain - Unable to access datadir, exiting abnormally\n"
     "org.apache.zookeeper.server.persistence.FileTxnSnapLog$DatadirException: Unable to create data directory /d\n"
     + "\tat org.apache.zookeeper.server.ZooKeeperServerMain.main(ZooKeeperServerMain.java:68)\n" * 5
     + "Unable to access datadir, exiting abnormally\n"
     "[main] ERROR org.apache.zookeeper.util.ServiceUtils - Exiting JVM with code 3\n",
     "Unable to access datadir, exiting abnormally: org.apache.zookeeper.server.persistence."
     "FileTxnSnapLog$DatadirException: Unable to create data directory /d"),
    ("[main] ERROR org.apache.zookeeper.server.quorum.QuorumPeer - Unable to load database on disk\n",
     "Unable to load database on disk"),
])
def test_start_failure_reason(log: str, reason: str) -> None:
    assert fabric.local.start_failure_reason(log) == reason


def test_a_bad_up_config_is_refused_before_the_data_dir_is_made(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("fsyncc = 1\n")
    data_dir = tmp_path / "d2"
    args, _rest = build_parser().parse_known_args(["up", "--config", str(bad), "--data-dir", str(data_dir)])
    with pytest.raises(ConfigError, match="unknown option"):
        cmd_up(args)
    assert not data_dir.exists()


@pytest.mark.parametrize("process", ["node 1", "sequencer 2", "zookeeper (127.0.0.1:2181)"])
def test_a_process_that_cannot_start_fails_up_in_one_line(process: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a node's error was caught: a ZooKeeper server's or a sequencer's came out as
    # "internal error RuntimeError: ..." with its log pasted in.
    log_path = tmp_path / "data" / "p.log"

    class StandIn:
        def __init__(self, *args: object, **kwargs: object) -> None:
            self.supervisor = fabric.local.Supervisor()

        def start(self) -> None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_text("why\n")
            raise fabric.local.ProcessStartError(process, "why", log_path, 1, "why")

    monkeypatch.setattr(fabric.local, "LocalCluster", StandIn)
    args, _rest = build_parser().parse_known_args(["up", "--data-dir", str(tmp_path / "data")])
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        with pytest.raises(CliError) as caught:
            cmd_up(args)
    finally:  # cmd_up took them over before it started the cluster
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert caught.value.message == f"{process} could not start: why (log: {log_path})"
    assert caught.value.exit_code == 1  # as for a node (docs/OPERATIONS.md)


@pytest.mark.parametrize("command", ["up", "demo"])
def test_up_and_demo_without_zookeeper_say_so_in_one_line(command: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # It was "internal error RuntimeError: ZooKeeper is not installed ..." with a traceback's
    # worth of context; nothing is made or started first.
    monkeypatch.setattr(fabric.local, "zookeeper_available", lambda: False)
    data_dir = tmp_path / "d"
    argv = [command, "--data-dir", str(data_dir)] if command == "up" else [command]
    args, _rest = build_parser().parse_known_args(argv)
    with pytest.raises(CliError, match=r"^ZooKeeper is not installed: apt-get install") as caught:
        args.run(args)
    assert caught.value.exit_code == 1 and not data_dir.exists()
