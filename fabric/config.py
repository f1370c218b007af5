"""The storage node's options, declared once as data, and where their values come from.

Every option has one name (``fsync_interval_ms``), which is its TOML key, its flag
(``--fsync-interval-ms``) and, upper-cased behind ``FABRIC_NODE_``, its environment
variable (``FABRIC_NODE_FSYNC_INTERVAL_MS``). A value is taken from the first of:

    1. the command line flag
    2. the environment variable
    3. the TOML file given by ``--config`` (or ``FABRIC_NODE_CONFIG``)
    4. the default below (for ``metrics_host``: the value ``host`` got)

Bad input (an unknown key in the file, a word where a number belongs, a port out of
range, a missing required option) raises ``ConfigError`` naming the source and the
option, before the node touches anything. ``markdown_table()`` renders the declaration
as the table in ``docs/OPERATIONS.md`` (a test checks that they agree).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib
    tomllib = None

from fabric.errors import ConfigError
from fabric.limits import (
    FSYNC_INTERVAL_MS_DEFAULT,
    OFFSETS_RETENTION_MS_DEFAULT,
    RETENTION_CHECK_INTERVAL_MS_DEFAULT,
)
from fabric.logs import LOG_FORMATS, LOG_LEVELS

ENV_PREFIX = "FABRIC_NODE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
CONFIG_FILE_BYTES_MAX = 1024 * 1024  # a node's TOML file is small; anything bigger is a mistake
PORT_MAX = 65_535


def bind_host_problem(value: str) -> str | None:
    """What is wrong with ``value`` as an address to bind (a host name or an IP literal, no
    port, no scheme), or None. Checked where it is read, so a typo is refused by name
    before the process starts, not as a bind error from inside the HTTP server."""
    if not value:
        return "must not be empty"
    if any(character.isspace() for character in value) or "/" in value:
        return f"must be one host name or IP address, got {value!r}"
    if ":" in value:
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            # "10.0.0.5:9300", "[::1]": the port is an option of its own, and brackets belong to URLs.
            return f"must be a host name or IP address without a port or brackets, got {value!r}"
    return None


def _bound(number: float) -> str:
    """A bound as written: 2147483647, not 2.14748e+09."""
    return str(int(number)) if number == int(number) else str(number)


@dataclass(frozen=True)
class Option:
    """One node option. ``kind`` is int, str or float; ``unit`` is what the number counts."""

    name: str
    kind: type
    default: Any
    unit: str
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    required: bool = False
    # Left unset, the option takes this other option's value (its default is then shown as
    # "`host`'s value"), so one setting moves both.
    default_from: str = ""
    check: Callable[[str], str | None] | None = None  # a string's problem, or None (bind_host_problem)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def parse(self, raw: Any, source: str) -> Any:
        """The value of ``raw`` (a string from a flag or the environment, or a TOML value)
        as this option's type, checked; ConfigError names ``source`` otherwise."""
        where = f"{source}: {self.name}"
        unit = f" ({self.unit})" if self.unit else ""
        if self.kind is int:
            if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                raise ConfigError(f"{where} must be an integer{unit}, got {raw!r}")
            try:
                value: Any = int(raw.replace("_", "")) if isinstance(raw, str) else raw
            except ValueError:
                raise ConfigError(f"{where} must be an integer{unit}, got {raw!r}") from None
        elif self.kind is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise ConfigError(f"{where} must be a number, got {raw!r}")
            try:
                value = float(raw)
            except ValueError:
                raise ConfigError(f"{where} must be a number, got {raw!r}") from None
        else:
            if not isinstance(raw, str):
                raise ConfigError(f"{where} must be a string, got {raw!r}")
            value = raw.upper() if self.name == "log_level" else raw
            if not value and self.required:
                raise ConfigError(f"{where} must not be empty")
            problem = self.check(value) if self.check is not None else None
            if problem is not None:
                raise ConfigError(f"{where} {problem}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where} must be one of {', '.join(self.choices)}, got {raw!r}")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{where} must be >= {_bound(self.minimum)}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{where} must be <= {_bound(self.maximum)}, got {value}")
        return value


