"""CURVE on ZeroMQ sockets, and the ZAP handler that admits only registered keys.

Keys in a secure cluster:

* the **cluster key** (``cluster.key_secret`` on every node): the server side of every
  node socket (client ROUTER, replication PUB). Clients and nodes know its public half
  (``cluster.key``) and pin it: a man in the middle without the secret cannot answer.
* a **client key pair** per principal (``alice.key_secret``), registered in ZooKeeper
  with ``fabric principal add``;
* a **node key pair** per node (principal with role ``node``), the client side of its
  connections to other nodes (fetch, replica acks, the replication stream).

A CURVE server without a ZAP handler accepts any client key (encryption without
authentication). ``ZapAuthenticator`` runs pyzmq's ThreadAuthenticator with a callback
that asks the current ``Authorizer`` (the ZooKeeper-watched principal cache), so a key
registered or removed takes effect for the next connection without restarts. It also
maps the key to the principal's name, which ZeroMQ then attaches to every message as the
``User-Id`` property, with the key itself (``"name key"``): the node's dispatch checks
the ACLs against the name, and that the name still has that key, so a connection made
with a key that was rotated out (``principal remove``, then ``add`` with a new key) gets
nothing, even while the name is registered again.

Three ZAP domains: ``fabric`` (client ROUTER) admits every registered key; ``fabric-replication``
(the replication PUB) admits only node and super keys, so a user key cannot subscribe to
the raw replication stream; ``fabric-direct`` (the direct plane's service ROUTERs and
publisher PUBs, sdk/direct/_secure.py) admits every registered key, and the service then
checks the ``service`` ACL of each request.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator

from fabric.auth.acl import Authorizer, Role
from fabric.auth.keys import load_key_pair
from fabric.errors import InvalidRequestError

log = logging.getLogger("fabric.auth")

DOMAIN_CLIENTS = "fabric"
DOMAIN_REPLICATION = "fabric-replication"
DOMAIN_DIRECT = "fabric-direct"
ENV_KEY_FILE = "FABRIC_KEY_FILE"  # the client's NAME.key_secret
ENV_SERVER_KEY = "FABRIC_SERVER_KEY"  # the cluster's public key: Z85 text or a .key file


@dataclass(frozen=True)
class ClientSecurity:
    """What a CURVE client needs: the server's public key and its own key pair."""

    server_public_key: bytes
    public_key: bytes
    secret_key: bytes

    @classmethod
    def from_files(cls, key_file: str | os.PathLike[str], server_key: str | os.PathLike[str]) -> ClientSecurity:
        own = load_key_pair(key_file)
        if own.secret_key is None:
            raise InvalidRequestError(f"{key_file} holds no secret key: pass the NAME.key_secret file")
        server = str(server_key)
        if len(server) == 40 and not Path(server).exists():
            server_public = server.encode("ascii")
        else:
            server_public = load_key_pair(server).public_key
        return cls(server_public, own.public_key, own.secret_key)

    @classmethod
    def from_env(cls) -> ClientSecurity | None:
        """``$FABRIC_KEY_FILE`` and ``$FABRIC_SERVER_KEY``, or None (plaintext) when unset."""
        key_file, server_key = os.environ.get(ENV_KEY_FILE), os.environ.get(ENV_SERVER_KEY)
        if not key_file and not server_key:
            return None
        if not key_file or not server_key:
            raise InvalidRequestError(f"a secure client needs both ${ENV_KEY_FILE} and ${ENV_SERVER_KEY}")
        return cls.from_files(key_file, server_key)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        sock.curve_serverkey = self.server_public_key
        sock.curve_publickey = self.public_key
        sock.curve_secretkey = self.secret_key


