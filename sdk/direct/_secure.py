"""The direct plane on a secure cluster: CURVE on every direct socket, a ZAP handler that
admits only registered keys, the ``service`` ACLs, and the registry under the digest ACL.

Who holds which key (docs/SECURITY.md, "The direct plane"):

* every direct client is a **principal** (``fabric principal add``): its own key pair is
  the client side of the DEALERs and SUBs it connects, *and* the server side of the
  service ROUTERs and publisher PUBs it binds;
* an instance registers its public key (``curve_key``) beside its address; a caller pins
  that key, so it talks to the registered instance or to no one. The registry is only
  writable with the cluster's ZooKeeper digest (world: read), so the pinned key is the
  one the owner of the instance wrote;
* each client runs a ZAP handler on its own ZeroMQ context (domain ``fabric-direct``):
  a CURVE server without one accepts any key; this one admits only registered keys and
  names the principal in every message's ``User-Id``.

ACLs (resource type ``service``; the resource name is the service name or the subject):

* ``consume`` on a service: send it requests or scatter-gathers. Checked by the instance
  for every REQUEST that arrives (refused with AUTHORIZATION_FAILED, handler not run);
* ``produce`` on a service: serve it. Checked by the server before it registers, and by
  every caller before it sends anything to an instance: an instance whose principal may
  not serve the name gets no traffic;
* ``produce`` on a subject: publish it. Checked by the publisher's SDK and by every
  subscriber on receipt (one SUB per publisher, pinned to its key: a message whose
  publisher's principal may not produce the subject is dropped and counted);
* ``consume`` on a subscription pattern (its text, so ``orders.>`` needs a prefix ACL
  ``orders.`` or a literal one on ``orders.>``): subscribe. Checked by the subscriber's
  SDK only (a PUB socket cannot tell its subscribers apart); the ZAP handler keeps
  unregistered keys out of pub/sub entirely.

In plaintext mode none of this exists: ``DirectClient.security`` is None and the request
path takes no extra step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from kazoo.exceptions import NoNodeError

from fabric import errors
from fabric.auth.acl import Authorizer, Operation, Resource, ResourceType
from fabric.auth.curve import DOMAIN_DIRECT, ENV_KEY_FILE, ZapAuthenticator, current_principal
from fabric.auth.keys import load_key_pair
from fabric.auth.store import DIRECT_REGISTRY_ROOTS, SecurityCache, read_digest
from sdk.direct._registry import ZK_TIMEOUT_S

log = logging.getLogger("fabric.direct")

ENV_ZK_DIGEST_FILE = "FABRIC_ZK_DIGEST_FILE"
DECISIONS_CACHED_MAX = 10_000  # (principal, operation, name) answers kept per ACL snapshot


@dataclass(frozen=True)
class DirectCredentials:
    """A principal's key pair and, to serve or publish, a ZooKeeper credential that may
    write the registry (``user:password``: the direct credential or the operator's digest).
    Callers and subscribers need no credential: the registry is world-readable."""

    public_key: bytes  # Z85
    secret_key: bytes  # Z85
    zk_digest: str | None = None

    @classmethod
    def from_files(cls, key_file: str | os.PathLike[str],
                   zk_digest_file: str | os.PathLike[str] | None = None) -> DirectCredentials:
        pair = load_key_pair(key_file)
        if pair.secret_key is None:
            raise errors.InvalidRequestError(f"{key_file} holds no secret key: pass the NAME.key_secret file")
        return cls(pair.public_key, pair.secret_key, read_digest(zk_digest_file) if zk_digest_file else None)

    @classmethod
    def from_env(cls) -> DirectCredentials | None:
        """``$FABRIC_KEY_FILE`` (and ``$FABRIC_ZK_DIGEST_FILE`` when set), or None
        (plaintext) without a key file."""
        key_file = os.environ.get(ENV_KEY_FILE)
        if not key_file:
            return None
        return cls.from_files(key_file, os.environ.get(ENV_ZK_DIGEST_FILE) or None)


class DirectSecurity:
    """The secure direct plane of one DirectClient. ``start`` blocks (ZooKeeper reads):
    call it through ``asyncio.to_thread``; it must run before any socket of ``ctx`` binds."""

    def __init__(self, credentials: DirectCredentials, zk: Any, ctx: zmq.Context[Any]) -> None:
        self.credentials = credentials
        self.public_key = credentials.public_key.decode("ascii")
        self.cache = SecurityCache(zk, on_change=self._changed)
        self._listeners: list[Callable[[], None]] = []
        self.zap_context = ctx  # the client's own context: its ZAP handler serves only it
        self.zap = ZapAuthenticator(ctx, self.authorizer, on_refused=self._refused)
        self._decisions: dict[tuple[str, Operation, str], bool] = {}
        self._decided_by: Authorizer | None = None
        self._zap_started = False

    def start(self, timeout_s: float = ZK_TIMEOUT_S) -> None:
        """Read (and watch) the principals and ACLs, then start the ZAP handler that answers
        with them. NoServiceAvailable when ZooKeeper does not answer within ``timeout_s``:
        kazoo's watches make their first read on the thread that creates them and retry it
        without limit, so that thread is one of kazoo's handler, as for the registry's own
        watches (sdk/direct/_registry.py); it ends when ZooKeeper answers or the client closes."""
        done = threading.Event()
        failure: list[BaseException] = []

        def read() -> None:
            try:
                self._inherit_registry_acl(timeout_s)
                self.cache.start(ensure=False)
            except Exception as exc:  # handed to the caller, which is waiting for it
                failure.append(exc)
            finally:
                done.set()

        self.cache.zk.handler.spawn(read)
        if not done.wait(timeout_s) or failure:
            self.cache.close()  # a watch made late stops at its first callback
            if failure and isinstance(failure[0], errors.FabricError):
                raise failure[0]
            why = f"could not be read: {failure[0]!r}" if failure else f"did not answer within {timeout_s:g} s"
            raise errors.NoServiceAvailable(f"ZooKeeper (the principals and ACLs of the secure direct plane) {why}")
        self.zap.start()
        self._zap_started = True
        if self.principal is None:
            raise errors.AuthenticationFailedError(
                f"this client's key {self.public_key} is not registered as a principal (fabric principal add)")

    def _inherit_registry_acl(self, timeout_s: float) -> None:
        """Create registry znodes with the ACL of the registry root (store.open_direct_registry):
        the operator and every holder of the direct credential may then register under a
        service name, whichever of them created it first."""
        zk = self.cache.zk
        try:
            acl, _ = zk.get_acls_async(DIRECT_REGISTRY_ROOTS[0]).get(timeout=timeout_s)
        except NoNodeError:
            return  # no registry yet: only the operator's digest can create it, with its own ACL
        zk.default_acl = list(acl)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change of the principals or ACLs, on kazoo's
        thread: callers re-check the instances they already talk to (a revoked serve ACL,
        a removed or rotated principal) as the nodes re-check every request."""
        self._listeners.append(listener)

    def _changed(self, _authorizer: Authorizer) -> None:
        for listener in list(self._listeners):
            listener()

    def authorizer(self) -> Authorizer:
        return self.cache.authorizer

    @staticmethod
    def _refused(domain: str, why: str) -> None:
        log.warning("direct plane: CURVE handshake refused (%s): %s", domain, why)

    @property
    def principal(self) -> str | None:
        """This client's principal name (None if its key was removed from the registry)."""
        known = self.cache.authorizer.principal_for_key(self.public_key)
        return known.name if known is not None else None

    def principal_for_key(self, curve_key: str) -> str | None:
        known = self.cache.authorizer.principal_for_key(curve_key)
        return known.name if known is not None else None

    def allowed(self, principal: str, operation: Operation, name: str) -> bool:
        """Whether ``principal`` may ``operation`` the service or subject ``name``; answers
        are cached until the ACLs or principals change (the cache swaps its Authorizer)."""
        authorizer = self.cache.authorizer
        if authorizer is not self._decided_by or len(self._decisions) >= DECISIONS_CACHED_MAX:
            self._decisions = {}
            self._decided_by = authorizer
        key = (principal, operation, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = authorizer.authorize(principal, operation, Resource(ResourceType.SERVICE, name))
            self._decisions[key] = decision
        return decision

    def require(self, operation: Operation, name: str) -> None:
        """Raise AuthorizationFailedError unless this client may ``operation`` ``name``."""
        principal = self.principal or ""
        if not self.allowed(principal, operation, name):
            resource = str(Resource(ResourceType.SERVICE, name))
            raise errors.AuthorizationFailedError(
                f"principal {principal!r} may not {operation.value} {resource}",
                principal=principal, operation=operation.value, resource=resource)

    def refusal(self, zap_user_id: str, operation: Operation, name: str) -> str | None:
        """None when allowed, else the AUTHORIZATION_FAILED message (and a log line).
        ``zap_user_id``: a request's User-Id, the principal and the key it connected with
        (a connection made with a key rotated out since is refused, as on the nodes)."""
        principal, why = current_principal(self.cache.authorizer, zap_user_id)
        if why is None and self.allowed(principal, operation, name):
            return None
        message = f"principal {principal!r} may not {operation.value} {Resource(ResourceType.SERVICE, name)}"
        if why is not None:
            message += f": {why}"
        log.warning("direct plane denied: %s", message)
        return message

    def trusted_server(self, curve_key: str, name: str) -> bool:
        """May the instance registered with ``curve_key`` serve ``name``? (produce) Also the
        check of a publisher on each message it publishes: by its key, so a publisher whose
        principal was removed, or rotated to another key, is refused from then on."""
        principal = self.principal_for_key(curve_key) if curve_key else None
        return principal is not None and self.allowed(principal, Operation.PRODUCE, name)

    def bind_socket(self, sock: zmq.Socket[Any]) -> None:
        """CURVE server with this principal's key, ZAP domain fabric-direct: before bind."""
        sock.zap_domain = DOMAIN_DIRECT.encode()
        sock.curve_server = True
        sock.curve_publickey = self.credentials.public_key
        sock.curve_secretkey = self.credentials.secret_key

    def connect_socket(self, sock: zmq.Socket[Any], server_key: str) -> None:
        """CURVE client pinned to ``server_key``: before each connect (options apply to the
        connections made after they are set)."""
        sock.curve_serverkey = server_key.encode("ascii")
        sock.curve_publickey = self.credentials.public_key
        sock.curve_secretkey = self.credentials.secret_key

    def close(self) -> None:
        """Stop the ZAP handler and end the context (call after closing its sockets)."""
        self.cache.close()
        if self._zap_started:
            self._zap_started = False
            self.zap.stop()
        # destroy, not term: term waits forever for a socket left open (a blocking caller's
        # thread that never returned, sdk/direct/_blocking.py); everything else is closed.
        self.zap_context.destroy(linger=0)
