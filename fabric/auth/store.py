"""Principals and ACLs in ZooKeeper, a watched cache of them, and ZooKeeper's own digest ACLs.

Layout, below the Fabric root (docs/ZOOKEEPER.md)::

    /fabric/security/principals/<name>   {"public_key": Z85, "role": "user"|"super"|"node"}
    /fabric/security/acls                {"version": 1, "acls": [entry, ...]}, version-checked
    /fabric/security/quotas              {"version": 1, "quotas": {principal: {"produce_bytes_per_s": n}}}

One znode per principal, so adding one never races another; all ACL entries in one znode
written with a version-checked ``set``, so two operators adding entries at once both land
(the loser re-reads and retries) and a node always sees a consistent set. ZooKeeper caps a
znode at 1 MiB by default: about 5,000 entries.

``SecurityCache`` keeps an ``Authorizer`` current with watches (a children watch on the
principals, a data watch on the ACLs): a change is effective as soon as ZooKeeper delivers
the watch, typically within milliseconds, without restarts.

Secure mode also protects the znodes themselves: ``secure_zk_kwargs(digest)`` gives a
KazooClient digest credentials and a default ACL (that digest user may do anything, the
world may only read), so a client that reaches ZooKeeper cannot rewrite the routing map,
the principals or the ACLs.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import make_acl, make_digest_acl

from fabric import errors
from fabric.auth.acl import AclEntry, Authorizer, Principal, Role, decode_acls, encode_acls
from fabric.auth.keys import validate_name, validate_public_key, warn_if_others_may_read
from fabric.auth.quota import DEFAULT_PRINCIPAL, Quota, decode_quotas, encode_quotas
from fabric.zk import ROOT, close_client, make_client

log = logging.getLogger("fabric.auth")

__all__ = ["NoAuthError", "SecurityCache", "add_acl", "add_principal", "find_principal", "list_acls", "list_principals",
           "list_quotas", "remove_acl", "remove_principal", "secure_zk_kwargs", "set_quota"]

SECURITY = f"{ROOT}/security"
PRINCIPALS = f"{SECURITY}/principals"
ACLS = f"{SECURITY}/acls"
QUOTAS = f"{SECURITY}/quotas"
ZK_TIMEOUT_S = 10.0
ACL_WRITE_ATTEMPTS_MAX = 20


def principal_path(name: str) -> str:
    return f"{PRINCIPALS}/{name}"


def _ensure(zk: KazooClient) -> None:
    zk.ensure_path(PRINCIPALS)
    for path, empty in ((ACLS, encode_acls([])), (QUOTAS, encode_quotas({}))):
        try:
            zk.create(path, empty)
        except NodeExistsError:
            pass


def _name_taken(name: str) -> errors.InvalidRequestError:
    # The only way to a new key for a name is remove, then add: say so, and that the
    # principal's ACL entries and quota are kept by name across the two.
    return errors.InvalidRequestError(
        f"principal {name!r} already exists; to give it a new key: fabric principal remove {name}, then "
        f"fabric principal add {name} --key NEW_KEY (its ACL entries and quota stay)")


def add_principal(zk: KazooClient, name: str, public_key: str | bytes, role: Role = Role.USER) -> Principal:
    validate_name(name)
    key = validate_public_key(public_key).decode("ascii")
    _ensure(zk)
    principal = Principal(name, key, role)
    # The name first: adding bob again (with his own key, or any other) is a name conflict,
    # and was reported as "that public key is already registered as principal 'bob'".
    if zk.exists(principal_path(name)) is not None:
        raise _name_taken(name)
    for other in list_principals(zk):
        if other.public_key == key:
            raise errors.InvalidRequestError(
                f"that public key is already registered as principal {other.name!r} (a key belongs to one "
                f"principal only: generate another with fabric keys generate {name})")
    try:
        zk.create(principal_path(name), principal.encode())
    except NodeExistsError:
        raise _name_taken(name) from None  # added by someone else since the check above
    return principal


def find_principal(zk: KazooClient, name: str) -> Principal | None:
    """The principal registered under ``name``, or None."""
    try:
        raw, _ = zk.get(principal_path(name))
    except NoNodeError:
        return None
    return Principal.decode(name, raw)


def remove_principal(zk: KazooClient, name: str) -> None:
    validate_name(name)
    try:
        zk.delete(principal_path(name))
    except NoNodeError:
        raise errors.InvalidRequestError(f"no principal named {name!r}") from None


def list_principals(zk: KazooClient) -> list[Principal]:
    try:
        names = zk.get_children(PRINCIPALS)
    except NoNodeError:
        return []
    out = []
    for name in sorted(names):
        try:
            raw, _ = zk.get(principal_path(name))
        except NoNodeError:
            continue
        out.append(Principal.decode(name, raw))
    return out


def list_acls(zk: KazooClient) -> list[AclEntry]:
    try:
        raw, _ = zk.get(ACLS)
    except NoNodeError:
        return []
    return decode_acls(raw)


def _update(zk: KazooClient, path: str, change: Callable[[bytes], bytes]) -> None:
    """Read-modify-write with the znode version as the fence."""
    _ensure(zk)
    for _ in range(ACL_WRITE_ATTEMPTS_MAX):
        raw, stat = zk.get(path)
        try:
            zk.set(path, change(raw), version=stat.version)
            return
        except BadVersionError:
            continue  # another writer won; re-read and apply our change on top of theirs
    raise errors.RequestTimedOutError(f"update of {path} lost {ACL_WRITE_ATTEMPTS_MAX} races in a row; retry")


def _update_acls(zk: KazooClient, change: Callable[[list[AclEntry]], list[AclEntry]]) -> None:
    _update(zk, ACLS, lambda raw: encode_acls(change(decode_acls(raw))))


def list_quotas(zk: KazooClient) -> dict[str, Quota]:
    try:
        raw, _ = zk.get(QUOTAS)
    except NoNodeError:
        return {}
    return decode_quotas(raw)


def set_quota(zk: KazooClient, principal: str, quota: Quota | None) -> None:
    """Set (or with None remove) a principal's quota; ``*`` is the default for all."""
    if principal != DEFAULT_PRINCIPAL:
        validate_name(principal)

    def change(raw: bytes) -> bytes:
        quotas = decode_quotas(raw)
        if quota is None:
            if principal not in quotas:
                raise errors.InvalidRequestError(f"{principal!r} has no quota to remove")
            del quotas[principal]
        else:
            quotas[principal] = quota
        return encode_quotas(quotas)

    _update(zk, QUOTAS, change)


