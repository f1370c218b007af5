"""What an operator sees of a node's options: the effective-configuration log line (every
option, its value and where it came from), the log levels the table promises, the one-line
reason ``fabric up`` gives for a node that could not start, and a bad ``fabric up
--config`` refused before its ``--data-dir`` is made. No sockets, no processes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import fabric.local
from fabric import config, logs
from fabric.cli import build_parser
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
