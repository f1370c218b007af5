"""The direct plane's registry in ZooKeeper (docs/ZOOKEEPER.md)::

    /fabric/services/<name>/instance-<token>-<seq>    ephemeral sequential, JSON InstanceInfo
    /fabric/publishers/publisher-<seq>        ephemeral sequential, JSON InstanceInfo

Callers keep what a watch last delivered: when ZooKeeper is unreachable no watch fires, so
the cached instances keep serving requests (their own heartbeats say who is alive).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    UnimplementedError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.serialization import Create2
from kazoo.protocol.states import KazooState
from kazoo.security import OPEN_ACL_UNSAFE

from fabric import errors
from fabric.auth.store import DIRECT_REGISTRY_ROOTS, secure_zk_kwargs
from fabric.zk import close_client, make_client

SERVICES, PUBLISHERS = DIRECT_REGISTRY_ROOTS  # f"{ROOT}/services", f"{ROOT}/publishers"
INSTANCE_PREFIX = "instance-"
PUBLISHER_PREFIX = "publisher-"
ZK_TIMEOUT_S = 5.0  # one ZooKeeper call
ZK_CONNECT_TIMEOUT_S = 15.0  # a first connection (a loaded machine answers slowly)
SERVICE_NAME_BYTES_MAX = 200
REGISTER_ATTEMPTS_MAX = 3  # a service's container reaped between its creation check and the instance's
CONTAINER_FLAGS = 4  # ZooKeeper's CreateMode.CONTAINER
_SERVICE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# A registered address: tcp://HOST:PORT, HOST a DNS name, an IPv4 address or a bracketed
# IPv6 address (zone id allowed). ZeroMQ's own connect accepts far more (it resolves
# later and fails quietly), so an entry it cannot use is caught here, by name.
ADDRESS_CHARS_MAX = 300  # tcp:// + a DNS name (253 at most) + :port, with room
_TCP_ENDPOINT = re.compile(r"^tcp://(\[[0-9A-Za-z:.%_-]+\]|[A-Za-z0-9_][A-Za-z0-9_.-]*):([0-9]{1,5})$")

log = logging.getLogger("fabric.direct")


def validate_service_name(name: str) -> None:
    if not name or len(name.encode()) > SERVICE_NAME_BYTES_MAX or not _SERVICE_NAME.match(name) or name in (".", ".."):
        raise errors.InvalidRequestError(
            f"invalid service name {name!r}: 1 to {SERVICE_NAME_BYTES_MAX} characters of [A-Za-z0-9._-]")


def service_path(name: str) -> str:
    return f"{SERVICES}/{name}"


@dataclass(frozen=True)
class InstanceInfo:
    address: str  # the instance's ROUTER (or a publisher's PUB) endpoint, tcp://host:port
    version: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    load: int = 0  # requests in flight when last written (refreshed every few seconds)
    host: str = ""
    pid: int = 0
    started_ms: int = 0
    curve_key: str = ""  # secure mode: the instance's CURVE public key (Z85), which callers pin

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> InstanceInfo:
        """An entry written by any registrar (docs/ZOOKEEPER.md): a JSON object whose
        ``address`` is a tcp:// endpoint; the other fields may be absent or null (their
        defaults) but otherwise have their documented types; unknown keys are ignored.
        Raises ValueError saying what is wrong, so one foreign entry is skipped by name
        rather than breaking every caller of the service."""
        try:
            data = json.loads(raw)
        except RecursionError:  # absurdly nested JSON: as unreadable as any other
            raise ValueError("JSON nested too deeply") from None
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {_json_type(data)}")
        values: dict[str, Any] = {}
        for name, kind in _FIELD_TYPES.items():
            value = data.get(name)
            if value is None:
                continue
            # bool is an int to Python, not to JSON: true is no pid.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"{name} is {_json_type(value)} {json.dumps(value)[:60]}, expected {_json_type(kind())}")
            values[name] = value
        address = values.get("address")
        if address is None:
            raise ValueError("no address")
        check_address(address)
        return cls(**values)

    @classmethod
    def here(cls, address: str, *, version: str = "", metadata: dict[str, Any] | None = None,
             curve_key: str = "") -> InstanceInfo:
        return cls(address, version, dict(metadata or {}), 0, socket.gethostname(), os.getpid(),
                   int(time.time() * 1000), curve_key)


# The JSON type of every field of InstanceInfo (docs/ZOOKEEPER.md); decode holds entries to it.
_FIELD_TYPES: dict[str, type] = {"address": str, "version": str, "metadata": dict, "load": int, "host": str,
                                 "pid": int, "started_ms": int, "curve_key": str}
_JSON_TYPE_NAMES: dict[type, str] = {str: "string", int: "integer", dict: "object", list: "array", bool: "boolean",
                                     float: "number"}


def _json_type(value: object) -> str:
    return "null" if value is None else _JSON_TYPE_NAMES.get(type(value), type(value).__name__)


WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "[::]")


def check_address(address: str) -> None:
    """Raises ValueError unless ``address`` is a tcp://HOST:PORT endpoint a caller on
    another host can dial (a wildcard host is a bind address, never registered)."""
    match = _TCP_ENDPOINT.match(address) if len(address) <= ADDRESS_CHARS_MAX else None
    if match is None:
        raise ValueError(f"address {address[:80]!r} is not tcp://HOST:PORT")
    if match.group(1) in WILDCARD_HOSTS:
        raise ValueError(f"address {address!r}: {match.group(1)} is a wildcard, not a host to connect to")
    if not 0 < int(match.group(2)) <= 65535:
        raise ValueError(f"address {address!r}: port {match.group(2)} is not 1-65535")


def reachable_host(zk: KazooClient) -> str:
    """The local address this host uses toward ZooKeeper: the interface the other machines
    of the cluster most likely reach it at (no packet is sent: a UDP connect only picks
    the route). The host name when that cannot be found."""
    try:
        host, port = zk.hosts[0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except (OSError, IndexError, ValueError, TypeError):
        return socket.gethostname()


def advertised_address(bound: str, zk: KazooClient, advertise: str | None = None) -> str:
    """The address to register for a socket bound at ``bound``, which other processes
    connect to: ``advertise`` when given (a NAT, a DNS name), else the bound host, except
    that a wildcard (all interfaces, e.g. ``tcp://0.0.0.0:*``) becomes reachable_host()."""
    scheme_host, _, port = bound.rpartition(":")
    scheme, _, host = scheme_host.partition("://")
    if advertise:
        host = advertise
    elif host in WILDCARD_HOSTS:
        host = reachable_host(zk)
    return f"{scheme}://{host}:{port}"


def _ensure_chroot(hosts: str, zk_options: dict[str, Any]) -> None:
    """kazoo refuses a chroot that does not exist yet; the direct plane creates its own."""
    servers, slash, chroot = hosts.partition("/")
    if not slash or not chroot.strip("/"):
        return
    client = make_client(servers, session_timeout_s=ZK_TIMEOUT_S, **zk_options)
    try:
        client.start(timeout=ZK_CONNECT_TIMEOUT_S)
        client.ensure_path_async("/" + chroot.strip("/")).get(timeout=ZK_TIMEOUT_S)
    finally:
        close_client(client)


def start_client(hosts: str, *, session_timeout_s: float = 10.0, zk_digest: str | None = None) -> KazooClient:
    """A started client; with ``zk_digest`` (secure mode) it authenticates and creates
    every znode under the digest ACL (digest user: all, world: read), as the nodes do."""
    zk_options = secure_zk_kwargs(zk_digest)
    try:
        _ensure_chroot(hosts, zk_options)
    except Exception as exc:
        raise errors.NoServiceAvailable(f"ZooKeeper {hosts} did not answer within {ZK_CONNECT_TIMEOUT_S:.0f} s: {exc}") from exc
    client = make_client(hosts, session_timeout_s=session_timeout_s, **zk_options)
    try:
        client.start(timeout=ZK_CONNECT_TIMEOUT_S)
    except Exception as exc:
        close_client(client)
        raise errors.NoServiceAvailable(f"ZooKeeper {hosts} did not answer within {ZK_CONNECT_TIMEOUT_S:.0f} s: {exc}") from exc
    return client


class _CreateContainer(Create2):
    """ZooKeeper's createContainer request (opcode 19, ZooKeeper 3.5.3 and later), which
    kazoo does not offer: the body and the answer are create2's."""
    type = 19


def ensure_container(zk: KazooClient, path: str) -> None:
    """Make ``path`` exist as a container znode (its own parents persistent): ZooKeeper
    deletes a container once its last child is gone, checking every
    ``znode.container.checkIntervalMs`` (60 s by default). A service name's znode is one, so
    names whose every instance went, stopped or SIGKILLed (its ephemeral znode then goes
    with its session), leave nothing behind: a cluster whose services are named per
    deployment or per process used to gain one empty persistent znode per name for good.
    A server without containers gets a persistent znode, as before."""
    if zk.exists_async(path).get(timeout=ZK_TIMEOUT_S) is not None:
        return
    zk.ensure_path_async(path.rsplit("/", 1)[0]).get(timeout=ZK_TIMEOUT_S)
    result = zk.handler.async_result()
    request = _CreateContainer(zk.chroot + path, b"", zk.default_acl or OPEN_ACL_UNSAFE, CONTAINER_FLAGS)
    try:
        if zk._call(request, result) is not False:
            result.get(timeout=ZK_TIMEOUT_S)
        else:
            raise result.exception
    except NodeExistsError:
        pass
    except UnimplementedError:
        zk.ensure_path_async(path).get(timeout=ZK_TIMEOUT_S)


def register(zk: KazooClient, parent: str, prefix: str, info: InstanceInfo, *, container: bool = False) -> str:
    """Create the ephemeral sequential znode; returns its path. With ``container`` its
    parent is made a container znode (``ensure_container``). On a secure cluster the
    registry is writable only with the cluster's ZooKeeper digest (docs/SECURITY.md)."""
    with registry_call(f"register under {parent}"):
        return _register(zk, parent, prefix, info, container=container)


def _register(zk: KazooClient, parent: str, prefix: str, info: InstanceInfo, *, container: bool) -> str:
    try:
        for attempt in range(REGISTER_ATTEMPTS_MAX):
            if container:
                ensure_container(zk, parent)
            try:
                # Without makepath under a container: a parent reaped meanwhile is made a
                # container again by the next attempt, never a persistent znode.
                pending = zk.create_async(f"{parent}/{prefix}", info.encode(), ephemeral=True, sequence=True,
                                          makepath=not container)
                try:
                    path: str = pending.get(timeout=ZK_TIMEOUT_S)
                except KazooTimeoutError:
                    # The create may still be applied after we gave up (ZooKeeper slow, not
                    # gone): serve() has failed, so an entry made then would name a closed
                    # port for the rest of the session. Delete it when it lands.
                    pending.rawlink(lambda done: _delete_late_create(zk, done))
                    raise
                return path
            except NoNodeError:
                if attempt == REGISTER_ATTEMPTS_MAX - 1:
                    raise
    except NoAuthError:
        raise errors.AuthorizationFailedError(
            f"ZooKeeper refused to write {parent}: on a secure cluster the direct plane needs the cluster's "
            f"digest ($FABRIC_ZK_DIGEST_FILE) and a key ($FABRIC_KEY_FILE)", operation="register",
            resource=parent) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def _delete_late_create(zk: KazooClient, done: Any) -> None:
    """On kazoo's thread: a registration's create answered after its caller timed out."""
    if done.successful():
        log.info("registry: deleting %s, created after its registration had timed out", done.value)
        zk.delete_async(done.value)  # not waited for: a failure leaves it to the session's expiry


def update(zk: KazooClient, path: str, info: InstanceInfo) -> None:
    with registry_call(f"update {path}"):
        zk.set_async(path, info.encode()).get(timeout=ZK_TIMEOUT_S)


@contextmanager
def registry_call(what: str) -> Iterator[None]:
    """ZooKeeper not answering (a timeout, a lost connection or session) as the documented
    NoServiceAvailable: kazoo's own exceptions (KazooTimeoutError is not even a
    KazooException) reached callers of serve(), publish() and services() as they were."""
    try:
        yield
    except (KazooException, KazooTimeoutError) as exc:
        if isinstance(exc, (NoNodeError, NodeExistsError, NoAuthError)):
            raise  # answers, not an outage: the callers handle them
        raise errors.NoServiceAvailable(
            f"the registry (ZooKeeper) did not answer {what} within {ZK_TIMEOUT_S:g} s: {type(exc).__name__} {exc}"
        ) from exc


def deregister(zk: KazooClient, path: str) -> None:
    try:
        zk.delete_async(path).get(timeout=ZK_TIMEOUT_S)
    except NoNodeError:
        pass


class Registration:
    """An ephemeral sequential znode kept registered for as long as its owner runs.

    ZooKeeper deletes an ephemeral znode when the session that created it expires (a
    network cut or a ZooKeeper pause longer than the session timeout); when the client
    connects again under a new session, this creates the znode again (a new name, the same
    data). Kazoo reports session states on its connection thread, which must not block, so
    the re-creation runs on a thread of kazoo's handler. The blocking methods are for
    ``asyncio.to_thread``."""

    def __init__(self, zk: KazooClient, parent: str, prefix: str, info: InstanceInfo, what: str) -> None:
        self._zk = zk
        self._parent = parent
        self._container = parent.startswith(SERVICES + "/")  # a service's name: ensure_container
        self._prefix = prefix
        self.info = info
        self._what = what  # for log lines: "service pricing", "publisher"
        self.path: str | None = None
        self._session_lost = False
        self._closed = False

    def start(self) -> str:
        self.path = self._register()
        self._zk.add_listener(self._state_changed)
        return self.path

    def _register(self) -> str:
        # A container reaped and made again numbers its children from 0 again: a fresh token
        # at every registration (also the one after a lost session) keeps a name from ever
        # meaning two instances; callers key their peers and connections by it. A token per
        # Registration was not enough: re-registered after a session expiry into a re-made
        # container, an instance got its old name back, and callers took it for the instance
        # that had left (it stayed "leaving" and was closed).
        prefix = f"{self._prefix}{os.urandom(6).hex()}-" if self._container else self._prefix
        return register(self._zk, self._parent, prefix, self.info, container=self._container)

    def update(self, info: InstanceInfo) -> None:
        self.info = info
        if self.path is not None:
            update(self._zk, self.path, info)

    def close(self) -> None:
        """Deletes the znode (when ZooKeeper is reachable; else its session's expiry will)."""
        self._closed = True
        self._zk.remove_listener(self._state_changed)
        path, self.path = self.path, None
        if path is None:
            return
        if not self._zk.connected:
            log.warning("%s: ZooKeeper unreachable; %s goes when its session expires", self._what, path)
            return
        try:
            deregister(self._zk, path)
        except Exception as exc:
            log.warning("%s could not deregister %s: %s", self._what, path, exc)

    def _state_changed(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost and not self._closed:
            self._session_lost = False
            self._zk.handler.spawn(self._register_again)

    def _register_again(self) -> None:
        if self._closed:
            return
        try:
            self.path = self._register()
            if self._closed:  # closed meanwhile: do not leave it behind
                self.close()
                return
            log.info("%s registered again as %s after a lost ZooKeeper session", self._what, self.path)
        except Exception as exc:
            log.warning("%s could not register again: %s", self._what, exc)


def read_instances(zk: KazooClient, parent: str) -> dict[str, InstanceInfo]:
    """znode name -> info, for every child of ``parent`` (none if the path is missing)."""
    with registry_call(f"a read of {parent}"):
        return _read_instances(zk, parent)


def _read_instances(zk: KazooClient, parent: str) -> dict[str, InstanceInfo]:
    try:
        children = zk.get_children_async(parent).get(timeout=ZK_TIMEOUT_S)
    except NoNodeError:
        return {}
    out: dict[str, InstanceInfo] = {}
    for child in sorted(children):
        try:
            raw, _ = zk.get_async(f"{parent}/{child}").get(timeout=ZK_TIMEOUT_S)
            out[child] = InstanceInfo.decode(raw)
        except NoNodeError:
            continue
        except ValueError as exc:  # a foreign or broken znode: skip it, say so
            log.warning("registry entry %s/%s ignored: %s", parent, child, exc)
    return out


def list_services(zk: KazooClient) -> dict[str, dict[str, InstanceInfo]]:
    try:
        with registry_call(f"a read of {SERVICES}"):
            names = zk.get_children_async(SERVICES).get(timeout=ZK_TIMEOUT_S)
    except NoNodeError:
        return {}
    return {name: read_instances(zk, service_path(name)) for name in sorted(names)}


class RegistryWatch:
    """Keeps ``on_change(instances)`` told about the children of ``parent``.

    Kazoo calls the watch on its own thread; ``on_change`` must be quick (the asyncio client
    posts the snapshot to its loop). Reads of the children's data happen here, on kazoo's
    thread, never on the caller's loop."""

    def __init__(self, zk: KazooClient, parent: str, on_change: Callable[[dict[str, InstanceInfo]], object]) -> None:
        self._zk = zk
        self._parent = parent
        self._on_change = on_change
        self._closed = threading.Event()
        self._known: dict[str, InstanceInfo] = {}
        # Children whose data is no InstanceInfo: warned about once, then skipped unread
        # (as a good entry is read once: ephemeral sequential names are never reused).
        self._unreadable: set[str] = set()
        self._lock = threading.Lock()
        # The incarnation (czxid) of the parent whose children are watched: a parent deleted
        # and made again (a reaped container, sdk.direct._registry.ensure_container) needs a
        # watch of its own, since the old one may have stopped at the NoNode in between.
        self._children_czxid: int | None = None
        self._first_delivery = threading.Event()  # on_change was called once
        self._start_error: BaseException | None = None

    def start(self, timeout_s: float = ZK_TIMEOUT_S) -> None:
        """Returns once ``on_change`` has had the first snapshot, within ``timeout_s``:
        NoServiceAvailable when ZooKeeper does not answer by then (the watch is closed).
        kazoo's DataWatch makes its first read on the thread that creates it and retries
        it without limit while ZooKeeper does not answer, so a subscribe() with ZooKeeper
        paused never returned: the watch is made on a thread of kazoo's handler instead,
        which ends when ZooKeeper answers (the closed watch then stops) or the client closes."""
        self._zk.handler.spawn(self._watch_parent)
        if not self._first_delivery.wait(timeout_s):
            self.close()
            raise errors.NoServiceAvailable(
                f"the registry (ZooKeeper) did not answer a read of {self._parent} within {timeout_s:g} s")
        if self._start_error is not None:
            self.close()
            raise errors.NoServiceAvailable(
                f"the registry (ZooKeeper) could not be read at {self._parent}: {self._start_error!r}")

    def _watch_parent(self) -> None:
        # The parent is watched, not created: a caller asking for a name nobody serves (a
        # typo, `fabric request` of anything) left a persistent empty znode per name for
        # good. Until it exists there are no instances; once it does, its children are.
        try:
            self._zk.DataWatch(self._parent, self._parent_changed)
        except Exception as exc:  # handed to start(), which is waiting for it
            self._start_error = exc
            self._first_delivery.set()

    def close(self) -> None:
        self._closed.set()

    def _parent_changed(self, _data: bytes | None, stat: Any) -> bool | None:
        if self._closed.is_set():
            return False
        with self._lock:
            if stat is None:  # not there (yet), or deleted: its children watch ended with it
                self._children_czxid = None
                self._known = {}
                self._on_change({})
            elif stat.czxid != self._children_czxid:
                czxid = self._children_czxid = stat.czxid
                self._known = {}
                self._zk.ChildrenWatch(self._parent, lambda children: self._children_changed(children, czxid))
        self._first_delivery.set()  # the first snapshot (or the children's) went to on_change
        return None

    def _children_changed(self, children: list[str], czxid: int | None = None) -> bool | None:
        if self._closed.is_set() or czxid != self._children_czxid:
            return False  # closed, or the watch of a parent since deleted: the new one's watch reports
        fresh: dict[str, InstanceInfo] = {}
        for child in children:
            info = self._known.get(child)  # ephemeral sequential names are never reused
            if info is None:
                if child in self._unreadable:
                    continue
                try:
                    raw, _ = self._zk.get_async(f"{self._parent}/{child}").get(timeout=ZK_TIMEOUT_S)
                    info = InstanceInfo.decode(raw)
                except NoNodeError:
                    continue
                except ValueError as exc:  # a foreign or broken entry: skip it, keep the rest
                    self._unreadable.add(child)
                    log.warning("registry entry %s/%s ignored: %s", self._parent, child, exc)
                    continue
                except Exception as exc:  # ZooKeeper gone mid-read: read again on the next change
                    log.warning("registry entry %s/%s unreadable: %s", self._parent, child, exc)
                    continue
            fresh[child] = info
        self._known = fresh
        if self._unreadable:
            self._unreadable.intersection_update(children)  # bounded by the children there are
        self._on_change(dict(fresh))
        return None