def add_acl(zk: KazooClient, entry: AclEntry) -> bool:
    """Add an entry; False when it was already there (adding is idempotent). An entry that
    could allow no request is refused (``AclEntry.check_grants_something``)."""
    entry.check_grants_something()
    added: list[AclEntry] = []

    def change(entries: list[AclEntry]) -> list[AclEntry]:
        added.clear()
        if entry in entries:
            return entries
        added.append(entry)
        return [*entries, entry]

    _update_acls(zk, change)
    return bool(added)


def remove_acl(zk: KazooClient, entry: AclEntry) -> bool:
    removed: list[AclEntry] = []

    def change(entries: list[AclEntry]) -> list[AclEntry]:
        removed.clear()
        if entry not in entries:
            return entries
        removed.append(entry)
        return [e for e in entries if e != entry]

    _update_acls(zk, change)
    return bool(removed)


class SecurityCache:
    """The current Authorizer, rebuilt whenever a principal or the ACLs change.

    Kazoo runs watch callbacks on its own thread; readers take ``authorizer`` (one
    attribute read of an immutable object) from any thread, so no lock is needed on the
    read side. ``on_change`` is called after each rebuild (the node uses it to log)."""

    def __init__(self, zk: KazooClient, on_change: Callable[[Authorizer], None] | None = None) -> None:
        self.zk = zk
        self.on_change = on_change
        self.authorizer = Authorizer({}, [])
        self.quotas: dict[str, Quota] = {}
        self._principals: dict[str, Principal] = {}
        self._acls: list[AclEntry] = []
        self._lock = threading.Lock()
        self._closed = False
        self.ready = threading.Event()

    def start(self, *, ensure: bool = True) -> None:
        """Read and watch. ``ensure=False`` for a reader without write rights (a direct-plane
        client): the znodes must exist already."""
        if ensure:
            _ensure(self.zk)
        self.zk.ChildrenWatch(PRINCIPALS, self._principals_changed)
        self.zk.DataWatch(ACLS, self._acls_changed)
        self.zk.DataWatch(QUOTAS, self._quotas_changed)
        self.ready.set()

    def close(self) -> None:
        self._closed = True

    def _principals_changed(self, children: list[str]) -> bool | None:
        if self._closed:
            return False
        principals: dict[str, Principal] = {}
        for name in children:
            try:
                raw, _ = self.zk.get(principal_path(name))
            except NoNodeError:
                continue
            try:
                principals[name] = Principal.decode(name, raw)
            except (ValueError, KeyError) as exc:
                log.error("ignoring unreadable principal znode %s: %s", name, exc)
        with self._lock:
            self._principals = principals
            self._rebuild()
        return None

    def _acls_changed(self, data: bytes | None, stat: Any, event: Any = None) -> bool | None:
        if self._closed:
            return False
        try:
            acls = decode_acls(data)
        except (ValueError, KeyError) as exc:
            log.error("ignoring unreadable ACL znode: %s (keeping the previous ACLs)", exc)
            return None
        with self._lock:
            self._acls = acls
            self._rebuild()
        return None

    def _quotas_changed(self, data: bytes | None, stat: Any, event: Any = None) -> bool | None:
        if self._closed:
            return False
        try:
            self.quotas = decode_quotas(data)
        except (ValueError, KeyError, errors.FabricError) as exc:
            log.error("ignoring unreadable quota znode: %s (keeping the previous quotas)", exc)
        return None

    def _rebuild(self) -> None:
        self.authorizer = Authorizer(self._principals, self._acls)
        if self.on_change is not None:
            self.on_change(self.authorizer)


