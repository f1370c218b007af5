"""The direct plane on a secure cluster (``LocalCluster(secure=True)``, what ``fabric up
--secure`` runs): CURVE on services and pub/sub, a ZAP handler that admits only registered
keys, the ``service`` ACLs, and the registry under ZooKeeper's digest ACL.

Service instances are real processes (tests/integration/direct_service.py) that take
their credentials from the environment, as a user's service would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL

from fabric import errors
from fabric.auth import store
from fabric.auth.acl import AclEntry, Role
from fabric.auth.keys import generate_key_pair, load_key_pair
from fabric.auth.store import read_digest
from fabric.local import LocalCluster, LocalZooKeeper, ManagedProcess
from fabric.local_security import LocalSecurity
from fabric.protocol import direct as wire
from fabric.zk import close_client
from sdk.direct import DirectClient, DirectCredentials, SyncDirect
from sdk.direct._registry import PUBLISHERS, InstanceInfo, service_path, start_client
from tests.conftest import make_cluster

ROOT = Path(__file__).parents[2]
READY_TIMEOUT_S = 30.0
CHANGE_VISIBLE_S = 1.0  # an ACL change is effective within a second (issue 16)
REFUSED_WAIT_MS = 2_000  # how long a refused handshake is given to (not) answer


@pytest.fixture(scope="module")
def secure(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("direct-secure"), nodes=1, secure=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _security(cluster: LocalCluster) -> LocalSecurity:
    assert cluster.security is not None
    return cluster.security


def _principal(cluster: LocalCluster, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    _security(cluster).register(name, Role.USER)
    return name


def _credentials(cluster: LocalCluster, name: str) -> DirectCredentials:
    security = _security(cluster)
    # The direct registry's credential, not the operator's digest: what a service is given.
    return DirectCredentials.from_files(security.key_file(name), security.direct_digest_file)


def _acl(cluster: LocalCluster, principal: str, operation: str, pattern: str, pattern_type: str = "literal",
         *, remove: bool = False) -> None:
    zk = _security(cluster).connect()
    try:
        entry = AclEntry.build(principal, operation, "service", pattern, pattern_type)
        (store.remove_acl if remove else store.add_acl)(zk, entry)
    finally:
        close_client(zk)


class SecureInstance:
    """A service instance process running as ``principal`` (credentials from the environment)."""

    def __init__(self, cluster: LocalCluster, base: Path, name: str, principal: str) -> None:
        self.handled_path = base / f"{name}.handled"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **_security(cluster).service_environment(principal)}
        self.process = ManagedProcess(
            f"{name}-instance",
            [sys.executable, "-m", "tests.integration.direct_service", cluster.zk_address, name, str(self.handled_path)],
            base / f"{name}.log", env=env)
        self.address = ""

    def start(self) -> SecureInstance:
        self.process.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.process.log_tail(50).splitlines():
                if line.startswith("READY "):
                    self.address = line.split()[1]
                    return self
            if not self.process.running:
                break
            time.sleep(0.02)
        raise RuntimeError(f"instance did not start:\n{self.process.log_tail()}")

    def handled(self) -> list[str]:
        try:
            return self.handled_path.read_text().split()
        except FileNotFoundError:
            return []


@pytest.fixture
def service(secure: LocalCluster, tmp_path: Path) -> Iterator[tuple[str, str, SecureInstance]]:
    """(service name, its server principal, the running instance)."""
    name = f"echo-{uuid.uuid4().hex[:8]}"
    server = _principal(secure, "svc")
    _acl(secure, server, "produce", name)
    instance = SecureInstance(secure, tmp_path, name, server)
    try:
        yield name, server, instance.start()
    finally:
        instance.process.stop()


def test_granted_caller_requests_and_gathers(secure: LocalCluster, service: tuple[str, str, SecureInstance]) -> None:
    name, _server, instance = service
    caller = _principal(secure, "caller")
    _acl(secure, caller, "consume", name)

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, caller)) as client:
            reply = await client.request(name, b"run:one", timeout_ms=10_000, idempotent=True)
            assert reply.payload.startswith(b"one@")
            gathered = await client.gather(name, b"run:two", timeout_ms=10_000)
            assert [r.payload.split(b"@")[0] for r in gathered.replies] == [b"two"] and not gathered.missing

    asyncio.run(run())
    assert instance.handled() == ["one", "two"]


def test_blocking_client_on_a_secure_cluster(secure: LocalCluster, service: tuple[str, str, SecureInstance]) -> None:
    name, _server, instance = service
    caller = _principal(secure, "blocking")
    _acl(secure, caller, "consume", name)
    direct = SyncDirect(secure.zk_address, credentials=_credentials(secure, caller))
    try:
        assert direct.request(name, b"run:sync", timeout_ms=10_000, idempotent=True).payload.startswith(b"sync@")
    finally:
        direct.close()
    assert "sync" in instance.handled()


def test_caller_needs_no_zookeeper_credential(secure: LocalCluster, service: tuple[str, str, SecureInstance]) -> None:
    """Calling reads the registry (world-readable) and uses CURVE: a key is enough. Serving
    writes the registry: without a credential that is refused with a clear error."""
    name, _server, instance = service
    caller = _principal(secure, "keyonly")
    _acl(secure, caller, "consume", name)
    _acl(secure, caller, "produce", f"{name}-mine")
    key_only = DirectCredentials.from_files(_security(secure).key_file(caller))

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address, credentials=key_only) as client:
            reply = await client.request(name, b"run:keyonly", timeout_ms=10_000, idempotent=True)
            assert reply.payload.startswith(b"keyonly@")
            with pytest.raises(errors.AuthorizationFailedError, match="ZooKeeper refused"):
                await client.serve(f"{name}-mine", lambda request: b"")

    asyncio.run(run())
    assert "keyonly" in instance.handled()


def test_caller_without_consume_is_refused_and_nothing_runs(secure: LocalCluster,
                                                            service: tuple[str, str, SecureInstance]) -> None:
    name, _server, instance = service
    caller = _principal(secure, "nosy")

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, caller)) as client:
            with pytest.raises(errors.AuthorizationFailedError, match=f"may not consume service '{name}'"):
                await client.request(name, b"run:denied", timeout_ms=10_000, idempotent=True)
            # Granting takes effect without restarts, and revoking again within a second.
            _acl(secure, caller, "consume", name)
            deadline = time.monotonic() + CHANGE_VISIBLE_S
            while True:
                try:
                    await client.request(name, b"run:granted", timeout_ms=10_000)
                    break
                except errors.AuthorizationFailedError:
                    assert time.monotonic() < deadline, "the grant took longer than a second"
                    await asyncio.sleep(0.05)
            _acl(secure, caller, "consume", name, remove=True)
            deadline = time.monotonic() + CHANGE_VISIBLE_S
            while True:
                try:
                    await client.request(name, b"run:late", timeout_ms=10_000)
                except errors.AuthorizationFailedError:
                    break
                assert time.monotonic() < deadline, "the revocation took longer than a second"
                await asyncio.sleep(0.05)

    asyncio.run(run())
    assert "denied" not in instance.handled() and "granted" in instance.handled()


def _raw_request(address: str, server_key: str, public: bytes, secret: bytes) -> bool:
    """A bare CURVE DEALER sends one REQUEST; True when any answer came back."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.linger = 0
        sock.curve_serverkey = server_key.encode()
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.connect(address)
        # Sent again every 100 ms: a message queued before a refused handshake may be
        # dropped with the connection, and a key registered just now takes a moment to
        # reach the instance's watched cache.
        deadline = time.monotonic() + REFUSED_WAIT_MS / 1000
        while time.monotonic() < deadline:
            try:
                sock.send_multipart(wire.request_frames(7, b"run:raw", timeout_ms=5_000, idempotent=True), zmq.NOBLOCK)
            except zmq.Again:
                pass  # no connection right now (a refused handshake closes it; it is retried)
            if sock.poll(100):
                return True
        return False
    finally:
        sock.close(0)
        ctx.term()


