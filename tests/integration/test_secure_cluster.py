"""A secure cluster on real processes: CURVE on every node socket, ACLs, quotas, digest ACLs.

One three-node cluster started with ``LocalCluster(secure=True)`` (what ``fabric up
--secure`` runs) is shared by the tests; each test uses its own principal and topics.
"""

from __future__ import annotations

import json
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

from fabric import errors
from fabric.auth import store
from fabric.auth.acl import AclEntry, Role
from fabric.auth.curve import ClientSecurity
from fabric.auth.keys import generate_key_pair, load_key_pair
from fabric.auth.quota import Quota
from fabric.local import LocalCluster, LocalZooKeeper
from fabric.local_security import LocalSecurity
from fabric.protocol.apis import ApiKey
from fabric.transport import Connections
from fabric.zk import close_client, live_nodes
from sdk import Admin, Producer
from tests.conftest import make_cluster

REPO = Path(__file__).resolve().parents[2]
CHANGE_VISIBLE_S = 1.0  # the issue: an ACL change is effective within a second
ANSWER_WAIT_S = 10.0


@pytest.fixture(scope="module")
def secure(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = make_cluster(zk_server, tmp_path_factory.mktemp("secure"), secure=True, sequencer_count=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _security(cluster: LocalCluster) -> LocalSecurity:
    assert cluster.security is not None
    return cluster.security


@pytest.fixture(scope="module")
def admin(secure: LocalCluster) -> Iterator[Admin]:
    with Admin(secure.bootstrap, security=_security(secure).client()) as a:
        yield a


def _user(cluster: LocalCluster) -> tuple[str, ClientSecurity]:
    """A new principal, once every node knows its key: nodes learn keys through a ZooKeeper
    watch, and on a loaded machine a request right after the registration could reach a
    node before it (a CI-like run here: 'the node does not know this client's key')."""
    name = f"user-{uuid.uuid4().hex[:8]}"
    security = _security(cluster)
    security.register(name, Role.USER)
    client = security.client(name)
    zk = security.connect()
    try:
        addresses = [info.address for info in live_nodes(zk).values()]
    finally:
        close_client(zk)
    deadline = time.monotonic() + ANSWER_WAIT_S
    for address in addresses:
        while True:
            conns = Connections(security=client)
            try:
                conns.request(address, ApiKey.API_VERSIONS, {}, timeout_ms=int(ANSWER_WAIT_S * 1000))
                break
            except errors.AuthenticationFailedError:
                assert time.monotonic() < deadline, f"node {address} never learned the key of {name}"
                time.sleep(0.05)
            finally:
                conns.close()
    return name, client


def _acl(cluster: LocalCluster, principal: str, operation: str, resource: str, pattern: str,
         pattern_type: str = "literal", *, remove: bool = False) -> None:
    zk = _security(cluster).connect()
    try:
        entry = AclEntry.build(principal, operation, resource, pattern, pattern_type)
        (store.remove_acl if remove else store.add_acl)(zk, entry)
    finally:
        close_client(zk)


def _topic(admin: Admin, prefix: str = "sec") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin.create_topic(name, partitions=1, replication_factor=3)
    return name


def _leader(admin: Admin, topic: str) -> str:
    description = admin.describe_topic(topic)
    leader_id = description.partitions[0].leader
    return admin.nodes()[leader_id]


def _fetch(security: ClientSecurity | None, address: str, topic: str, replica_id: int = -1) -> None:
    conns = Connections(security=security)
    try:
        conns.request(address, ApiKey.FETCH, {
            "replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
            "partitions": [{"topic": topic, "partition": 0, "fetch_offset": 0, "partition_bytes_max": 1 << 20,
                            "current_leader_epoch": -1}]}, timeout_ms=int(ANSWER_WAIT_S * 1000))
    finally:
        conns.close()


def _produce(security: ClientSecurity, cluster: LocalCluster, topic: str, count: int = 1, size: int = 10) -> None:
    with Producer(cluster.bootstrap, security=security, acks="all", delivery_timeout_ms=30_000) as p:
        futures = [p.send(topic, os.urandom(size)) for _ in range(count)]  # incompressible: quotas count wire bytes
        p.flush(timeout=60)
        for future in futures:
            future.result(0)


def test_unknown_key_is_refused_before_any_request(secure: LocalCluster, admin: Admin, tmp_path: Path) -> None:
    _, secret = generate_key_pair(tmp_path, "stranger")
    stranger = ClientSecurity.from_files(secret, _security(secure).server_public_key_file)
    name = f"never-{uuid.uuid4().hex[:8]}"
    address = next(iter(admin.nodes().values()))
    conns = Connections(security=stranger)
    try:
        with pytest.raises(errors.AuthenticationFailedError, match="does not know this client's key"):
            conns.request(address, ApiKey.CREATE_TOPIC, {"name": name, "partitions": 1, "replication_factor": 1,
                                                         "configs": []}, timeout_ms=5_000)
    finally:
        conns.close()
    assert name not in admin.list_topics()


def test_plaintext_client_gets_a_clear_error_not_a_hang(secure: LocalCluster, admin: Admin) -> None:
    address = next(iter(admin.nodes().values()))
    with pytest.raises(errors.AuthenticationFailedError, match="requires CURVE"):
        _fetch(None, address, "anything")


def test_registered_key_without_acl_is_denied(secure: LocalCluster, admin: Admin) -> None:
    topic = _topic(admin)
    name, security = _user(secure)
    with pytest.raises(errors.AuthorizationFailedError, match=f"may not describe topic '{topic}'"):
        _produce(security, secure, topic)
    with pytest.raises(errors.AuthorizationFailedError, match="consume"):
        _fetch(security, _leader(admin, topic), topic)
    log = "".join((secure.base_dir / f"node{i}.log").read_text() for i in secure.nodes)
    assert f"principal '{name}' may not" in log


def test_produce_but_not_consume(secure: LocalCluster, admin: Admin) -> None:
    topic = _topic(admin)
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", topic)
    _produce(security, secure, topic, count=5)
    with pytest.raises(errors.AuthorizationFailedError, match="consume"):
        _fetch(security, _leader(admin, topic), topic)
    other = _topic(admin)
    with pytest.raises(errors.AuthorizationFailedError, match=f"may not describe topic '{other}'"):
        _produce(security, secure, other)


def test_prefix_acl_and_revocation_within_a_second(secure: LocalCluster, admin: Admin) -> None:
    name, security = _user(secure)
    prefix = f"team-{uuid.uuid4().hex[:6]}."
    inside, outside = _topic(admin, prefix + "a"), _topic(admin, "elsewhere")
    _acl(secure, name, "consume", "topic", prefix, "prefix")
    deadline = time.monotonic() + CHANGE_VISIBLE_S
    while True:  # the grant is visible within a second
        try:
            _fetch(security, _leader(admin, inside), inside)
            break
        except errors.AuthorizationFailedError:
            assert time.monotonic() < deadline, "the prefix ACL was not effective within a second"
            time.sleep(0.05)
    with pytest.raises(errors.AuthorizationFailedError):
        _fetch(security, _leader(admin, outside), outside)
    _acl(secure, name, "consume", "topic", prefix, "prefix", remove=True)
    deadline = time.monotonic() + CHANGE_VISIBLE_S
    while True:
        try:
            _fetch(security, _leader(admin, inside), inside)
        except errors.AuthorizationFailedError:
            break
        assert time.monotonic() < deadline, "the revocation was not effective within a second"
        time.sleep(0.05)


def test_user_and_rogue_keys_cannot_replicate(secure: LocalCluster, admin: Admin, tmp_path: Path) -> None:
    topic = _topic(admin)
    name, security = _user(secure)
    _acl(secure, name, "all", "topic", topic)
    leader = _leader(admin, topic)
    # A registered user key cannot fetch as a follower ...
    with pytest.raises(errors.AuthorizationFailedError, match="replicate"):
        _fetch(security, leader, topic, replica_id=99)
    # ... and neither it nor an unregistered key receives the replication stream; a node key does.
    leader_id = admin.describe_topic(topic).partitions[0].leader
    zk = _security(secure).connect()
    try:
        import json

        raw, _ = zk.get(f"/fabric/nodes/{leader_id}")
        replication_address = json.loads(raw)["replication_address"]
    finally:
        close_client(zk)
    _, rogue_secret = generate_key_pair(tmp_path, "rogue")
    server_key = _security(secure).server_public_key_file
    keys = {"rogue": ClientSecurity.from_files(rogue_secret, server_key), "user": security,
            "node": ClientSecurity.from_files(_security(secure).key_file("node-1"), server_key)}
    ctx = zmq.Context.instance()
    subs = {}
    for who, key in keys.items():
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        key.apply(sub)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(replication_address)
        subs[who] = sub
    try:
        time.sleep(0.5)  # let the handshakes finish (or fail) before the data is published
        _produce(security, secure, topic, count=20)
        received = {who: sub.poll(3_000 if who == "node" else 500) != 0 for who, sub in subs.items()}
    finally:
        for sub in subs.values():
            sub.close(linger=0)
    assert received == {"rogue": False, "user": False, "node": True}


def test_quota_slows_a_greedy_producer_and_loses_nothing(secure: LocalCluster, admin: Admin) -> None:
    topic = _topic(admin)
    name, security = _user(secure)
    _acl(secure, name, "all", "topic", topic)
    rate = 200_000
    zk = _security(secure).connect()
    try:
        store.set_quota(zk, name, Quota(rate))
    finally:
        close_client(zk)
    time.sleep(CHANGE_VISIBLE_S)
    count, size = 120, 10_000  # 1.2 MB: six seconds at the quota, less the one-second burst
    start = time.monotonic()
    _produce(security, secure, topic, count=count, size=size)
    elapsed = time.monotonic() - start
    # A lower bound only: the throttle holds responses at least this long, whatever the load.
    assert elapsed >= (count * size / rate) - 2.0, f"{count * size} bytes in {elapsed:.1f} s: not throttled"
    conns = Connections(security=_security(secure).client())
    try:
        answer = conns.request(_leader(admin, topic), ApiKey.LIST_OFFSETS,
                               {"partitions": [{"topic": topic, "partition": 0, "timestamp": -1}]})
    finally:
        conns.close()
    assert answer.body["partitions"][0]["offset"] == count  # every record written, none dropped


def test_zookeeper_without_the_digest_cannot_rewrite_the_routing_map(secure: LocalCluster, admin: Admin) -> None:
    topic = _topic(admin)
    outsider = store.connect(secure.zk_address)
    try:
        data, _ = outsider.get(f"/fabric/topics/{topic}")  # the world may read (zk:// bootstrap)
        with pytest.raises(NoAuthError):
            outsider.set(f"/fabric/topics/{topic}", data)
        with pytest.raises(NoAuthError):
            outsider.delete(f"/fabric/nodes/{next(iter(secure.nodes))}")
    finally:
        close_client(outsider)


def test_strict_order_topic_through_a_secure_sequencer(secure: LocalCluster, admin: Admin) -> None:
    """The nodes reach the sequencer with their node keys; a user key is refused by it."""
    topic = f"strict-{uuid.uuid4().hex[:8]}"
    admin.create_topic(topic, partitions=1, replication_factor=3, strict_order=True)
    operator = _security(secure).client()
    with Producer(secure.bootstrap, security=operator, acks="all") as producer:
        metadata = producer.send(topic, b"ordered").result(60)
    assert metadata.offset >= 0
    zk = _security(secure).connect()
    try:
        from fabric import sequencer_client

        active = sequencer_client.read_active(zk)
    finally:
        close_client(zk)
    assert active is not None
    _, user = _user(secure)
    conns = Connections(security=user)
    try:
        with pytest.raises(errors.AuthenticationFailedError):
            conns.request(active.address, ApiKey.API_VERSIONS, {}, timeout_ms=5_000)
    finally:
        conns.close()


def test_queue_workers_need_consume_on_the_topic_and_the_group(secure: LocalCluster, admin: Admin) -> None:
    from sdk import QueueConsumer

    queue = f"secq-{uuid.uuid4().hex[:8]}"
    admin.create_queue(queue, partitions=1)
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", queue)
    _acl(secure, name, "consume", "topic", queue)
    _produce(security, secure, queue, count=3)
    with QueueConsumer(secure.bootstrap, queue, "workers", security=security) as worker, \
            pytest.raises(errors.AuthorizationFailedError, match="group"):
        worker.receive(10, 2_000)  # no ACL on the group yet: refused, not an endless empty poll
    _acl(secure, name, "consume", "group", "workers")
    time.sleep(CHANGE_VISIBLE_S)
    with QueueConsumer(secure.bootstrap, queue, "workers", security=security) as worker:
        got = []
        deadline = time.monotonic() + ANSWER_WAIT_S
        while len(got) < 3 and time.monotonic() < deadline:
            batch = worker.receive(10, 1_000)
            got += batch
            if batch:
                worker.ack(batch)
    assert len(got) == 3


def test_a_user_key_sending_the_nodes_produce_version_still_has_its_queue_headers_checked(
        secure: LocalCluster, admin: Admin) -> None:
    """PRODUCE version 1 is the nodes' own (dead letters keep whatever headers their source
    topic's producers wrote); a user key that sent it skipped the queue-header checks (a
    client written from the docs found a priority of 10 stored and handed out as 4)."""
    from fabric.protocol import apis
    from fabric.protocol import batch as batch_format
    from fabric.protocol import queues as qp

    queue = f"secv1-{uuid.uuid4().hex[:8]}"
    admin.create_queue(queue, partitions=1)
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", queue)
    time.sleep(CHANGE_VISIBLE_S)
    raw = batch_format.encode_batch([int(time.time() * 1000)], [None], [b"v"], [[(qp.HEADER_PRIORITY, b"10")]])
    frames = apis.encode_request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5_000, "entries": [
        {"topic": queue, "partition": 0}]}, 1, api_version=apis.INTERNAL_VERSION, batches=[raw])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    security.apply(sock)
    sock.connect(_leader(admin, queue))
    try:
        sock.send_multipart(frames)
        assert sock.poll(int(ANSWER_WAIT_S * 1000)), "no answer to the PRODUCE"
        result = apis.decode_response(sock.recv_multipart()).body["results"][0]
    finally:
        sock.close(linger=0)
    assert result["error"] == errors.InvalidPriorityError.code, result
    assert result["base_offset"] == -1


