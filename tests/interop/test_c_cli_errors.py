"""The C examples given a ZooKeeper address say plainly that they need node addresses,
and their default acks are the Python CLI's (all)."""

from __future__ import annotations

import subprocess

import pytest

from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop


@pytest.mark.parametrize("tool", ["produce", "consume"])
def test_zookeeper_bootstrap_is_refused_plainly(c_client: CClient, tool: str) -> None:
    binary = c_client.produce if tool == "produce" else c_client.consume
    args = [str(binary), "-b", "zk://127.0.0.1:2181", "-t", "events"] + (["-p", "0"] if tool == "consume" else [])
    done = subprocess.run(args, input=b"", capture_output=True, timeout=30, check=False)
    message = done.stderr.decode()
    assert done.returncode == 2
    assert "is a ZooKeeper address; the C client needs node addresses" in message
    assert len(message.strip().splitlines()) == 1


def test_default_acks_match_the_python_cli(c_client: CClient) -> None:
    from fabric.cli import build_parser

    usage = subprocess.run([str(c_client.produce), "--help"], capture_output=True, timeout=30, check=False)
    assert "default all" in usage.stdout.decode()
    assert build_parser().parse_args(["produce", "t"]).acks == "all"