def test_unregistered_key_is_refused_at_the_handshake(secure: LocalCluster, tmp_path: Path,
                                                      service: tuple[str, str, SecureInstance]) -> None:
    _name, server, instance = service
    zk = _security(secure).connect()
    try:
        server_key = next(p.public_key for p in store.list_principals(zk) if p.name == server)
    finally:
        close_client(zk)
    # The trap: a CURVE server without a ZAP handler would answer this key.
    stranger = generate_key_pair(tmp_path, "stranger")
    public, secret = zmq.auth.load_certificate(stranger[1])
    assert secret is not None
    assert not _raw_request(instance.address, server_key, public, secret)
    # The control: a registered key (with no ACL) gets an answer (AUTHORIZATION_FAILED).
    registered = _principal(secure, "registered")
    pair = _credentials(secure, registered)
    time.sleep(CHANGE_VISIBLE_S)  # a new principal reaches the instance's watched cache within a second
    assert _raw_request(instance.address, server_key, pair.public_key, pair.secret_key)
    assert "raw" not in instance.handled()
    # And the SDK refuses to start with an unregistered key.
    digest = _security(secure).digest_file

    async def connect() -> None:
        await DirectClient.connect(secure.zk_address, credentials=DirectCredentials.from_files(stranger[1], digest))

    with pytest.raises(errors.AuthenticationFailedError):
        asyncio.run(connect())


