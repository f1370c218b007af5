"""Node options: precedence flag > environment > file > default, bad input refused with a
clear message, and the table in docs/OPERATIONS.md generated from the declaration."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabric import config
from fabric.errors import ConfigError

REQUIRED = ["--id", "1", "--zk", "127.0.0.1:2181", "--data-dir", "/tmp/n1"]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return str(path)


def test_defaults_fill_what_no_source_gives() -> None:
    settings = config.load_node_settings(REQUIRED, {})
    assert settings["id"] == 1 and settings["zk"] == "127.0.0.1:2181"
    for option in config.NODE_OPTIONS:
        if not option.required:
            expected = settings[option.default_from] if option.default_from else option.default
            assert settings[option.name] == expected, option.name


def test_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write(tmp_path, 'fsync_interval_ms = 300\nsession_timeout_ms = 301\nreplica_lag_max_ms = 302\n'
                           'id = 9\nzk = "file:2181"\ndata_dir = "/from/file"\n')
    env = {"FABRIC_NODE_FSYNC_INTERVAL_MS": "200", "FABRIC_NODE_SESSION_TIMEOUT_MS": "201"}
    settings = config.load_node_settings(["--config", path, "--fsync-interval-ms", "100"], env)
    assert settings["fsync_interval_ms"] == 100          # flag beats env and file
    assert settings["session_timeout_ms"] == 201         # env beats file
    assert settings["replica_lag_max_ms"] == 302         # file beats default
    assert settings["retention_check_interval_ms"] == config.OPTIONS_BY_NAME["retention_check_interval_ms"].default
    assert (settings["id"], settings["zk"], settings["data_dir"]) == (9, "file:2181", "/from/file")


def test_config_file_from_environment_and_node_section(tmp_path: Path) -> None:
    path = write(tmp_path, '[node]\nid = 4\nzk = "z:1"\ndata_dir = "/d"\nfsync = "interval"\n')
    settings = config.load_node_settings([], {"FABRIC_NODE_CONFIG": path})
    assert (settings["id"], settings["fsync"]) == (4, "interval")


@pytest.mark.parametrize(("argv", "env", "toml", "message"), [
    (["--port", "http"], {}, "", "flag --port: port must be an integer, got 'http'"),
    ([], {"FABRIC_NODE_PORT": "70000"}, "", "environment FABRIC_NODE_PORT: port must be <= 65535"),
    ([], {}, "port = -1\n", "port must be >= 0"),
    ([], {}, 'port = "9092"\n', None),  # a numeric string in TOML is accepted
    ([], {}, "session_timeout_ms = true\n", "must be an integer (ms), got True"),
    ([], {}, 'fsync = "sometimes"\n', "fsync must be one of none, interval, every-batch"),
    ([], {}, "fsyncc = 1\n", "unknown option(s) fsyncc"),
    ([], {"FABRIC_NODE_FSYNCC": "1"}, "", "unknown environment variable(s) FABRIC_NODE_FSYNCC"),
    ([], {}, "id = [1\n", "is not valid TOML"),
    ([], {}, 'log_level = "chatty"\n', "log_level must be one of DEBUG"),
    (["--metrics-host", ""], {}, "", "flag --metrics-host: metrics_host must not be empty"),
    ([], {"FABRIC_NODE_METRICS_HOST": "10.0.0.5:9300"}, "",
     "environment FABRIC_NODE_METRICS_HOST: metrics_host must be a host name or IP address without a port"),
    ([], {}, 'metrics_host = "[::1]"\n', "metrics_host must be a host name or IP address without a port or brackets"),
    ([], {}, 'metrics_host = "http://10.0.0.5"\n', "metrics_host must be one host name or IP address"),
    ([], {}, 'metrics_host = "10.0.0.5 10.0.0.6"\n', "metrics_host must be one host name or IP address"),
    ([], {}, "metrics_host = 10\n", "metrics_host must be a string, got 10"),
])
def test_bad_input_is_refused_with_its_source(tmp_path: Path, argv: list[str], env: dict[str, str], toml: str,
                                              message: str | None) -> None:
    path = write(tmp_path, toml)
    if message is None:
        assert config.load_node_settings([*REQUIRED, "--config", path, *argv], env)["port"] == 9092
        return
    with pytest.raises(ConfigError) as info:
        config.load_node_settings([*REQUIRED, "--config", path, *argv], env)
    assert message in info.value.message


def test_missing_required_names_every_way_to_give_it() -> None:
    with pytest.raises(ConfigError) as info:
        config.load_node_settings(["--id", "1"], {})
    assert "zk (--zk, FABRIC_NODE_ZK or `zk =` in --config)" in info.value.message
    assert "data_dir" in info.value.message and "id (" not in info.value.message


def test_missing_config_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        config.load_node_settings([*REQUIRED, "--config", "/nonexistent/node.toml"], {})


def test_operations_doc_table_is_generated_from_the_declaration() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "OPERATIONS.md").read_text()
    found = re.search(r"<!-- node-options:begin -->\n(.*?)<!-- node-options:end -->", doc, re.S)
    assert found, "docs/OPERATIONS.md lost its node-options markers"
    assert found.group(1) == config.markdown_table(), "regenerate with: python -m fabric.config"


def test_declared_defaults_match_the_node() -> None:
    # The node's own argparse defaults and the declaration must not drift apart.
    from nodes.launch import server_argv
    from nodes.server import NodeConfig

    settings = config.load_node_settings(REQUIRED, {})
    argv = server_argv(settings)
    assert "--log-format" not in argv and argv[argv.index("--id") + 1] == "1"
    defaults = NodeConfig(node_id=1, zk="z", data_dir="d")
    for name in ("host", "port", "replication_port", "replica_lag_max_ms", "replication_hwm",
                 "replication_buffer_bytes", "fsync", "fsync_interval_ms", "retention_check_interval_ms",
                 "offsets_retention_ms",
                 "session_timeout_ms", "client_heartbeat_timeout_ms"):
        assert getattr(defaults, name) == settings[name], name


def test_metrics_host_follows_host_unless_given(tmp_path: Path) -> None:
    # Nothing changes for a node that does not set it: the endpoint stays on `host`,
    # wherever `host` came from; set, it wins from any source.
    path = write(tmp_path, 'host = "10.0.0.11"\n')
    settings, sources = config.resolve_node_settings([*REQUIRED, "--config", path], {})
    assert (settings["metrics_host"], sources["metrics_host"]) == ("10.0.0.11", config.SOURCE_DEFAULT)
    settings = config.load_node_settings([*REQUIRED, "--host", "10.0.0.12"], {})
    assert settings["metrics_host"] == "10.0.0.12"
    for argv, env, toml, value in [
        (["--metrics-host", "10.1.0.5"], {}, "", "10.1.0.5"),
        ([], {"FABRIC_NODE_METRICS_HOST": "0.0.0.0"}, "", "0.0.0.0"),
        ([], {}, 'metrics_host = "::1"\n', "::1"),
        ([], {}, 'metrics_host = "mgmt.node1.example"\n', "mgmt.node1.example"),
    ]:
        settings = config.load_node_settings([*REQUIRED, "--config", write(tmp_path, toml), *argv], env)
        assert (settings["host"], settings["metrics_host"]) == ("127.0.0.1", value)


def test_the_node_binds_its_metrics_where_the_settings_say() -> None:
    from nodes.launch import server_argv
    from nodes.state import parse_node_args

    node_config, _level = parse_node_args(server_argv(config.load_node_settings(
        [*REQUIRED, "--host", "10.0.0.11", "--metrics-host", "10.1.0.5"], {})))
    assert (node_config.host, node_config.metrics_host) == ("10.0.0.11", "10.1.0.5")
    node_config, _level = parse_node_args(server_argv(config.load_node_settings(REQUIRED, {})))
    assert node_config.metrics_host == node_config.host == "127.0.0.1"


@pytest.mark.parametrize(("value", "problem"), [
    ("10.1.0.5:9300", "without a port"), ("", "must not be empty"), (" 10.1.0.5", "one host name")])
def test_a_sequencers_bad_metrics_host_is_one_line_and_exit_2(value: str, problem: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from sequencer.service import main

    with pytest.raises(SystemExit) as exited:
        main(["--zk", "127.0.0.1:1", "--metrics-host", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("fabric sequencer: error: argument --metrics-host: ") and problem in err[0], err