def test_a_consumer_group_on_a_secure_cluster(secure: LocalCluster, admin: Admin) -> None:
    """The group coordinator's requests to its own node (creating __consumer_offsets,
    writing commits, loading them) went in plaintext, which the node's CURVE socket
    refuses: FIND_COORDINATOR answered 'creating the offsets topic' for ever and no group
    worked on a secure cluster. A user with consume on the topic and the group joins,
    reads, commits, and a second member of the group resumes at the commit."""
    from sdk import Consumer, TopicPartition

    topic = _topic(admin, "secg")
    group = f"secg-{uuid.uuid4().hex[:8]}"
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", topic)
    _acl(secure, name, "consume", "topic", topic)
    _acl(secure, name, "consume", "group", group)
    time.sleep(CHANGE_VISIBLE_S)
    _produce(security, secure, topic, count=5)
    options = {"group_id": group, "security": security, "auto_offset_reset": "earliest",
               "enable_auto_commit": False, "session_timeout_ms": 6_000, "heartbeat_interval_ms": 500}
    with Consumer(secure.bootstrap, **options) as consumer:  # type: ignore[arg-type]
        consumer.subscribe([topic])
        got: list[object] = []
        deadline = time.monotonic() + 60
        while len(got) < 5 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=500)
        assert len(got) == 5
        consumer.commit({TopicPartition(topic, 0): 3})
    with Consumer(secure.bootstrap, **options) as consumer:  # type: ignore[arg-type]
        assert consumer.committed(TopicPartition(topic, 0)) == 3