def test_plaintext_client_cannot_register_or_reach_a_secure_instance(
        secure: LocalCluster, service: tuple[str, str, SecureInstance], monkeypatch: pytest.MonkeyPatch) -> None:
    name, _server, instance = service
    for variable in ("FABRIC_KEY_FILE", "FABRIC_ZK_DIGEST_FILE"):
        monkeypatch.delenv(variable, raising=False)

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address) as client:
            assert client.security is None
            with pytest.raises(errors.AuthorizationFailedError, match="ZooKeeper refused"):
                await client.serve(f"rogue-{uuid.uuid4().hex[:6]}", lambda request: b"")
            with pytest.raises(errors.NoServiceAvailable):
                await client.request(name, b"run:plain", timeout_ms=3_000)

    asyncio.run(run())
    assert "plain" not in instance.handled()


def test_registry_znodes_are_digest_protected(secure: LocalCluster, service: tuple[str, str, SecureInstance]) -> None:
    name, _server, _instance = service
    zk = _security(secure).connect()
    try:
        children = zk.get_children(service_path(name))
        acls, _ = zk.get_acls(f"{service_path(name)}/{children[0]}")
    finally:
        close_client(zk)
    schemes = {(acl.id.scheme, acl.perms) for acl in acls if isinstance(acl, ACL)}
    assert ("world", 1) in schemes  # the world may only read
    assert any(scheme == "digest" for scheme, _ in schemes)


def test_direct_credential_writes_the_registry_and_nothing_else(secure: LocalCluster) -> None:
    zk = start_client(secure.zk_address, zk_digest=read_digest(_security(secure).direct_digest_file))
    try:
        with pytest.raises(NoAuthError):
            zk.set(store.ACLS, b'{"version": 1, "acls": []}')
        with pytest.raises(NoAuthError):
            zk.create(store.principal_path("intruder"), b"{}")
        with pytest.raises(NoAuthError):
            zk.create("/fabric/nodes/99", b"{}")
    finally:
        close_client(zk)


def test_serving_needs_produce(secure: LocalCluster) -> None:
    principal = _principal(secure, "squatter")

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, principal)) as client:
            with pytest.raises(errors.AuthorizationFailedError, match="may not produce"):
                await client.serve(f"taken-{uuid.uuid4().hex[:6]}", lambda request: b"")

    asyncio.run(run())


def test_pubsub_with_prefix_acls(secure: LocalCluster) -> None:
    subject_root = f"orders{uuid.uuid4().hex[:6]}"
    publisher, subscriber, outsider = (_principal(secure, p) for p in ("pub", "sub", "outsider"))
    _acl(secure, publisher, "produce", f"{subject_root}.", "prefix")
    _acl(secure, subscriber, "consume", f"{subject_root}.", "prefix")

    async def run() -> None:
        pub = await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, publisher))
        sub = await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, subscriber))
        other = await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, outsider))
        try:
            with pytest.raises(errors.AuthorizationFailedError):
                await other.subscribe(f"{subject_root}.>")
            with pytest.raises(errors.AuthorizationFailedError):
                await sub.publish(f"{subject_root}.created", b"not mine to publish")
            subscription = await sub.subscribe(f"{subject_root}.>")
            await pub.start_publisher()
            deadline = time.monotonic() + 10
            message = None
            while message is None and time.monotonic() < deadline:  # until the SUB has connected
                await pub.publish(f"{subject_root}.eu.created", b"order-1")
                message = await subscription.next(timeout_ms=100)
            assert message is not None and message.payload == b"order-1"
        finally:
            for client in (pub, sub, other):
                await client.close()

    asyncio.run(run())


