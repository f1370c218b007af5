"""Local clusters' ports stay out of the kernel's ephemeral range (fabric.local.free_port).

A port from that range can, once its node is gone, be handed to another program's
listener, and ZeroMQ sockets still reconnecting to the node then talk to that program."""

from __future__ import annotations

import itertools
import socket
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest

from fabric import local


def _port_after(argv: list[str], flag: str) -> int:
    return int(argv[argv.index(flag) + 1])


def test_free_port_is_below_the_ephemeral_range() -> None:
    floor = local._ephemeral_floor()
    ports = {local.free_port() for _ in range(50)}
    assert all(min(local.PORT_FLOOR, floor // 2) <= port < floor for port in ports)


def test_a_node_gets_fresh_ports_at_each_start_unless_pinned(tmp_path: Path) -> None:
    node = local.LocalNode(1, "127.0.0.1:1/x", tmp_path)
    first, second = node._argv(), node._argv()
    for flag in ("--port", "--replication-port"):
        assert _port_after(first, flag) < local._ephemeral_floor()
    assert (_port_after(first, "--port"), _port_after(first, "--replication-port")) != \
        (_port_after(second, "--port"), _port_after(second, "--replication-port"))

    pinned = local.LocalNode(2, "127.0.0.1:1/x", tmp_path, ["--port=20001", "--replication-port", "20002"])
    argv = pinned._argv()
    assert "--port" not in argv and _port_after(argv, "--replication-port") == 20002


def test_a_sequencer_gets_a_port_unless_pinned(tmp_path: Path) -> None:
    assert _port_after(local.LocalSequencer(1, "127.0.0.1:1/x", tmp_path)._argv(), "--port") < local._ephemeral_floor()
    assert local.LocalSequencer(2, "127.0.0.1:1/x", tmp_path, extra_args=["--port", "20003"])._argv().count("--port") == 1


def test_free_port_does_not_hand_out_a_port_twice_before_it_is_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port is only probed, not held: until its process binds it, it still probes free.
    Two picks of one port (a node's --port and another's --replication-port, all started
    at once) made a node exit with "Address already in use"."""
    floor, ceiling = local.PORT_FLOOR, local._ephemeral_floor()
    candidates = list(itertools.islice((port for port in range(floor, ceiling) if _bindable(port)), 2))
    picks = iter([candidates[0], candidates[0], candidates[1]])
    monkeypatch.setattr(local, "random", SimpleNamespace(randrange=lambda _lo, _hi: next(picks)))
    monkeypatch.setattr(local, "_handed_out", deque(), raising=False)  # none handed out yet
    assert [local.free_port(), local.free_port()] == candidates


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
