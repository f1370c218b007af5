"""What ``fabric principal|acl|quota`` tell an operator, on a real ZooKeeper: a name added
twice, a wrong digest, and ``acl list -p`` with the entries for every principal. Each test
takes a chroot of its own on the session's ZooKeeper (no nodes: these commands talk to
ZooKeeper only)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from fabric.auth import keys, store
from fabric.auth.acl import Role
from fabric.cli import main as fabric_main
from fabric.local import LocalZooKeeper
from fabric.zk import close_client


@pytest.fixture
def zk_url(zk_server: LocalZooKeeper, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv("FABRIC_ZK_DIGEST_FILE", raising=False)  # only the credentials each test passes
    chroot = f"/sec-cli-{uuid.uuid4().hex[:10]}"
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