def test_a_refused_metadata_answer_does_not_say_whether_the_topic_exists(secure: LocalCluster, admin: Admin) -> None:
    topic = _topic(admin)
    _name, security = _user(secure)
    conns = Connections(security=security)
    try:
        address = next(iter(admin.nodes().values()))
        entries = []
        for asked in (topic, f"no-such-{uuid.uuid4().hex[:8]}"):
            body = conns.request(address, ApiKey.METADATA, {"topics": [asked]}, timeout_ms=int(ANSWER_WAIT_S * 1000)).body
            (entry,) = body["topics"]
            assert entry["error"] == errors.AuthorizationFailedError.code
            entries.append({k: v for k, v in entry.items() if k != "name"})
        assert entries[0] == entries[1]  # message_bytes_max and strict_order gave an existing topic away
    finally:
        conns.close()


def test_a_connection_made_with_a_rotated_key_gets_nothing(secure: LocalCluster, admin: Admin, tmp_path: Path) -> None:
    """docs/SECURITY.md rotates a key by removing the principal and adding it again with a
    new key. A connection the old key had made checked only the name, so once the name was
    back it got the principal's rights again (a name reused for someone else would have
    handed them the new owner's rights). It is refused now; the new key works."""
    topic = _topic(admin)
    name, old = _user(secure)
    _acl(secure, name, "consume", "topic", topic)
    time.sleep(CHANGE_VISIBLE_S)
    leader = _leader(admin, topic)
    conns = Connections(security=old)
    try:
        def fetch() -> None:
            conns.request(leader, ApiKey.FETCH, {
                "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                "partitions": [{"topic": topic, "partition": 0, "fetch_offset": 0, "partition_bytes_max": 1 << 20,
                                "current_leader_epoch": -1}]}, timeout_ms=int(ANSWER_WAIT_S * 1000))

        fetch()  # allowed, on this connection
        _new_public, new_secret = generate_key_pair(tmp_path, "rotated")
        security = _security(secure)
        zk = security.connect()
        try:
            store.remove_principal(zk, name)
            store.add_principal(zk, name, load_key_pair(new_secret).public_key, Role.USER)
        finally:
            close_client(zk)
        time.sleep(CHANGE_VISIBLE_S)
        with pytest.raises(errors.AuthorizationFailedError, match="key changed"):
            fetch()  # the old key's connection, the name registered again with another key
    finally:
        conns.close()
    _fetch(ClientSecurity.from_files(new_secret, security.server_public_key_file), leader, topic)  # the new key works