# --- ZooKeeper's own access control ------------------------------------------------------


def read_digest(path: str | os.PathLike[str]) -> str:
    """A digest credential file holds one line ``user:password`` (mode 0600)."""
    try:
        text = Path(path).read_text().strip()
    except OSError as exc:
        raise errors.InvalidRequestError(f"cannot read ZooKeeper credentials {path}: {exc.strerror or exc}") from None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise errors.InvalidRequestError(f"{path} must hold one line user:password")
    warn_if_others_may_read(Path(path), "ZooKeeper credentials")
    return text


def write_digest(path: str | os.PathLike[str], user: str = "fabric") -> str:
    """Create a credential file with a random password; returns ``user:password``."""
    import secrets

    credential = f"{user}:{secrets.token_urlsafe(24)}"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(credential + "\n")
    return credential


def secure_zk_kwargs(digest: str | None) -> dict[str, Any]:
    """KazooClient keyword arguments: authenticate with the digest and create every znode
    with (digest user: all, world: read). None (plaintext mode) adds nothing."""
    if not digest:
        return {}
    user, _, password = digest.partition(":")
    return {
        "auth_data": [("digest", digest)],
        "default_acl": [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)],
    }


DIRECT_REGISTRY_ROOTS = (f"{ROOT}/services", f"{ROOT}/publishers")  # sdk/direct/_registry.py
DIRECT_DIGEST_USER = "fabric-direct"


def open_direct_registry(zk: KazooClient, admin_digest: str, direct_digest: str) -> None:
    """Let holders of ``direct_digest`` (services and callers of the direct plane) write
    the direct plane's registry and nothing else: the registry roots (and the service
    znodes already there) get "admin digest: all, direct digest: all, world: read"; the
    rest of /fabric keeps the admin-only ACL, so a service's credential cannot rewrite the
    routing map, the principals or the ACLs. Direct clients create their znodes with the
    ACL they find on the registry root (sdk/direct/_secure.py). Idempotent."""
    acl = []
    for credential in (admin_digest, direct_digest):
        user, _, password = credential.partition(":")
        acl.append(make_digest_acl(user, password, all=True))
    acl.append(make_acl("world", "anyone", read=True))
    for root in DIRECT_REGISTRY_ROOTS:
        zk.ensure_path(root)
        zk.set_acls(root, acl)
        for child in zk.get_children(root):
            try:
                zk.set_acls(f"{root}/{child}", acl)
            except NoNodeError:
                continue  # an ephemeral instance that just went


def zk_digest_from_env() -> str | None:
    path = os.environ.get("FABRIC_ZK_DIGEST_FILE")
    return read_digest(path) if path else None


def connect(hosts: str, digest: str | None = None, timeout_s: float = ZK_TIMEOUT_S) -> KazooClient:
    zk = make_client(hosts, session_timeout_s=timeout_s, **secure_zk_kwargs(digest))
    try:
        zk.start(timeout=timeout_s)
    except Exception:
        close_client(zk)  # a client left running would retry in the background forever
        raise
    return zk
