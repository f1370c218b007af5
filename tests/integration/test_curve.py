"""CURVE and the ZAP handler on real ZeroMQ sockets: who gets in, and what the client sees."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from fabric import errors
from fabric.auth import keys
from fabric.auth.acl import Authorizer, Principal, Role
from fabric.auth.curve import (
    DOMAIN_CLIENTS,
    DOMAIN_REPLICATION,
    ClientSecurity,
    ServerSecurity,
    ZapAuthenticator,
    split_user_id,
    user_id,
)
from fabric.local import free_port
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.transport import Connections


class KeyRing:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        for name in ("cluster", "alice", "node-1", "mallory"):
            keys.generate_key_pair(directory, name)
        self.server = ServerSecurity.from_file(directory / "cluster.key_secret")

    def client(self, name: str) -> ClientSecurity:
        return ClientSecurity.from_files(self.dir / f"{name}.key_secret", self.dir / "cluster.key")

    def public(self, name: str) -> str:
        return keys.load_key_pair(self.dir / f"{name}.key").public_key.decode()


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return KeyRing(tmp_path)


class EchoNode:
    """A CURVE ROUTER that answers API_VERSIONS with the caller's User-Id in the error text."""

    def __init__(self, ring: KeyRing, domain: str = DOMAIN_CLIENTS) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        principals = {n: Principal(n, ring.public(n), Role.NODE if n.startswith("node") else Role.USER)
                      for n in ("alice", "node-1")}
        self.authorizer = Authorizer(principals, [])
        self.refusals: list[tuple[str, str]] = []
        self.zap = ZapAuthenticator(self.ctx, lambda: self.authorizer, lambda d, w: self.refusals.append((d, w)))
        self.zap.start()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        ring.server.apply(self.sock, domain)
        self.address = f"tcp://127.0.0.1:{free_port()}"
        self.sock.bind(self.address)
        self.requests = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            frames = self.sock.recv_multipart(copy=False)
            self.requests += 1
            message = apis.decode_request([f.bytes for f in frames[1:]])
            # The User-Id is "name key": the principal, and the key it connected with.
            reply = apis.encode_error_response(message.header, 81, f"user={split_user_id(user_id(frames[1]))[0]}")
            self.sock.send_multipart([frames[0].bytes, *reply])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
        self.zap.stop()
        self.ctx.term()


@pytest.fixture
def node(ring: KeyRing) -> Iterator[EchoNode]:
    n = EchoNode(ring)
    try:
        yield n
    finally:
        n.close()


def ask(conns: Connections, address: str) -> str:
    try:
        conns.request(address, ApiKey.API_VERSIONS, {}, timeout_ms=3_000)
    except errors.AuthenticationFailedError as exc:
        if "user=" in exc.message:
            return exc.message
        raise
    raise AssertionError("the echo node always answers with an error")


def test_registered_key_gets_in_and_carries_its_principal(ring: KeyRing, node: EchoNode) -> None:
    conns = Connections(zmq.Context.instance(), security=ring.client("alice"))
    try:
        assert ask(conns, node.address) == "user=alice"
    finally:
        conns.close()


def test_unknown_key_is_refused_before_any_request(ring: KeyRing, node: EchoNode) -> None:
    conns = Connections(zmq.Context.instance(), security=ring.client("mallory"))
    try:
        with pytest.raises(errors.AuthenticationFailedError, match="does not know this client's key"):
            ask(conns, node.address)
    finally:
        conns.close()
    assert node.requests == 0
    assert any("unregistered key" in why for _, why in node.refusals)


def test_plaintext_client_gets_a_clear_error(node: EchoNode) -> None:
    conns = Connections(zmq.Context.instance(), security=None)
    try:
        with pytest.raises(errors.AuthenticationFailedError, match="requires CURVE"):
            ask(conns, node.address)
    finally:
        conns.close()
    assert node.requests == 0


def test_wrong_server_key_fails(ring: KeyRing, node: EchoNode) -> None:
    keys.generate_key_pair(ring.dir, "impostor")
    wrong = ClientSecurity.from_files(ring.dir / "alice.key_secret", ring.dir / "impostor.key")
    conns = Connections(zmq.Context.instance(), security=wrong)
    try:
        with pytest.raises(errors.FabricError):
            ask(conns, node.address)
    finally:
        conns.close()
    assert node.requests == 0


def test_replication_domain_admits_only_nodes(ring: KeyRing) -> None:
    n = EchoNode(ring, DOMAIN_REPLICATION)
    try:
        as_node = Connections(zmq.Context.instance(), security=ring.client("node-1"))
        as_user = Connections(zmq.Context.instance(), security=ring.client("alice"))
        try:
            assert ask(as_node, n.address) == "user=node-1"
            with pytest.raises(errors.AuthenticationFailedError):
                ask(as_user, n.address)
        finally:
            as_node.close()
            as_user.close()
        assert any("is not a node" in why for _, why in n.refusals)
    finally:
        n.close()


def test_revoked_key_is_refused_on_the_next_connection(ring: KeyRing, node: EchoNode) -> None:
    node.authorizer = Authorizer({}, [])
    conns = Connections(zmq.Context.instance(), security=ring.client("alice"))
    try:
        with pytest.raises(errors.AuthenticationFailedError):
            ask(conns, node.address)
    finally:
        conns.close()