def test_group_patterns_and_offset_listing_keep_to_topics_the_principal_may_describe(
        secure: LocalCluster, admin: Admin) -> None:
    """A pattern subscription was resolved against every topic: a member whose principal
    may read only some of them was given partitions of the others too (learning their
    names, then failing to fetch them). And OFFSET_FETCH of all partitions listed the
    group's offsets on every topic. Both now keep to the topics the principal may describe."""
    from sdk import Consumer, TopicPartition

    stem = f"secp-{uuid.uuid4().hex[:8]}"
    mine, hidden = f"{stem}-mine", f"{stem}-hidden"
    for topic in (mine, hidden):
        admin.create_topic(topic, partitions=1, replication_factor=3)
    group = f"{stem}-g"
    name, security = _user(secure)
    for operation in ("consume", "describe"):
        _acl(secure, name, operation, "topic", mine)
    _acl(secure, name, "consume", "group", group)
    _acl(secure, name, "describe", "group", group)
    time.sleep(CHANGE_VISIBLE_S)
    # The operator commits on the hidden topic for the group (it is empty: no member yet).
    with Consumer(secure.bootstrap, group_id=group, security=_security(secure).client()) as operator:
        operator.commit({TopicPartition(hidden, 0): 0})
    options = {"group_id": group, "security": security, "auto_offset_reset": "earliest",
               "enable_auto_commit": False, "session_timeout_ms": 6_000, "heartbeat_interval_ms": 500}
    with Consumer(secure.bootstrap, **options) as consumer:  # type: ignore[arg-type]
        consumer.subscribe(pattern=rf"{stem}-.*")
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        for _ in range(5):  # a few more heartbeats: the hidden topic never arrives
            consumer.poll(timeout_ms=200)
        assert {tp.topic for tp in consumer.assignment()} == {mine}
        consumer.commit({TopicPartition(mine, 0): 0})
    with Admin(secure.bootstrap, security=security) as user_admin:
        listed = user_admin._group_call(group, ApiKey.OFFSET_FETCH, {"group_id": group, "partitions": []})
    assert {entry["topic"] for entry in listed["offsets"]} == {mine}
    with Admin(secure.bootstrap, security=_security(secure).client()) as operator_admin:
        listed = operator_admin._group_call(group, ApiKey.OFFSET_FETCH, {"group_id": group, "partitions": []})
    assert {entry["topic"] for entry in listed["offsets"]} == {mine, hidden}


