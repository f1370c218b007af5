"""Principals and ACLs in a real ZooKeeper: the CLI, the watched cache, digest ACLs, and what
``fabric principal|acl|quota`` tell an operator (a name added twice, a wrong digest, ``acl
list -p`` with the entries for every principal)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from fabric.auth import keys, store
from fabric.auth.acl import Operation, Resource, ResourceType, Role
from fabric.cli import main as fabric_main
from fabric.local import LocalZooKeeper
from fabric.zk import close_client

CHANGE_VISIBLE_S = 1.0  # the issue: ACL changes effective within a second


@pytest.fixture
def zk_url(zk_server: LocalZooKeeper, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FABRIC_ZK_DIGEST_FILE", raising=False)  # only the credentials each test passes
    chroot = f"/sec-{uuid.uuid4().hex[:10]}"
    root = store.connect(zk_server.address)
    try:
        root.ensure_path(chroot)
    finally:
        close_client(root)
    return f"{zk_server.address}{chroot}"


@pytest.fixture
def zk(zk_url: str) -> Iterator[KazooClient]:
    client = store.connect(zk_url)
    try:
        yield client
    finally:
        close_client(client)


def wait_until(condition: object, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError(f"not true within {timeout_s} s")


def test_cli_principals_and_acls(zk_url: str, zk: KazooClient, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    boot = ["--bootstrap", f"zk://{zk_url}"]
    assert fabric_main(["keys", "generate", "alice", "--dir", str(tmp_path)]) == 0
    assert fabric_main(["principal", "add", "alice", "--key", str(tmp_path / "alice.key"), *boot]) == 0
    assert fabric_main(["principal", "add", "bob", "--key", str(tmp_path / "alice.key"), *boot]) != 0  # same key
    assert "already registered" in capsys.readouterr().err
    for bad in (".", ".."):  # not ZooKeeper node names: an internal error before, now a usage error
        with pytest.raises(SystemExit) as exit_info:
            fabric_main(["principal", "add", bad, "--key", str(tmp_path / "alice.key"), *boot])
        assert exit_info.value.code == 2
        assert "not . or .." in capsys.readouterr().err
    assert fabric_main(["principal", "list", *boot]) == 0
    assert "alice\tuser\t" in capsys.readouterr().out
    assert fabric_main(["acl", "add", "-p", "alice", "-o", "produce", "--topic-prefix", "team-a.", *boot]) == 0
    assert fabric_main(["acl", "add", "-p", "alice", "-o", "produce", "--topic-prefix", "team-a.", *boot]) == 0
    assert fabric_main(["acl", "list", *boot]) == 0
    out = capsys.readouterr().out
    assert out.count("alice may produce on topic prefix 'team-a.'") == 3  # added, already there, listed once
    assert len(store.list_acls(zk)) == 1
    assert fabric_main(["acl", "remove", "-p", "alice", "-o", "produce", "--topic-prefix", "team-a.", *boot]) == 0
    assert fabric_main(["acl", "remove", "-p", "alice", "-o", "produce", "--topic-prefix", "team-a.", *boot]) != 0
    assert "no such ACL entry" in capsys.readouterr().err
    assert fabric_main(["principal", "remove", "alice", *boot]) == 0
    assert store.list_principals(zk) == []


def test_cli_refuses_an_acl_that_allows_nothing(zk_url: str, zk: KazooClient,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`produce --cluster` and the like were stored and never allowed a request; now the
    add fails with the operations the resource takes and stores nothing. An entry for a
    principal not registered yet is kept (granting before the key exists, as Kafka), with
    a note, so a misspelt name does not pass unseen."""
    boot = ["--bootstrap", f"zk://{zk_url}"]
    capsys.readouterr()
    for bad in (["-o", "produce", "--cluster"], ["-o", "admin", "--topic", "t"], ["-o", "describe", "--service", "s"]):
        assert fabric_main(["acl", "add", "-p", "alice", *bad, *boot]) != 0
        err = capsys.readouterr().err
        assert "allows no request" in err and "Traceback" not in err
    assert fabric_main(["acl", "add", "-p", "no such", "-o", "produce", "--topic", "t", *boot]) != 0
    assert "principal name 'no such'" in capsys.readouterr().err
    assert store.list_acls(zk) == []
    assert fabric_main(["acl", "add", "-p", "carol", "-o", "alter", "--cluster", *boot]) == 0
    assert "no principal 'carol' is registered yet" in capsys.readouterr().err
    assert fabric_main(["acl", "add", "-p", "*", "-o", "describe", "--topic-prefix", "", *boot]) == 0
    assert "note:" not in capsys.readouterr().err
    assert len(store.list_acls(zk)) == 2


