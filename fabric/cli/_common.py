"""What several command groups share: argument parsing with one-line errors, finding and
checking the cluster, errors with exit codes, and a progress line.

Exit codes (docs/PROTOCOL.md section 13): 0 success, 1 an error from the cluster or the
environment, 2 a usage error, 3 partial success, 130 interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from fabric.bootstrap import resolve_bootstrap, state_file
from fabric.errors import ConfigError
from fabric.limits import I32_MAX, I64_MAX, PARTITIONS_MAX, REPLICATION_FACTOR_MAX
from fabric.wording import plural

STATE_FILE = state_file()  # what `fabric up` writes; read again by each resolve_bootstrap()
PROGRESS_INTERVAL_S = 1.0
REACH_TIMEOUT_S = 2.0  # a TCP connect to a bootstrap address that takes longer counts as unreachable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM: stopped by SIGTERM, cleanly (as on Ctrl-C)

NODE_ID_MAX: Final[int] = I32_MAX  # node ids are i32 on the wire (and in fabric/config.py)
# The longest wait a --timeout flag takes: longer is a typo, and stays far below
# threading.TIMEOUT_MAX, where Event.wait would raise OverflowError.
TIMEOUT_S_MAX: Final[float] = 7 * 24 * 3600.0


class CliError(Exception):
    """An error the CLI reports as one line and an exit code, never as a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def usage_error(message: str) -> CliError:
    return CliError(message, EXIT_USAGE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None, False) or
    the help already says it in words ("(default 30 s, ...)", not "(default: 30000)" too)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or "(default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action) or ""


class Parser(argparse.ArgumentParser):
    """argparse with defaults in --help and a usage error as one line (exit 2), which names
    the command the user typed (``fabric topic list: error: ...``), also for a flag that
    command does not know.

    ``keeps_unknown``: the parser hands arguments it does not know to its caller instead of
    refusing them; only for the top parser and commands that parse their own arguments
    (``fabric node``, ``fabric sequencer``, ``fabric bench``)."""

    def __init__(self, *args: Any, keeps_unknown: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.keeps_unknown = keeps_unknown
        # argparse copies a sub-parser's results over its parent's, so after parsing this
        # holds the prog of the deepest command given: the prefix of a usage error that its
        # handler raises later (describe_error), "fabric queue send", not "fabric queue".
        self.set_defaults(command_prog=self.prog)

    def parse_known_args(  # type: ignore[override]  # one signature for typeshed's three overloads
            self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        # A sub-parser's unknown arguments would otherwise travel up to the top parser and be
        # reported as "fabric: error:", naming no command: the parser that did not know
        # them says so itself, with its own prog.
        parsed, rest = super().parse_known_args(args, namespace)
        if rest and not self.keeps_unknown:
            self.error(f"unrecognized arguments: {' '.join(rest)}")
        return parsed, rest

    def add_subparsers(self, **kwargs: Any) -> Any:
        # Without a metavar, argparse names the choice by its dest in errors ("argument
        # queue_command: invalid choice") and lists every command in braces in the usage.
        kwargs.setdefault("metavar", "COMMAND")
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# -- argument types: each refuses a bad value with a message naming what is allowed ----------
def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    if value > I64_MAX:  # no count, size or offset of Fabric's is wider than an i64
        raise argparse.ArgumentTypeError(f"{value} is more than {I64_MAX:,} (an i64)")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def int_in_range(low: int, high: int, limit: str) -> Callable[[str], int]:
    """An argument type for a whole number in ``low..high``; ``limit`` names the bound (a
    constant of fabric/limits.py or the wire type), so the message says which knob it is."""

    def parse(text: str) -> int:
        value = _whole_number(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low:,}..{high:,} ({limit})")
        return value

    parse.__name__ = f"int_in_range({low}, {high})"  # argparse names the type in some messages
    return parse


def partition_count(text: str) -> int:
    """How many partitions a topic has: 1 to PARTITIONS_MAX (what CREATE_TOPIC accepts)."""
    return int_in_range(1, PARTITIONS_MAX, "PARTITIONS_MAX")(text)


def partition_index(text: str) -> int:
    """One partition of a topic: 0 to PARTITIONS_MAX - 1 (no topic has more)."""
    return int_in_range(0, PARTITIONS_MAX - 1, "a topic has at most PARTITIONS_MAX partitions")(text)


def replication_factor(text: str) -> int:
    return int_in_range(1, REPLICATION_FACTOR_MAX, "REPLICATION_FACTOR_MAX")(text)


def node_id(text: str) -> int:
    return int_in_range(0, NODE_ID_MAX, "node ids are i32")(text)


def _finite_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):  # nan and inf pass float() but no wait or deadline can use them
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def non_negative_float(text: str) -> float:
    value = _finite_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not >= 0")
    return value


def timeout_seconds(text: str) -> float:
    """A wait in seconds: more than 0 (0 or less could only time out) and at most a week."""
    value = _finite_number(text)
    if not 0 < value <= TIMEOUT_S_MAX:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, {TIMEOUT_S_MAX:g}] seconds")
    return value