def test_a_consumer_without_consume_acls_raises_instead_of_retrying_for_ever(secure: LocalCluster,
                                                                              admin: Admin) -> None:
    """SECURITY.md: a refusal is AUTHORIZATION_FAILED naming what is missing. A Consumer
    whose FETCH was refused (produce but no consume on the topic) retried it at once,
    for ever, logging a warning per refusal (thousands a second on every node);
    `fabric consume` hung at 40% CPU. Without consume on its group, FIND_COORDINATOR's
    refusal became a retriable "coordinator not available" and poll() returned nothing,
    silently, for ever. Both now raise from poll(), as Kafka's consumer does."""
    from sdk import Consumer, TopicPartition

    topic = _topic(admin, "secr")
    group = f"secr-{uuid.uuid4().hex[:8]}"
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", topic)
    time.sleep(CHANGE_VISIBLE_S)
    _produce(security, secure, topic, count=1)

    def first_refusal(consumer: Consumer) -> errors.AuthorizationFailedError:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                consumer.poll(timeout_ms=200)
            except errors.AuthorizationFailedError as exc:
                return exc
        raise AssertionError("poll() never raised the refusal")

    with Consumer(secure.bootstrap, security=security) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        assert "consume" in str(first_refusal(consumer))
    with Consumer(secure.bootstrap, security=security, group_id=group) as consumer, \
            pytest.raises(errors.AuthorizationFailedError, match=group):
        consumer.subscribe([topic])  # its first heartbeat already asks for the coordinator
        first_refusal(consumer)