# The declaration. Defaults that other code also needs live in fabric/limits.py.
NODE_OPTIONS: tuple[Option, ...] = (
    Option("id", int, None, "", "the node's identity in ZooKeeper and in partition assignments; "
           "keep it with its data dir", minimum=0, maximum=2**31 - 1, required=True),
    Option("zk", str, None, "", "ZooKeeper connect string, e.g. `10.0.0.5:2181,10.0.0.6:2181/fabric`",
           required=True),
    Option("data_dir", str, None, "", "directory of the node's RocksDB", required=True),
    Option("host", str, "127.0.0.1", "", "address the node binds and publishes in ZooKeeper"),
    Option("port", int, 0, "", "client port; 0 picks a free one (published in ZooKeeper)", minimum=0,
           maximum=PORT_MAX),
    Option("replication_port", int, 0, "", "replication PUB port; 0 picks a free one", minimum=0, maximum=PORT_MAX),
    Option("replica_lag_max_ms", int, 5_000, "ms", "a follower this far behind leaves the in-sync replicas",
           minimum=1),
    Option("replication_hwm", int, 1_000, "batches", "batches queued per follower before the replication "
           "stream drops (the follower then fetches)", minimum=1),
    Option("replication_buffer_bytes", int, 0, "bytes", "kernel buffer of the replication sockets; 0 lets "
           "the OS size it", minimum=0),
    Option("client_heartbeat_timeout_ms", int, 30_000, "ms", "a client connection that answers nothing this "
           "long, not even the ZeroMQ heartbeats the node sends every third of it, is closed and the answers "
           "queued to it freed: a client whose host died or whose network went, or one whose receive queue "
           "stayed full that long (docs/PROTOCOL.md 5.3); 0 turns heartbeats off", minimum=0),
    Option("fsync", str, "none", "", "when the write-ahead log is synced to disk: `none`, `interval`, "
           "`every-batch` (see Durability and fsync)", choices=("none", "interval", "every-batch")),
    Option("fsync_interval_ms", int, FSYNC_INTERVAL_MS_DEFAULT, "ms", "with `fsync = \"interval\"`: how often",
           minimum=1),
    Option("direct_io", str, "auto", "", "RocksDB writes its table files (flushes, compactions) with O_DIRECT, "
           "past the page cache; the WAL and reads still use it. `auto`: where the file system of "
           "`data_dir/rocksdb` allows it; `on`: refuse to start where it does not; `off` (see Table files past the page cache)",
           choices=("auto", "on", "off")),
    Option("retention_check_interval_ms", int, RETENTION_CHECK_INTERVAL_MS_DEFAULT, "ms",
           "how often retention deletes old batches", minimum=1),
    Option("offsets_retention_ms", int, OFFSETS_RETENTION_MS_DEFAULT, "ms", "a consumer group empty this long "
           "(since its last member left or its last commit, whichever is later) is deleted with its committed "
           "offsets, as Kafka's `offsets.retention.minutes`; an empty group that never committed goes after 10 "
           "minutes (docs/GROUPS.md)", minimum=1),
    Option("session_timeout_ms", int, 6_000, "ms", "ZooKeeper session timeout: how long a dead node "
           "keeps its partitions before failover", minimum=1),
    Option("metrics_port", int, 0, "", "Prometheus endpoint (`/metrics` on `metrics_host`); 0 picks a free port "
           "(published in the node's znode), -1 turns it off", minimum=-1, maximum=PORT_MAX),
    Option("metrics_host", str, None, "", "address the Prometheus endpoint binds, e.g. a management network's "
           "apart from client traffic, or `0.0.0.0` for every interface (its published URL then names `host`); "
           "a host name or IP address, no port", default_from="host", check=bind_host_problem),
    Option("security", str, "none", "", "`none` (plaintext, local development only) or `curve`: CURVE on every "
           "socket, registered keys only, ACLs, quotas, ZooKeeper digest ACLs (docs/SECURITY.md)",
           choices=("none", "curve")),
    Option("server_key_file", str, "", "", "with `security = \"curve\"`: the cluster key pair "
           "(`cluster.key_secret`), the server side of the node's sockets"),
    Option("key_file", str, "", "", "with `security = \"curve\"`: this node's key pair (`node-N.key_secret`, "
           "a principal with role node), its side of connections to other nodes"),
    Option("zk_digest_file", str, "", "", "with `security = \"curve\"`: file holding the ZooKeeper digest "
           "`user:password` (mode 0600) that owns Fabric's znodes"),
    Option("log_level", str, "INFO", "", "least severe level logged: "
           + ", ".join(f"`{level}`" for level in LOG_LEVELS[:-1]) + f" or `{LOG_LEVELS[-1]}`; "
           "case does not matter (`info` is `INFO`)", choices=LOG_LEVELS),
    Option("log_format", str, "text", "", "`text` for people, `json` for log pipelines (one object per line)",
           choices=LOG_FORMATS),
)
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in NODE_OPTIONS}


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover
        raise ConfigError("reading a TOML config file needs Python 3.11 or newer")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    if len(raw) > CONFIG_FILE_BYTES_MAX:
        raise ConfigError(f"config file {path} has {len(raw)} bytes (max {CONFIG_FILE_BYTES_MAX})")
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    # Accept the options at the top level or under [node], so one file can also hold
    # other processes' sections later.
    if "node" in table and isinstance(table["node"], dict):
        table = {**{k: v for k, v in table.items() if k != "node"}, **table["node"]}
    unknown = sorted(set(table) - set(OPTIONS_BY_NAME))
    if unknown:
        raise ConfigError(f"config file {path}: unknown option(s) {', '.join(unknown)}; known: "
                          f"{', '.join(OPTIONS_BY_NAME)}")
    return table


# The usage line a command-line error shows: argparse's own lists all 20-odd options (a
# dozen lines) and buries the error under them; --help lists them.
NODE_USAGE = "%(prog)s [--config FILE.toml] --id ID --zk HOST:PORT --data-dir DIR [OPTION ...]"


