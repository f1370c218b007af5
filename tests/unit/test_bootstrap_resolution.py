"""Which cluster a client talks to when its caller names none (fabric/bootstrap.py): the
address given, else $FABRIC_BOOTSTRAP, else the cluster `fabric up` recorded, for the SDK
as for the CLI. No sockets: every client here fails, or is only inspected, before it
opens one."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sdk
from fabric.bootstrap import NO_CLUSTER_MESSAGE, resolve_bootstrap, state_file
from fabric.cli import _common
from fabric.errors import ConfigError
from sdk._client import Bootstrap
from sdk.aio import AsyncConsumer
from sdk.aio_queue import AsyncQueueConsumer

RECORDED = "zk://127.0.0.1:21810/fabric-recorded"
FROM_ENV = "zk://127.0.0.1:21811/fabric-env"


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped: no process has it now (the
    kernel hands pids out in turn, so it is not reused within this test)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty FABRIC_HOME and no $FABRIC_BOOTSTRAP: nothing found unless a test records it."""
    monkeypatch.setenv("FABRIC_HOME", str(tmp_path))
    monkeypatch.delenv("FABRIC_BOOTSTRAP", raising=False)
    return tmp_path


def record(home: Path, pid: int | None) -> Path:
    path = home / "local.json"
    state: dict[str, object] = {"bootstrap": RECORDED, "zk": "127.0.0.1:21810"}
    if pid is not None:
        state["pid"] = pid
    path.write_text(json.dumps(state))
    return path


