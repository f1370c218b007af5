"""The C client against a secure cluster: CURVE keys from FABRIC_KEY_FILE / FABRIC_SERVER_KEY."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper
from sdk import Admin
from tests.conftest import make_cluster
from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop

RECORDS = 500
PROCESS_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def secure_cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("c-secure"), nodes=2, secure=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_c_client_produces_and_consumes_on_a_secure_cluster(c_client: CClient, secure_cluster: LocalCluster,
                                                            tmp_path: Path) -> None:
    security = secure_cluster.security
    assert security is not None
    topic = "c-secure"
    with Admin(secure_cluster.bootstrap, security=security.client()) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=2)
        nodes = ",".join(admin.nodes().values())
    secure_env = {**os.environ, **security.environment()}
    plain_env = {k: v for k, v in os.environ.items() if k not in security.environment()}
    lines = b"".join(b"k%d\tvalue-%d\n" % (i, i) for i in range(RECORDS))
    produce = [str(c_client.produce), "-b", nodes, "-t", topic, "--key-sep", "\t", "-q", "--acks", "all"]
    run = subprocess.run(produce, input=lines, capture_output=True, timeout=PROCESS_TIMEOUT_S, env=secure_env,
                         check=False)
    assert run.returncode == 0, run.stderr.decode()
    assert f"{RECORDS} acknowledged".encode() in run.stderr
    consume = [str(c_client.consume), "-b", nodes, "-t", topic, "-p", "0", "-o", "0", "-c", str(RECORDS),
               "-F", "offset"]
    run = subprocess.run(consume, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, env=secure_env,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert [int(x) for x in run.stdout.split()] == list(range(RECORDS))
    # Without keys the C client fails with a message, within its timeouts, not a hang.
    run = subprocess.run(produce, input=b"k\tv\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, env=plain_env,
                         check=False)
    assert run.returncode != 0
    # libzmq reports the refused plaintext handshake as a mechanism mismatch, or, when the
    # CURVE node just closes it, with no detail (then the client names both causes, as the
    # Python SDK does): either way the user is told the node requires CURVE and what to set.
    assert b"requires CURVE" in run.stderr, run.stderr
    assert b"$FABRIC_KEY_FILE and $FABRIC_SERVER_KEY" in run.stderr, run.stderr
    # With the wrong server key, and with a key the cluster never registered: each says so.
    wrong_server = {**secure_env, "FABRIC_SERVER_KEY": "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"}
    run = subprocess.run(produce, input=b"k\tv\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, env=wrong_server,
                         check=False)
    assert run.returncode != 0 and b"the CURVE handshake failed" in run.stderr, run.stderr
    stranger = tmp_path / "stranger.key_secret"
    subprocess.run([sys.executable, "-c", "import sys, zmq.auth; zmq.auth.create_certificates(sys.argv[1], 'stranger')",
                    str(tmp_path)], check=True, timeout=60)
    unknown_key = {**secure_env, "FABRIC_KEY_FILE": str(stranger)}
    run = subprocess.run(produce, input=b"k\tv\n", capture_output=True, timeout=PROCESS_TIMEOUT_S, env=unknown_key,
                         check=False)
    assert run.returncode != 0 and b"does not know this client's key" in run.stderr, run.stderr
