"""Local clusters' ports stay out of the kernel's ephemeral range (fabric.local.free_port).

A port from that range can, once its node is gone, be handed to another program's
listener, and ZeroMQ sockets still reconnecting to the node then talk to that program."""

from __future__ import annotations

from pathlib import Path

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