def test_the_recorded_digest_is_offered_only_to_the_recorded_cluster(secure: LocalCluster, zk_server: LocalZooKeeper,
                                                                     tmp_path: Path) -> None:
    """`fabric up --secure` records its digest file so that `fabric acl ...` works without
    flags. ZooKeeper's digest scheme sends the password in the clear to the server, so a
    command given another cluster's --bootstrap must not offer it there (it did: the other
    cluster's znodes even came out owned by the recorded cluster's credential)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "local.json").write_text(json.dumps({
        "bootstrap": secure.bootstrap, "zk": secure.zk_address, "zk_digest_file": str(_security(secure).digest_file)}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    env.update(FABRIC_HOME=str(home), PYTHONPATH=str(REPO))

    def fabric(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fabric", *args], env=env, capture_output=True, text=True,
                              timeout=60, check=False)

    other = f"{zk_server.address}/fabric-other-{uuid.uuid4().hex[:8]}"  # a plaintext cluster elsewhere
    result = fabric("acl", "add", "-p", "bob", "-o", "produce", "--topic", "t", "--bootstrap", f"zk://{other}")
    assert result.returncode == 0, result.stderr
    outsider = store.connect(other)
    try:
        acl, _ = outsider.get_acls("/fabric/security/acls")
    finally:
        close_client(outsider)
    assert all(entry.id.scheme != "digest" for entry in acl), acl  # the recorded password never went there

    name = f"rec-{uuid.uuid4().hex[:8]}"  # and the recorded cluster still gets it without flags
    result = fabric("acl", "add", "-p", name, "-o", "produce", "--topic", "t")
    assert result.returncode == 0, result.stderr
    zk = _security(secure).connect()
    try:
        assert any(entry.principal == name for entry in store.list_acls(zk))
    finally:
        close_client(zk)


def test_describing_all_topics_lists_only_those_the_principal_may_describe(secure: LocalCluster,
                                                                           admin: Admin) -> None:
    """`describe` on the cluster lets a principal ask DESCRIBE_TOPICS and DESCRIBE_REPLICAS
    for every topic (`fabric topic describe` with no name). They answered every topic's
    configs and log sizes, those METADATA hides from it included; now they list only the
    topics it may describe, as METADATA's all-topics form does."""
    mine, hidden = _topic(admin, "secd"), _topic(admin, "secd")
    name, security = _user(secure)
    _acl(secure, name, "describe", "cluster", "")
    _acl(secure, name, "describe", "topic", mine)
    address = _leader(admin, hidden)
    conns = Connections(security=security)
    try:
        deadline = time.monotonic() + ANSWER_WAIT_S
        while True:  # both grants reach the node through a watch
            try:
                body = conns.request(address, ApiKey.DESCRIBE_TOPICS, {"names": []}).body
                if mine in {t["name"] for t in body["topics"]}:
                    break
            except errors.AuthorizationFailedError:
                pass
            assert time.monotonic() < deadline, "the grants never reached the node"
            time.sleep(0.05)
        assert hidden not in {t["name"] for t in body["topics"]}
        assert all(t["name"] == mine or not t["name"].startswith("secd-") for t in body["topics"])
        replicas = conns.request(address, ApiKey.DESCRIBE_REPLICAS, {"topics": []}).body
        assert hidden not in {p["topic"] for p in replicas["partitions"]}
        with pytest.raises(errors.AuthorizationFailedError, match=f"may not describe topic '{hidden}'"):
            conns.request(address, ApiKey.DESCRIBE_TOPICS, {"names": [hidden]})  # named: refused, as before
    finally:
        conns.close()
    assert {mine, hidden} <= {t.name for t in admin.describe_topics()}  # the operator (a super key) sees both


