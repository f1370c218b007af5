"""The direct plane's registry entries (docs/ZOOKEEPER.md): what a caller accepts, and how
an entry it cannot use is skipped without costing the others. No ZooKeeper here: the
watch is fed children and data by a stand-in."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

import pytest
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler

from fabric import errors
from sdk.direct import _registry as registry
from sdk.direct._client import zookeeper_hosts
from sdk.direct._registry import InstanceInfo

GOOD = {"address": "tcp://127.0.0.1:5555", "version": "1.4", "metadata": {"zone": "eu-1"}, "load": 3,
        "host": "h", "pid": 42, "started_ms": 1_700_000_000_000, "curve_key": ""}


def test_a_full_entry_round_trips() -> None:
    info = InstanceInfo.decode(json.dumps(GOOD).encode())
    assert dataclasses.asdict(info) == GOOD
    assert InstanceInfo.decode(info.encode()) == info


def test_only_the_address_is_required_and_null_reads_as_absent() -> None:
    info = InstanceInfo.decode(json.dumps({"address": "tcp://[::1]:7", "pid": None, "metadata": None,
                                           "future_field": [1]}).encode())
    assert info == InstanceInfo("tcp://[::1]:7")


def test_field_types_cover_every_field() -> None:
    assert set(registry._FIELD_TYPES) == {f.name for f in dataclasses.fields(InstanceInfo)}


@pytest.mark.parametrize("data", [
    {"address": "127.0.0.1:5555"},  # no scheme: ZeroMQ refuses it at connect
    {"address": "not a url"},
    {"address": None},
    {"address": 123},
    {"address": ["x"]},
    {"address": "tcp://*:5555"},
    {"address": "tcp://0.0.0.0:5555"},  # a bind address: a caller elsewhere cannot dial it
    {"address": "tcp://[::]:5555"},
    {"address": "tcp://h:0"},
    {"address": "tcp://h:65536"},
    {"address": "tcp://a b:1"},
    {"address": "tcp://h:1;h:2"},
    {"address": "ipc:///tmp/x"},
    {"address": "tcp://" + "h" * 400 + ":1"},
    {},
    {**GOOD, "load": "3"},
    {**GOOD, "pid": True},
    {**GOOD, "started_ms": "1795509325651"},
    {**GOOD, "started_ms": 1.5},
    {**GOOD, "metadata": ["x"]},
    {**GOOD, "curve_key": 7},
    {**GOOD, "version": 1.4},
    123, None, ["x"], "tcp://127.0.0.1:5555",
])
def test_an_entry_of_the_wrong_shape_is_refused_by_name(data: Any) -> None:
    with pytest.raises(ValueError):
        InstanceInfo.decode(json.dumps(data).encode())


@pytest.mark.parametrize("raw", [b"", b"not json", b"\xff\xfe", b"[" * 100_000])
def test_bytes_that_are_no_json_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        InstanceInfo.decode(raw)


class _Result:
    def __init__(self, value: Any) -> None:
        self._value = value

    def get(self, timeout: float) -> Any:
        return self._value


class _FakeZk:
    """The two calls RegistryWatch makes while children change; counts data reads."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self.reads = 0

    def get_async(self, path: str) -> _Result:
        self.reads += 1
        return _Result((self.data[path.rsplit("/", 1)[1]], None))


def test_the_watch_skips_a_bad_entry_warns_once_and_keeps_the_good(caplog: pytest.LogCaptureFixture) -> None:
    """One bad entry made every caller of the service fail (finding 1 of the audit)."""
    zk = _FakeZk({
        "instance-1": json.dumps(GOOD).encode(),
        "instance-2": json.dumps({"address": "127.0.0.1:5555"}).encode(),
        "instance-3": b"123",
        "instance-4": json.dumps({**GOOD, "address": "tcp://127.0.0.1:6666"}).encode(),
    })
    delivered: list[dict[str, InstanceInfo]] = []
    watch = registry.RegistryWatch(zk, "/fabric/services/s", delivered.append)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="fabric.direct"):
        for children in (["instance-1", "instance-2"], ["instance-1", "instance-2", "instance-3"],
                         ["instance-1", "instance-2", "instance-3", "instance-4"], ["instance-2", "instance-4"]):
            watch._children_changed(children)
    assert [sorted(found) for found in delivered] == [
        ["instance-1"], ["instance-1"], ["instance-1", "instance-4"], ["instance-4"]]
    warned = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(warned) == 2, warned  # one per bad znode, not one per change
    assert any("instance-2" in w and "tcp://HOST:PORT" in w for w in warned)
    assert zk.reads == 4  # every znode read once, the bad ones too
    watch._children_changed([])  # gone: forgotten, so the set stays bounded by the children
    assert not watch._unreadable