def test_cli_makes_a_direct_credential(secure: LocalCluster, tmp_path: Path) -> None:
    """`fabric service credential FILE` (the operator): the new credential may register
    services; the previous one is replaced (rotation), so the test puts it back."""
    security = _security(secure)
    path = tmp_path / "direct.digest"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "fabric", "service", "credential", str(path),
                           "--bootstrap", f"zk://{secure.zk_address}", "--zk-digest-file", str(security.digest_file)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert path.stat().st_mode & 0o777 == 0o600
    try:
        zk = start_client(secure.zk_address, zk_digest=read_digest(path))
        try:
            zk.create(f"{service_path('cli-made')}-probe", b"{}", ephemeral=True)
        finally:
            close_client(zk)
    finally:
        admin = security.connect()
        try:
            store.open_direct_registry(admin, read_digest(security.digest_file),
                                       read_digest(security.direct_digest_file))
        finally:
            close_client(admin)


def test_instance_not_allowed_to_serve_gets_no_traffic(secure: LocalCluster,
                                                       service: tuple[str, str, SecureInstance]) -> None:
    """A registered principal without produce on the service writes its own registry entry
    (it holds the direct credential) and binds a CURVE ROUTER: callers never send to it."""
    name, _server, instance = service
    rogue, caller = _principal(secure, "rogue"), _principal(secure, "caller")
    _acl(secure, caller, "consume", name)
    pair = _credentials(secure, rogue)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.curve_server = True
    router.curve_publickey, router.curve_secretkey = pair.public_key, pair.secret_key
    port = router.bind_to_random_port("tcp://127.0.0.1")
    zk = start_client(secure.zk_address, zk_digest=pair.zk_digest)
    try:
        inherited = zk.get_acls(service_path(name))[0]
        info = InstanceInfo.here(f"tcp://127.0.0.1:{port}", curve_key=pair.public_key.decode())
        zk.create(f"{service_path(name)}/instance-", info.encode(), acl=inherited, ephemeral=True, sequence=True)

        async def run() -> None:
            async with await DirectClient.connect(secure.zk_address,
                                                  credentials=_credentials(secure, caller)) as client:
                for i in range(20):
                    await client.request(name, f"run:legit{i}".encode(), timeout_ms=10_000, idempotent=True)
                assert len(client.instances(name)) == 1  # the rogue entry was never admitted

        asyncio.run(run())
        assert not router.poll(100)
        assert len([h for h in instance.handled() if h.startswith("legit")]) == 20
    finally:
        close_client(zk)
        router.close(0)
        ctx.term()