def utf8_text(text: str) -> str:
    """Text the wire carries as UTF-8. Python hands bytes of argv that are not UTF-8 over as
    lone surrogates (surrogateescape); they would fail at .encode(), far from the flag."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not valid UTF-8") from None
    return text


def group_name(text: str) -> str:
    """A consumer or queue group: 1 to 255 bytes of UTF-8 (an empty one means "every group"
    on the wire, which a flag naming one group must not ask for)."""
    utf8_text(text)
    if not 1 <= len(text.encode("utf-8")) <= 255:
        raise argparse.ArgumentTypeError("a group name is 1 to 255 bytes")
    return text


def key_value(text: str) -> tuple[str, str]:
    name, sep, value = utf8_text(text).partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def make_directory(path: str, flag: str) -> Path:
    """``path`` (the value of ``flag``) as a directory that exists, made with its parents if
    need be; else a usage error saying why in one line. Without it a file in the way read
    "File exists" and a file among the parents "Not a directory", neither naming the flag
    or what to change."""
    directory = Path(path)
    try:
        if directory.exists() and not directory.is_dir():
            raise usage_error(f"{flag} {path} is a file, not a directory")
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise usage_error(f"cannot create {flag} {path}: {_why_not_made(directory, exc)}") from None
    if not os.access(directory, os.W_OK | os.X_OK):  # everything the command keeps there is written
        raise usage_error(f"{flag} {path} is not writable by this user")
    return directory


def _why_not_made(directory: Path, exc: OSError) -> str:
    """The reason mkdir failed, in terms of the path: which part of it is in the way."""
    existing = next((p for p in (directory, *directory.parents) if os.path.lexists(p)), None)
    if existing == directory and directory.is_symlink():  # lexists, yet not exists: dangling
        return f"it is a symbolic link to {os.readlink(directory)}, which does not exist"
    if existing is not None and existing != directory and not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if isinstance(exc, PermissionError) and existing is not None:
        return f"no permission to create it in {existing}"
    return exc.strerror or str(exc)


def with_bootstrap(parser: argparse.ArgumentParser, *, zookeeper_only: bool = False) -> argparse.ArgumentParser:
    """Add the ``--bootstrap`` option every cluster-talking command takes. A command that
    reads ZooKeeper itself (the direct plane's registry, ``fabric status``) says so rather
    than offering node addresses it refuses."""
    where = ("zk://HOST:PORT[/chroot] (ZooKeeper; node addresses do not do here)" if zookeeper_only
             else "zk://HOST:PORT[/chroot] (ZooKeeper) or tcp://HOST:PORT,... (nodes)")
    parser.add_argument(
        "--bootstrap", "-b",
        help=f"{where}; default: $FABRIC_BOOTSTRAP, else the cluster `fabric up` recorded",
    )
    return parser


def bootstrap(args: argparse.Namespace, *, check: bool = True) -> str:
    """The cluster to talk to: ``--bootstrap``, else ``$FABRIC_BOOTSTRAP``, else ``fabric up``'s
    record (fabric/bootstrap.py, the rule the SDK follows too); checked for form and (with
    ``check``) reachability, so a bad address fails at once with one line. A command with
    its own answer to "unreachable" (``fabric status`` exits 3) passes ``check=False``."""
    given = getattr(args, "bootstrap", None)
    # never truthiness: an empty --bootstrap is a mistake, not "the recorded cluster"
    if given is not None and not str(given).strip():
        raise usage_error("argument --bootstrap: empty (give zk://HOST:PORT or node addresses)")
    try:
        spec, origin = resolve_bootstrap(None if given is None else str(given))
    except ConfigError as exc:
        raise CliError(exc.message) from None
    if given is not None:
        origin = "argument --bootstrap"
    endpoints, is_zk = parse_bootstrap(spec, origin)
    if check:
        check_reachable(spec, endpoints, is_zk)
    return spec


def parse_bootstrap(spec: str, origin: str = "argument --bootstrap") -> tuple[list[tuple[str, int]], bool]:
    """(host, port) pairs and whether they are ZooKeeper. Pure; raises a usage error."""
    # The SDK's own check, imported here: the CLI imports sdk only once a command runs.
    from sdk._client import host_port

    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise usage_error(f"{origin}: empty; give zk://HOST:PORT or tcp://HOST:PORT")
    is_zk = parts[0].startswith("zk://")
    endpoints: list[tuple[str, int]] = []
    for index, part in enumerate(parts):
        if "://" in part and not (is_zk and index == 0):
            scheme = part.split("://", 1)[0]
            if scheme != "tcp" or is_zk:
                raise usage_error(
                    f"{origin}: {part!r} is not an address Fabric speaks: use zk://HOST:PORT for ZooKeeper "
                    "or tcp://HOST:PORT (or HOST:PORT) for nodes"
                )
        try:
            endpoints.append(host_port(part, chroot=is_zk and index == len(parts) - 1))
        except ValueError as exc:
            raise usage_error(f"{origin}: {exc}") from None
    return endpoints, is_zk


def check_reachable(spec: str, endpoints: list[tuple[str, int]], is_zk: bool) -> None:
    """Fail fast, with one line, when the bootstrap cannot work: no address accepts a TCP
    connection (a ZeroMQ connect to a dead address would otherwise just wait), or node
    addresses that are not Fabric nodes (ZooKeeper given without zk://). A ZeroMQ peer
    sends its greeting (first byte 0xFF) as soon as a connection opens; ZooKeeper waits for
    the client to speak first, so silence tells them apart without any extra round trip
    in the good case."""
    reasons: list[str] = []
    silent: list[str] = []
    for host, port in endpoints:
        try:
            with socket.create_connection((host, port), timeout=REACH_TIMEOUT_S) as conn:
                if is_zk:
                    return
                try:
                    first = conn.recv(1)
                except TimeoutError:
                    first = b""
                if first == b"\xff":
                    return
                silent.append(f"{host}:{port}")
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    if silent:
        raise CliError(
            f"{', '.join(silent)} accepted a connection but is not a Fabric node (it sent no ZeroMQ greeting); "
            f"if it is ZooKeeper, write zk://{silent[0]}"
        )
    if is_zk:
        raise CliError(f"cannot reach ZooKeeper at {', '.join(reasons)} (is the cluster running? `fabric up` starts one)")
    raise CliError(f"cannot reach any Fabric node: {', '.join(reasons)} (is the cluster running? `fabric up` starts one)")


def quiet_libraries(debug: bool) -> None:
    """Client libraries log their retries; the CLI reports the outcome itself, once."""
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
        for name in ("fabric.producer", "fabric.consumer", "fabric.admin"):
            logging.getLogger(name).setLevel(logging.ERROR)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


Handler = Callable[[argparse.Namespace], int]


class Progress:
    """A one-line progress report on stderr, at most once a second."""

    def __init__(self, label: str, total: int | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.count = 0
        self.started = time.monotonic()
        self._last = 0.0

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self._print(now)

    def _print(self, now: float, end: str = "\r") -> None:
        rate = self.count / max(now - self.started, 1e-9)
        done = f"{self.count:,}/{plural(self.total, 'message')}" if self.total else plural(self.count, "message")
        sys.stderr.write(f"{self.label}: {done}, {rate:,.0f} msg/s   {end}")
        sys.stderr.flush()

    def done(self) -> float:
        elapsed = time.monotonic() - self.started
        if self.enabled:
            self._print(time.monotonic(), end="\n")
        return elapsed