class _NodeArgumentParser(argparse.ArgumentParser):
    """Raises what argparse would print and exit with: the entry point prints it once, as
    ``fabric node: error: ...`` after the short usage line (not argparse's message and
    then a second error line pointing at it)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message, usage=self.format_usage().strip())


def argument_parser(prog: str = "fabric node") -> argparse.ArgumentParser:
    """Flags for every option; none has an argparse default, so the parse result holds
    only what the command line said (the other sources fill the rest). A flag it refuses
    raises ConfigError whose ``usage`` field is the usage line."""
    parser = _NodeArgumentParser(prog=prog, usage=NODE_USAGE,
                                 description="Run one Fabric storage node. Every option is also an environment "
                                             f"variable ({ENV_PREFIX}<NAME>) and a key of the --config file.",
                                 argument_default=argparse.SUPPRESS,
                                 epilog="Controlled shutdown of a running node: fabric node drain ID "
                                        "(see fabric node drain --help).")
    parser.add_argument("--config", metavar="FILE.toml", help=f"TOML file of options (or ${CONFIG_ENV})")
    for option in NODE_OPTIONS:
        unit = f" [{option.unit}]" if option.unit else ""
        default = "" if option.default is None else f" (default {option.default})"
        if option.default_from:
            default = f" (default: {option.default_from}'s value)"
        parser.add_argument(option.flag, dest=option.name, metavar=option.name.upper(),
                            help=f"{option.help}{unit}{default}")
    return parser


# Where a value came from, as the effective-configuration log line names it.
SOURCE_FLAG = "flag"
SOURCE_ENV = "env"
SOURCE_FILE = "file"
SOURCE_DEFAULT = "default"


def load_node_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every option's value by precedence flag > environment > file > default."""
    return resolve_node_settings(argv, environ)[0]


def resolve_node_settings(argv: Sequence[str], environ: Mapping[str, str] | None = None
                          ) -> tuple[dict[str, Any], dict[str, str]]:
    """Every option's value by precedence flag > environment > file > default, and where
    each came from (``SOURCE_FLAG``, ``SOURCE_ENV``, ``SOURCE_FILE``, ``SOURCE_DEFAULT``)."""
    environ = os.environ if environ is None else environ
    flags = vars(argument_parser().parse_args(list(argv)))  # --help exits 0; a bad flag raises ConfigError
    config_path = flags.pop("config", None) or environ.get(CONFIG_ENV)
    from_file = _read_toml(Path(config_path)) if config_path else {}
    unknown_env = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k != CONFIG_ENV
                         and k[len(ENV_PREFIX):].lower() not in OPTIONS_BY_NAME)
    if unknown_env:
        raise ConfigError(f"unknown environment variable(s) {', '.join(unknown_env)}")
    settings: dict[str, Any] = {}
    sources: dict[str, str] = {}
    missing = []
    for option in NODE_OPTIONS:
        if option.name in flags:
            settings[option.name] = option.parse(flags[option.name], f"flag {option.flag}")
            sources[option.name] = SOURCE_FLAG
        elif option.env in environ:
            settings[option.name] = option.parse(environ[option.env], f"environment {option.env}")
            sources[option.name] = SOURCE_ENV
        elif option.name in from_file:
            settings[option.name] = option.parse(from_file[option.name], f"config file {config_path}")
            sources[option.name] = SOURCE_FILE
        elif option.required:
            missing.append(option)
        else:
            settings[option.name] = option.default
            sources[option.name] = SOURCE_DEFAULT
    for option in NODE_OPTIONS:
        if option.default_from and sources.get(option.name) == SOURCE_DEFAULT:
            settings[option.name] = settings[option.default_from]
    if missing:
        raise ConfigError("missing required option(s): " + "; ".join(
            f"{o.name} ({o.flag}, {o.env} or `{o.name} =` in --config)" for o in missing))
    return settings, sources


def effective_config_line(settings: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """The node's one log line of its effective configuration: every option, in the
    table's order, as ``name=value (source)``. Strings are JSON-quoted, so an empty one
    (``key_file=""``) or one with spaces still reads as one value. No option holds a
    secret: the key options name files, whose contents are never logged."""
    parts = []
    for option in NODE_OPTIONS:
        value = settings[option.name]
        shown = json.dumps(value) if isinstance(value, str) else str(value)
        parts.append(f"{option.name}={shown} ({sources.get(option.name, '?')})")
    return "effective configuration: " + ", ".join(parts)


def _markdown_cell(option: Option) -> str:
    value = option.default
    if option.default_from:
        return f"`{option.default_from}`'s value"
    if value is None:
        return "required"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def markdown_table() -> str:
    """The options table of docs/OPERATIONS.md, generated from NODE_OPTIONS."""
    lines = ["| option (TOML key) | flag | environment | type | unit | default | what |",
             "|---|---|---|---|---|---|---|"]
    for o in NODE_OPTIONS:
        lines.append(f"| `{o.name}` | `{o.flag}` | `{o.env}` | {o.kind.__name__} | {o.unit or '-'} | "
                     f"{_markdown_cell(o)} | {o.help} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