@contextlib.contextmanager
def _registered_pub(secure: LocalCluster, pair: DirectCredentials, *, publisher_id: int) -> Iterator[zmq.Socket[bytes]]:
    """A CURVE PUB made by hand (no SDK checks) and registered as a publisher with the
    principal's direct credential, as a rogue or leaked-key publisher would."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.linger = 0
    pub.curve_server = True
    pub.curve_publickey, pub.curve_secretkey = pair.public_key, pair.secret_key
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    zk = start_client(secure.zk_address, zk_digest=pair.zk_digest)
    try:
        inherited = zk.get_acls(PUBLISHERS)[0]
        info = InstanceInfo.here(f"tcp://127.0.0.1:{port}", metadata={"publisher_id": publisher_id},
                                 curve_key=pair.public_key.decode())
        zk.create(f"{PUBLISHERS}/publisher-", info.encode(), acl=inherited, ephemeral=True, sequence=True)
        yield pub
    finally:
        close_client(zk)
        pub.close(0)
        ctx.term()


def test_subscriber_drops_messages_of_a_publisher_without_produce(secure: LocalCluster) -> None:
    """A registered principal without produce on the subject registers a PUB by hand (it
    holds the direct credential) and publishes: the subscriber drops and counts it."""
    root = f"news{uuid.uuid4().hex[:6]}"
    rogue, subscriber = _principal(secure, "rogue-pub"), _principal(secure, "reader")
    _acl(secure, subscriber, "consume", f"{root}.", "prefix")
    with _registered_pub(secure, _credentials(secure, rogue), publisher_id=7) as pub:

        async def run() -> None:
            async with await DirectClient.connect(secure.zk_address,
                                                  credentials=_credentials(secure, subscriber)) as client:
                subscription = await client.subscribe(f"{root}.>")
                deadline = time.monotonic() + 10
                sequence = 0
                while subscription.refused < 3 and time.monotonic() < deadline:
                    sequence += 1
                    pub.send_multipart(wire.publish_frames(f"{root}.fake", 7, sequence, b"forged", None))
                    assert await subscription.next(timeout_ms=50) is None
                assert subscription.refused >= 3 and subscription.received == 0  # refused before counting

        asyncio.run(run())


def test_callers_stop_using_an_instance_whose_serve_acl_is_revoked(secure: LocalCluster,
                                                                  service: tuple[str, str, SecureInstance]) -> None:
    """docs/SECURITY.md: an instance whose key's principal may not serve S gets no traffic,
    and ACL changes apply without restarts. A caller that already talked to the instance
    kept sending to it after its serve ACL was revoked (it checked only on discovery)."""
    name, server, instance = service
    caller = _principal(secure, "caller")
    _acl(secure, caller, "consume", name)

    async def run() -> None:
        async with await DirectClient.connect(secure.zk_address, credentials=_credentials(secure, caller)) as client:
            await client.request(name, b"run:before", timeout_ms=10_000, idempotent=True)
            _acl(secure, server, "produce", name, remove=True)
            deadline = time.monotonic() + CHANGE_VISIBLE_S + 4.0  # the watch, plus slack for a loaded machine
            refused = False
            while not refused and time.monotonic() < deadline:
                try:
                    await client.request(name, b"run:during", timeout_ms=500, idempotent=True)
                except errors.NoServiceAvailable:
                    refused = True
            assert refused, "the caller kept sending to an instance that may no longer serve the name"
            handled_when_refused = instance.handled()
            with pytest.raises(errors.NoServiceAvailable):
                await client.request(name, b"run:after", timeout_ms=500, idempotent=True)
            assert instance.handled() == handled_when_refused
            _acl(secure, server, "produce", name)  # granted again: the same instance is used again
            deadline = time.monotonic() + CHANGE_VISIBLE_S + 4.0
            while True:
                try:
                    await client.request(name, b"run:again", timeout_ms=500, idempotent=True)
                    break
                except errors.NoServiceAvailable:
                    assert time.monotonic() < deadline, "a re-granted instance was never used again"

    asyncio.run(run())
    assert "before" in instance.handled() and "after" not in instance.handled() and "again" in instance.handled()


def test_subscriber_refuses_a_publisher_whose_key_was_rotated(secure: LocalCluster, tmp_path: Path) -> None:
    """A principal rotated to a new key (removed and added again) keeps its ACLs; a PUB still
    holding the old key (a leaked key, the reason to rotate) must be refused by subscribers,
    as the nodes refuse a connection made with a rotated key. The subscriber checked the
    principal's name captured when it connected, so the old key's messages still arrived."""
    root = f"feed{uuid.uuid4().hex[:6]}"
    publisher, subscriber = _principal(secure, "rotated-pub"), _principal(secure, "reader")
    _acl(secure, publisher, "produce", f"{root}.", "prefix")
    _acl(secure, subscriber, "consume", f"{root}.", "prefix")
    with _registered_pub(secure, _credentials(secure, publisher), publisher_id=9) as pub:

        async def run() -> None:
            async with await DirectClient.connect(secure.zk_address,
                                                  credentials=_credentials(secure, subscriber)) as client:
                subscription = await client.subscribe(f"{root}.>")
                sequence = 0
                deadline = time.monotonic() + 10
                message = None
                while message is None and time.monotonic() < deadline:  # until the SUB has connected
                    sequence += 1
                    pub.send_multipart(wire.publish_frames(f"{root}.a", 9, sequence, b"before", None))
                    message = await subscription.next(timeout_ms=50)
                assert message is not None and message.payload == b"before"

                _, new_secret = generate_key_pair(tmp_path, "rotated")  # the principal's new key
                admin_zk = _security(secure).connect()
                try:
                    store.remove_principal(admin_zk, publisher)
                    store.add_principal(admin_zk, publisher, load_key_pair(new_secret).public_key, Role.USER)
                finally:
                    close_client(admin_zk)
                refused_before = subscription.refused
                deadline = time.monotonic() + CHANGE_VISIBLE_S + 4.0
                # Until the subscriber's watch brings the rotation (within CHANGE_VISIBLE_S) the
                # old key's messages may still pass; once it refuses them, none may.
                while subscription.refused < refused_before + 3:
                    assert time.monotonic() < deadline, "the rotated-out key's messages were still accepted"
                    sequence += 1
                    pub.send_multipart(wire.publish_frames(f"{root}.a", 9, sequence, b"after", None))
                    while await subscription.next(timeout_ms=50) is not None:
                        pass
                while await subscription.next(timeout_ms=200) is not None:
                    pass  # what passed before the refusals began
                refused = subscription.refused
                for _ in range(5):
                    sequence += 1
                    pub.send_multipart(wire.publish_frames(f"{root}.a", 9, sequence, b"late", None))
                    assert await subscription.next(timeout_ms=100) is None, "a message passed after refusals began"
                assert subscription.refused == refused + 5

        asyncio.run(run())
