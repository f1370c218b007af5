"""The sequencer process on bad input and bad arguments: a clear error, and it keeps serving.

Raw frames over a DEALER, as docs/PROTOCOL.md describes them (sections 2, 5.13 and 7), to
a real sequencer instance registered in a real ZooKeeper.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric import errors
from fabric import zk as zkl
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import decode_header, encode_request_header
from fabric.sequencer_client import read_active
from tests.conftest import make_cluster
from tests.integration.helpers import raw_request

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sequencer_address(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One active sequencer instance (no storage node: nothing here needs one)."""
    cluster: LocalCluster = make_cluster(zk_server, tmp_path_factory.mktemp("sequencer"), nodes=0, sequencer_count=1)
    cluster.start()
    try:
        cluster.wait_for_active_sequencer()
        zk = zkl.make_client(cluster.zk_address)
        zk.start(timeout=10)
        try:
            active = read_active(zk)
        finally:
            zkl.close_client(zk)
        assert active is not None
        yield active.address
    finally:
        cluster.stop()


def allocate(address: str, count: int) -> tuple[int, list[bytes]]:
    reply = raw_request(address, apis.encode_request(ApiKey.ALLOCATE_IDS, {"count": count, "kind": 0}, 9))
    return decode_header(reply[0]).error_code, reply


def test_an_api_the_sequencer_does_not_serve_is_unknown_api_whatever_its_body(sequencer_address: str) -> None:
    # A PRODUCE sent to the sequencer by mistake used to be refused as a malformed PRODUCE
    # ("truncated frame: acks needs 1 bytes"), while a METADATA got UNKNOWN_API.
    for api_key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, 99):
        reply = raw_request(sequencer_address, [encode_request_header(int(api_key), 0, 0x0A0B0C0D), b""])
        header = decode_header(reply[0])
        assert header.error_code == errors.UnknownApiError.code, (api_key, reply)
        assert (header.api_key, header.correlation_id, header.is_response) == (int(api_key), 0x0A0B0C0D, True)
        (length,) = struct.unpack_from("<H", reply[1])
        assert "serves API_VERSIONS and ALLOCATE_IDS" in reply[1][2:2 + length].decode()
    error_code, _ = allocate(sequencer_address, 1)
    assert error_code == 0


@pytest.mark.parametrize(("frames", "error_code"), [
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 0, 1), struct.pack("<i", 1)], errors.MalformedRequestError.code),
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 0, 1), struct.pack("<ibx", 1, 0)], errors.MalformedRequestError.code),
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 0, 1)], errors.MalformedRequestError.code),
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 1, 1), struct.pack("<ib", 1, 0)], errors.UnsupportedVersionError.code),
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 0, 1), struct.pack("<ib", -1, 0)], errors.InvalidIdCountError.code),
    ([encode_request_header(ApiKey.ALLOCATE_IDS, 0, 1), struct.pack("<ib", 1, 2)], errors.InvalidIdCountError.code),
    ([b"XXXX" + bytes(12), b""], errors.InvalidMagicError.code),
])
def test_bad_requests_get_their_error_and_the_sequencer_keeps_granting(
        sequencer_address: str, frames: list[bytes], error_code: int) -> None:
    reply = raw_request(sequencer_address, frames)
    assert len(reply) == 2
    assert decode_header(reply[0]).error_code == error_code
    granted, _ = allocate(sequencer_address, 3)
    assert granted == 0


def test_a_missing_key_file_is_one_line_and_exit_1(tmp_path: Path) -> None:
    # The instance built its service before its error handling: a traceback, not the
    # documented `fabric sequencer: error: ...` line (docs/OPERATIONS.md, "Sequencers").
    for flag in ("--server-key-file", "--zk-digest-file"):
        result = subprocess.run(
            [sys.executable, "-m", "fabric", "sequencer", "--zk", "127.0.0.1:1", flag, str(tmp_path / "missing")],
            capture_output=True, text=True, timeout=60, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "FABRIC_DEBUG": ""})
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("fabric sequencer: error: sequencer 1 cannot start:"), result.stderr
        assert "missing" in last