def test_cache_sees_changes_within_a_second(zk: KazooClient, tmp_path: Path) -> None:
    cache = store.SecurityCache(zk)
    cache.start()
    try:
        public, _ = keys.generate_key_pair(tmp_path, "carol")
        key = keys.load_key_pair(public).public_key
        store.add_principal(zk, "carol", key)
        wait_until(lambda: cache.authorizer.principal_for_key(key.decode()) is not None, CHANGE_VISIBLE_S)
        events = Resource(ResourceType.TOPIC, "events")
        assert not cache.authorizer.authorize("carol", Operation.CONSUME, events)
        entry = store.AclEntry.build("carol", "consume", "topic", "events")
        store.add_acl(zk, entry)
        wait_until(lambda: cache.authorizer.authorize("carol", Operation.CONSUME, events), CHANGE_VISIBLE_S)
        store.remove_acl(zk, entry)
        wait_until(lambda: not cache.authorizer.authorize("carol", Operation.CONSUME, events), CHANGE_VISIBLE_S)
        store.remove_principal(zk, "carol")
        wait_until(lambda: cache.authorizer.principal_for_key(key.decode()) is None, CHANGE_VISIBLE_S)
    finally:
        cache.close()


def test_concurrent_acl_writers_both_land(zk_url: str, zk: KazooClient) -> None:
    other = store.connect(zk_url)
    try:
        entries = [store.AclEntry.build(f"p{i}", "produce", "topic", "t") for i in range(20)]
        import threading

        threads = [threading.Thread(target=store.add_acl, args=(other if i % 2 else zk, e)) for i, e in enumerate(entries)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert set(store.list_acls(zk)) == set(entries)
    finally:
        close_client(other)


def test_digest_acls_keep_other_clients_read_only(zk_url: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    digest = store.write_digest(tmp_path / "zk_digest")
    secure = store.connect(zk_url, digest)
    plain = store.connect(zk_url)
    try:
        store.add_principal(secure, "ops", "b" * 40)
        store.add_acl(secure, store.AclEntry.build("ops", "admin", "cluster", ""))
        secure.ensure_path("/fabric/topics/t/partitions")
        assert store.list_principals(plain)[0].name == "ops"  # the world may read
        with pytest.raises(NoAuthError):
            plain.set(store.ACLS, b"{}")
        with pytest.raises(NoAuthError):
            plain.create("/fabric/topics/t/partitions/0", b"{}")
        with pytest.raises(NoAuthError):
            plain.delete(store.principal_path("ops"))
        boot = ["--bootstrap", f"zk://{zk_url}"]
        assert fabric_main(["acl", "add", "-p", "x", "-o", "produce", "--topic", "t", *boot]) != 0
        assert "zk-digest-file" in capsys.readouterr().err
        assert fabric_main(["acl", "add", "-p", "x", "-o", "produce", "--topic", "t", *boot,
                            "--zk-digest-file", str(tmp_path / "zk_digest")]) == 0
    finally:
        close_client(secure)
        close_client(plain)


def test_quotas_cli_and_cache(zk_url: str, zk: KazooClient, capsys: pytest.CaptureFixture[str]) -> None:
    cache = store.SecurityCache(zk)
    cache.start()
    try:
        boot = ["--bootstrap", f"zk://{zk_url}"]
        assert fabric_main(["quota", "set", "alice", "--produce-bytes-per-s", "1000", *boot]) == 0
        assert fabric_main(["quota", "set", "*", "--produce-bytes-per-s", "5000", *boot]) == 0
        with pytest.raises(SystemExit) as refused:  # a usage error while parsing (it went to ZooKeeper, exit 1)
            fabric_main(["quota", "set", "alice", "--produce-bytes-per-s", "0", *boot])
        assert refused.value.code == 2
        wait_until(lambda: set(cache.quotas) == {"alice", "*"}, CHANGE_VISIBLE_S)
        assert fabric_main(["quota", "list", *boot]) == 0
        assert "alice\tproduce_bytes_per_s=1000" in capsys.readouterr().out
        assert fabric_main(["quota", "remove", "alice", *boot]) == 0
        wait_until(lambda: set(cache.quotas) == {"*"}, CHANGE_VISIBLE_S)
        capsys.readouterr()
        assert fabric_main(["quota", "remove", "alice", *boot]) != 0  # said "removed" and exited 0
        assert "no quota to remove" in capsys.readouterr().err
    finally:
        cache.close()


def _public_key(tmp_path: Path, name: str) -> str:
    public, _ = keys.generate_key_pair(tmp_path, name)
    return str(public)


def test_adding_a_principal_name_twice_says_the_name_exists(zk_url: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric principal add bob` a second time said "that public key is already registered
    as principal 'bob'"; the key conflict stays for another name with the same key."""
    boot = ["--bootstrap", f"zk://{zk_url}"]
    bob, other = _public_key(tmp_path, "bob"), _public_key(tmp_path, "other")
    assert fabric_main(["principal", "add", "bob", "--key", bob, *boot]) == 0
    capsys.readouterr()
    for key in (bob, other):  # his own key again, or a new one: the name is what conflicts
        assert fabric_main(["principal", "add", "bob", "--key", key, *boot]) == 1
        err = capsys.readouterr().err
        assert "principal 'bob' already exists" in err and "fabric principal remove bob" in err, err
        assert "already registered" not in err
    assert fabric_main(["principal", "add", "carol", "--key", bob, *boot]) == 1
    assert "that public key is already registered as principal 'bob'" in capsys.readouterr().err


def test_a_wrong_digest_is_reported_as_wrong_not_as_missing(zk_url: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """ZooKeeper accepts any digest at login and refuses the write: the CLI said "pass
    --zk-digest-file" to a user who had passed one."""
    digest = store.write_digest(tmp_path / "zk.digest")
    owner = store.connect(zk_url, digest)
    try:
        store.add_principal(owner, "ops", "b" * 40, Role.SUPER)  # the security znodes, owned by the digest
    finally:
        close_client(owner)
    store.write_digest(tmp_path / "wrong.digest")  # same user, another password
    boot = ["--bootstrap", f"zk://{zk_url}"]
    acl = ["acl", "add", "-p", "x", "-o", "produce", "--topic", "t", *boot]
    capsys.readouterr()
    assert fabric_main([*acl, "--zk-digest-file", str(tmp_path / "wrong.digest")]) == 1
    err = capsys.readouterr().err
    assert f"with the digest in {tmp_path / 'wrong.digest'} (argument --zk-digest-file)" in err, err
    assert "wrong user or password" in err and "pass --zk-digest-file" not in err
    assert fabric_main(acl) == 1  # no digest at all: still told to pass one
    assert "pass --zk-digest-file" in capsys.readouterr().err
    assert fabric_main([*acl, "--zk-digest-file", str(tmp_path / "zk.digest")]) == 0


def test_acl_list_for_a_principal_shows_what_applies_to_it(zk_url: str, zk: KazooClient, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`fabric acl list -p alice` left out the '*' entries, which apply to alice too; a super
    key's entries do not tell what it may do, and an unregistered name's apply to nobody."""
    boot = ["--bootstrap", f"zk://{zk_url}"]
    store.add_principal(zk, "alice", keys.load_key_pair(_public_key(tmp_path, "alice")).public_key)
    store.add_principal(zk, "ops", keys.load_key_pair(_public_key(tmp_path, "ops")).public_key, Role.SUPER)
    for principal, operation, where in (("alice", "produce", "--topic"), ("*", "describe", "--topic-prefix"),
                                        ("bob", "consume", "--topic")):
        store.add_acl(zk, store.AclEntry.build(principal, operation, "topic", "public." if principal == "*" else "t",
                                               "prefix" if where == "--topic-prefix" else "literal"))
    capsys.readouterr()
    assert fabric_main(["acl", "list", "-p", "alice", *boot]) == 0
    shown = capsys.readouterr()
    assert shown.out.splitlines() == [
        "alice may produce on topic 't'",
        "* may describe on topic prefix 'public.'   (from '*': applies to every principal)",
    ]
    assert shown.err == ""
    assert fabric_main(["acl", "list", "-p", "ops", *boot]) == 0
    assert "ops has role super: every operation on every resource is allowed" in capsys.readouterr().err
    assert fabric_main(["acl", "list", "-p", "nobody", *boot]) == 0
    assert "no principal 'nobody' is registered" in capsys.readouterr().err