def test_an_api_the_node_does_not_serve_is_unknown_api_for_a_user_too(secure: LocalCluster, admin: Admin) -> None:
    """ALLOCATE_IDS is the sequencer's: a node has no handler for it. Sent by a user it was
    refused AUTHORIZATION_FAILED ('may not admin cluster'), by an operator UNKNOWN_API: the
    ACL check ran before the node knew it would not serve the request."""
    _name, security = _user(secure)
    conns = Connections(security=security)
    try:
        with pytest.raises(errors.UnknownApiError, match="no handler"):
            conns.request(next(iter(admin.nodes().values())), ApiKey.ALLOCATE_IDS, {"count": 1, "kind": 0},
                          timeout_ms=int(ANSWER_WAIT_S * 1000))
    finally:
        conns.close()


def test_a_topic_the_producer_may_not_write_fails_alone(secure: LocalCluster, admin: Admin) -> None:
    # The node refuses a PRODUCE whole when one topic in it is refused (PROTOCOL section 12),
    # so the producer sends one topic a request on a secure cluster: a topic the principal
    # may describe (here through consume) but not produce used to fail the batches of a
    # topic it may produce that went to the same leader in the same request.
    allowed = f"sec-{uuid.uuid4().hex[:8]}"
    admin.create_topic(allowed, partitions=3, replication_factor=3)
    refused = _topic(admin)
    name, security = _user(secure)
    _acl(secure, name, "produce", "topic", allowed)
    _acl(secure, name, "consume", "topic", refused)
    leader = admin.describe_topic(refused).partitions[0].leader
    same = next(p.partition for p in admin.describe_topic(allowed).partitions if p.leader == leader)
    with Producer(secure.bootstrap, security=security, acks="all", linger_ms=100, delivery_timeout_ms=30_000) as p:
        assert p.partitions_for(refused) == 1  # described: the producer has its map
        good = [p.send(allowed, b"ok-%d" % i, partition=same) for i in range(5)]
        bad = p.send(refused, b"no", partition=0)
        p.flush(timeout=60)
    for future in good:
        assert future.result(0).partition == same
    with pytest.raises(errors.AuthorizationFailedError, match=f"may not produce topic '{refused}'"):
        bad.result(0)