@pytest.mark.parametrize("spec, hosts", [
    ("zk://127.0.0.1:2181", "127.0.0.1:2181"),
    ("zk://127.0.0.1:2181/chroot/x", "127.0.0.1:2181/chroot/x"),
    ("zk://a:1,zk://b:2/c", "a:1,b:2/c"),
    ("127.0.0.1:2181/chroot", "127.0.0.1:2181/chroot"),
])
def test_direct_client_takes_zookeeper_with_or_without_its_scheme(spec: str, hosts: str) -> None:
    assert zookeeper_hosts(spec) == hosts


@pytest.mark.parametrize("spec", ["tcp://127.0.0.1:9092", "zk://a:1,tcp://b:2", "zk://"])
def test_direct_client_refuses_what_is_not_zookeeper(spec: str) -> None:
    with pytest.raises(errors.InvalidRequestError):
        zookeeper_hosts(spec)


class _WatchingZk(_FakeZk):
    """Also records the children watches RegistryWatch starts: (parent, callback)."""

    def __init__(self, data: dict[str, bytes]) -> None:
        super().__init__(data)
        self.children_watches: list[Any] = []

    def ChildrenWatch(self, path: str, func: Any) -> None:  # kazoo's name
        self.children_watches.append(func)


def test_a_parent_deleted_and_made_again_gets_a_new_watch_and_no_stale_entries() -> None:
    """A service's znode is a container (ensure_container): once its last instance went,
    ZooKeeper deletes it, and the next instance makes it again. The old children watch may
    have stopped at the NoNode in between, and an entry read under the old parent must
    not stand for a new child of the same name."""
    from types import SimpleNamespace

    zk = _WatchingZk({"instance-a-1": json.dumps(GOOD).encode()})
    delivered: list[dict[str, InstanceInfo]] = []
    watch = registry.RegistryWatch(zk, "/fabric/services/s", delivered.append)  # type: ignore[arg-type]
    watch._parent_changed(b"", SimpleNamespace(czxid=10))
    (first,) = zk.children_watches
    first(["instance-a-1"])
    assert list(delivered[-1]) == ["instance-a-1"]
    watch._parent_changed(b"", SimpleNamespace(czxid=10))  # a data change: the same parent
    assert len(zk.children_watches) == 1

    zk.data["instance-a-1"] = json.dumps({**GOOD, "address": "tcp://127.0.0.1:7777"}).encode()
    watch._parent_changed(b"", SimpleNamespace(czxid=20))  # deleted and made again, unseen in between
    second = zk.children_watches[-1]
    assert len(zk.children_watches) == 2
    assert first(["instance-a-1"]) is False  # the old watch, if still alive, stops and reports nothing
    second(["instance-a-1"])
    assert delivered[-1]["instance-a-1"].address == "tcp://127.0.0.1:7777"  # read again, not the cached entry

    watch._parent_changed(None, None)
    assert delivered[-1] == {}


def test_every_registration_of_a_service_instance_gets_a_fresh_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lost session a service registers again, maybe into its name's container
    znode made anew, whose children are numbered from 0 again: with one token per
    Registration it got its old znode name back and callers took it for the instance that
    had left (found by CI: the request failed with "no instance ... is registered")."""
    prefixes: list[str] = []

    def fake_register(_zk: Any, parent: str, prefix: str, _info: Any, *, container: bool = False) -> str:
        prefixes.append(prefix)
        return f"{parent}/{prefix}0000000000"

    class FakeZk:
        def add_listener(self, _listener: Any) -> None:
            pass

    monkeypatch.setattr(registry, "register", fake_register)
    reg = registry.Registration(FakeZk(), f"{registry.SERVICES}/quotes", "instance-",  # type: ignore[arg-type]
                                InstanceInfo(address="tcp://127.0.0.1:1"), "service quotes")
    first = reg.start()
    reg._register_again()
    assert len(set(prefixes)) == 2 and all(p.startswith("instance-") for p in prefixes)
    assert reg.path != first


def test_a_registration_created_after_its_caller_timed_out_is_deleted(monkeypatch: pytest.MonkeyPatch) -> None:
    """serve() fails when ZooKeeper does not answer the create in time, but the create may
    still be applied later (ZooKeeper slow, not gone): that entry would name a closed port
    for the rest of the session. It is deleted when its answer comes (fault hunt, read in
    the code). kazoo's own handler and async result; the stand-in is only the client."""
    handler = SequentialThreadingHandler()
    handler.start()
    try:
        pending = handler.async_result()
        deleted: list[str] = []

        class SlowZk:
            def create_async(self, *_args: Any, **_kwargs: Any) -> Any:
                return pending

            def delete_async(self, path: str) -> None:
                deleted.append(path)

        monkeypatch.setattr(registry, "ZK_TIMEOUT_S", 0.05)
        with pytest.raises(KazooTimeoutError):
            registry._register(SlowZk(), "/svc", "instance-", InstanceInfo(address="tcp://127.0.0.1:1"),  # type: ignore[arg-type]
                               container=False)
        pending.set("/svc/instance-0000000007")
        deadline = time.monotonic() + 5
        while not deleted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert deleted == ["/svc/instance-0000000007"]
    finally:
        handler.stop()