def test_given_wins_over_the_environment_and_the_record(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record(home, os.getpid())
    monkeypatch.setenv("FABRIC_BOOTSTRAP", FROM_ENV)
    assert resolve_bootstrap("tcp://h:1") == ("tcp://h:1", "the bootstrap argument")
    # Empty is given too: the caller's mistake, refused where it is parsed, never "find one".
    assert resolve_bootstrap("") == ("", "the bootstrap argument")


def test_the_variable_comes_before_the_record_and_empty_is_unset(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = record(home, os.getpid())
    monkeypatch.setenv("FABRIC_BOOTSTRAP", FROM_ENV)
    assert resolve_bootstrap(None) == (FROM_ENV, "$FABRIC_BOOTSTRAP")
    monkeypatch.setenv("FABRIC_BOOTSTRAP", "")  # `FABRIC_BOOTSTRAP= cmd`, as the CLI reads it
    assert resolve_bootstrap(None) == (RECORDED, f"the cluster recorded in {path}")


def test_the_record_is_read_from_fabric_home_at_each_call(home: Path, tmp_path_factory: pytest.TempPathFactory,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    assert state_file() == home / "local.json"
    record(home, os.getpid())
    assert resolve_bootstrap()[0] == RECORDED
    other = tmp_path_factory.mktemp("other-home")
    (other / "local.json").write_text(json.dumps({"bootstrap": FROM_ENV}))  # no pid: taken as it is
    monkeypatch.setenv("FABRIC_HOME", str(other))
    assert resolve_bootstrap()[0] == FROM_ENV
    monkeypatch.delenv("FABRIC_HOME")
    assert state_file() == Path.home() / ".fabric" / "local.json"


@pytest.mark.parametrize("content", [None, "not json", json.dumps({"zk": "h:1"}), json.dumps(["x"])])
def test_nothing_found_is_the_clis_message(home: Path, content: str | None) -> None:
    if content is not None:
        (home / "local.json").write_text(content)
    with pytest.raises(ConfigError) as caught:
        resolve_bootstrap(None)
    assert caught.value.message == NO_CLUSTER_MESSAGE
    assert caught.value.fields == {"state_file": str(home / "local.json")}


@pytest.mark.parametrize("pid", ["dead", 0, -1, 2**70])
def test_a_record_whose_fabric_up_is_gone_is_refused(home: Path, pid: int | str) -> None:
    pid = _dead_pid() if pid == "dead" else pid
    path = record(home, int(pid))
    expected = (f"the cluster recorded in {path} (`fabric up`, pid {pid}) is not running: "
                "start it with `fabric up`, or pass --bootstrap")
    with pytest.raises(ConfigError) as caught:
        resolve_bootstrap(None)
    assert caught.value.message == expected
    assert caught.value.fields == {"state_file": str(path), "pid": pid}
    # The CLI says the same, as its one-line error (exit 1).
    with pytest.raises(_common.CliError) as cli:
        _common.bootstrap(argparse.Namespace(bootstrap=None), check=False)
    assert (cli.value.message, cli.value.exit_code) == (expected, _common.EXIT_ERROR)


def test_the_cli_uses_the_same_order(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record(home, os.getpid())
    assert _common.bootstrap(argparse.Namespace(bootstrap=None), check=False) == RECORDED
    monkeypatch.setenv("FABRIC_BOOTSTRAP", FROM_ENV)
    assert _common.bootstrap(argparse.Namespace(bootstrap=None), check=False) == FROM_ENV
    assert _common.bootstrap(argparse.Namespace(bootstrap="tcp://h:1"), check=False) == "tcp://h:1"
    with pytest.raises(_common.CliError) as empty:
        _common.bootstrap(argparse.Namespace(bootstrap=" "), check=False)
    assert empty.value.exit_code == _common.EXIT_USAGE
    (home / "local.json").unlink()
    monkeypatch.delenv("FABRIC_BOOTSTRAP")
    with pytest.raises(_common.CliError) as nothing:
        _common.bootstrap(argparse.Namespace(bootstrap=None), check=False)
    assert nothing.value.message == NO_CLUSTER_MESSAGE


def test_sdk_bootstrap_none_finds_the_cluster(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record(home, os.getpid())
    found = Bootstrap(None)
    assert (found.zk, found.text) == ("127.0.0.1:21810/fabric-recorded", RECORDED)
    monkeypatch.setenv("FABRIC_BOOTSTRAP", "tcp://n1:1, n2:2")
    found = Bootstrap()
    assert (found.addresses, found.text) == (["tcp://n1:1", "tcp://n2:2"], "tcp://n1:1,n2:2")
    # A malformed address the caller never wrote says where it came from.
    monkeypatch.setenv("FABRIC_BOOTSTRAP", "http://h:1")
    with pytest.raises(ValueError, match=r"use zk://HOST:PORT .* \(from \$FABRIC_BOOTSTRAP\)$"):
        Bootstrap(None)


@pytest.mark.parametrize("make", [sdk.Producer, sdk.Consumer, sdk.Admin, sdk.Client,
                                  lambda b: sdk.QueueConsumer(b, "jobs"), lambda b: sdk.OrderedConsumer(b, "ledger")],
                         ids=["Producer", "Consumer", "Admin", "Client", "QueueConsumer", "OrderedConsumer"])
def test_sdk_clients_without_a_cluster_raise_config_error(home: Path, make: Callable[[str | None], object]) -> None:
    # Before any socket is opened: nothing to close.
    with pytest.raises(ConfigError, match="no cluster given"):
        make(None)
    with pytest.raises(ValueError, match="bootstrap is empty"):  # given empty: never "find one"
        make("")


def test_sdk_connect_without_a_cluster_raises_config_error(home: Path) -> None:
    import asyncio

    with pytest.raises(ConfigError, match="no cluster given"):
        asyncio.run(sdk.connect())


ENTRY_POINTS: list[tuple[str, Callable[..., object], bool]] = [
    # (name, callable, whether bootstrap may be left out: the others take a queue or topic next)
    ("Producer", sdk.Producer.__init__, True),
    ("Consumer", sdk.Consumer.__init__, True),
    ("Admin", sdk.Admin.__init__, True),
    ("Client", sdk.Client.__init__, True),
    ("connect", sdk.connect, True),
    ("AsyncConsumer.create", AsyncConsumer.create, True),
    ("QueueConsumer", sdk.QueueConsumer.__init__, False),
    ("OrderedConsumer", sdk.OrderedConsumer.__init__, False),
    ("AsyncQueueConsumer.create", AsyncQueueConsumer.create, False),
]


@pytest.mark.parametrize(("name", "entry", "optional"), ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_every_entry_point_takes_bootstrap_first_and_none(name: str, entry: Callable[..., object],
                                                          optional: bool) -> None:
    parameters = [p for p in inspect.signature(entry).parameters.values() if p.name not in ("self", "cls")]
    first = parameters[0]
    assert first.name == "bootstrap" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
    assert first.annotation == "str | None", name
    assert first.default is (None if optional else inspect.Parameter.empty), name