@dataclass(frozen=True)
class ServerSecurity:
    """The cluster key pair, for the server side of node sockets."""

    public_key: bytes
    secret_key: bytes

    @classmethod
    def from_file(cls, key_file: str | os.PathLike[str]) -> ServerSecurity:
        pair = load_key_pair(key_file)
        if pair.secret_key is None:
            raise InvalidRequestError(f"{key_file} holds no secret key: pass the cluster.key_secret file")
        return cls(pair.public_key, pair.secret_key)

    def apply(self, sock: zmq.Socket[Any], domain: str) -> None:
        """Call before bind: the options apply to connections made after they are set."""
        sock.zap_domain = domain.encode()
        sock.curve_server = True
        sock.curve_publickey = self.public_key
        sock.curve_secretkey = self.secret_key


class _Provider:
    """pyzmq's credentials-provider protocol: ``callback(domain, z85_key) -> bool``."""

    def __init__(self, authorizer: Callable[[], Authorizer], on_refused: Callable[[str, str], None]) -> None:
        self.authorizer = authorizer
        self.on_refused = on_refused

    def callback(self, domain: str, key: bytes) -> bool:
        principal = self.authorizer().principal_for_key(key.decode("ascii", "replace"))
        if principal is None:
            self.on_refused(domain, f"unregistered key {key.decode('ascii', 'replace')}")
            return False
        if domain == DOMAIN_REPLICATION and principal.role not in (Role.NODE, Role.SUPER):
            self.on_refused(domain, f"principal {principal.name!r} ({principal.role.value}) is not a node")
            return False
        return True


class _Authenticator(ThreadAuthenticator):
    def __init__(self, context: zmq.Context[Any], authorizer: Callable[[], Authorizer]) -> None:
        super().__init__(context, log=logging.getLogger("fabric.auth.zap"))
        self._authorizer = authorizer

    def curve_user_id(self, client_public_key: bytes) -> str:
        # Called only after the provider admitted the key, so the principal exists (unless
        # it was removed in between: then an empty name, which no ACL check passes).
        from zmq.utils import z85

        key = z85.encode(client_public_key).decode("ascii")
        principal = self._authorizer().principal_for_key(key)
        return f"{principal.name} {key}" if principal is not None else ""


class ZapAuthenticator:
    """Start before any CURVE server socket of the context binds; stop at shutdown."""

    def __init__(self, context: zmq.Context[Any], authorizer: Callable[[], Authorizer],
                 on_refused: Callable[[str, str], None] | None = None) -> None:
        self._auth = _Authenticator(context, authorizer)
        provider = _Provider(authorizer, on_refused or self._log_refusal)
        for domain in (DOMAIN_CLIENTS, DOMAIN_REPLICATION, DOMAIN_DIRECT):
            self._auth.configure_curve_callback(domain=domain, credentials_provider=provider)

    @staticmethod
    def _log_refusal(domain: str, why: str) -> None:
        log.warning("CURVE handshake refused on %s: %s", domain, why)

    def start(self) -> None:
        self._auth.start()

    def stop(self) -> None:
        self._auth.stop()


def user_id(frame: Any) -> str:
    """The ZAP User-Id of a received frame, ``"name key"`` (``split_user_id``), '' when plaintext."""
    try:
        value = frame.get("User-Id")
    except (zmq.ZMQError, AttributeError, KeyError):
        return ""
    return value if isinstance(value, str) else ""


def split_user_id(value: str) -> tuple[str, str]:
    """(principal name, the Z85 key it connected with) of a User-Id; ('', '') for none."""
    name, _, key = value.partition(" ")
    return name, key


def current_principal(authorizer: Authorizer, value: str) -> tuple[str, str | None]:
    """The principal name of a User-Id, and why it may do nothing (None when it may go on
    to the ACLs): removed after it connected, or its key rotated since."""
    name, key = split_user_id(value)
    known = authorizer.principals.get(name)
    if known is None:
        return name, "the principal is not registered (removed after it connected?)"
    if known.public_key != key:
        return name, "the principal's key changed after this connection was made (rotated?): connect again"
    return name, None
