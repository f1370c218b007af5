"""Secure mode on the storage node (``security = "curve"``): sockets, the ACL check, quotas.

What ``NodeSecurity`` does, in the order the node needs it (docs/SECURITY.md):

* **before anything binds**: connect its own ZooKeeper session (with the digest) and load
  the principals, ACLs and quotas into a watched ``SecurityCache``, then start the ZAP
  authenticator. A CURVE server socket without a running ZAP handler accepts *any* client
  key, so the authenticator runs before the first bind, and the cache is loaded first so
  the first handshakes are not refused for want of data. (Its own session, not the node's:
  the node's session is started, expired and re-established by ``nodes/session.py``; the
  authenticator must keep answering through all of that.)
* **sockets**: the cluster key on the client ROUTER (ZAP domain ``fabric``: every
  registered key) and the replication PUB (``fabric-replication``: node and super keys
  only); the node's own key on the SUB and the follower->leader connections.
* **every request**: ``admit`` checks the decoded request against the ACLs before any
  handler runs (``fabric.auth.acl.required_access`` says what it needs). A refusal is
  ``AUTHORIZATION_FAILED`` naming principal, operation and resource, logged at WARNING,
  and always request-level: nothing of the request is applied, even the items the
  principal may use (docs/PROTOCOL.md section 12). Only METADATA answers per topic, and
  the all-topics forms of METADATA, DESCRIBE_TOPICS and DESCRIBE_REPLICAS list only the
  topics the principal may describe (``wrap_handlers``). The check reads names, never the
  routing map, so a topic that does not exist is refused exactly as a forbidden one. An
  API the node has no handler for is never admitted (``UNKNOWN_API`` to everyone, from
  nodes/server.py). An unknown principal (removed after it connected), or a connection
  whose key was rotated out, is refused everything.
* **quotas**: a PRODUCE within its ACL is written at once; ``fabric.auth.quota.Throttle``
  says how long its response waits (at most ``THROTTLE_MS_MAX``, 10 s: well inside a
  client's 30 s request timeout; the rest of the debt holds later responses). ``hold``
  parks that response in a bounded delay queue and ``release`` (a loop duty) sends it
  when due. When THROTTLED_RESPONSES_MAX responses are already held, an over-quota
  PRODUCE is refused *before it is written* with the retriable ``THROTTLED`` (nothing
  written, the producer retries after its backoff): a full queue never lets a greedy
  producer through unthrottled, and never drops acknowledged data.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from fabric import errors
from fabric.auth.acl import (
    CLUSTER_NAME,
    Authorizer,
    Operation,
    Resource,
    ResourceType,
    required_access,
)
from fabric.auth.curve import (
    DOMAIN_CLIENTS,
    DOMAIN_REPLICATION,
    ClientSecurity,
    ServerSecurity,
    ZapAuthenticator,
    current_principal,
    user_id,
)
from fabric.auth.quota import Throttle
from fabric.auth.store import SecurityCache, connect, read_digest, secure_zk_kwargs
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import Header
from fabric.zk import close_client
from nodes.state import envelope_identity

if TYPE_CHECKING:
    from nodes.state import Envelope, NodeConfig, NodeState, Sockets

log = logging.getLogger("fabric.node.authz")

THROTTLED_RESPONSES_MAX = 10_000  # held PRODUCE responses; beyond this over-quota PRODUCEs are refused
HELD_FORGET_S = 60.0  # a hold whose response never came (client gone) is forgotten after this
SECURE_OPTIONS = ("server_key_file", "key_file", "zk_digest_file")


class NodeSecurity:
    """Everything secure mode adds to one node. Built by ``start`` before the node binds."""

    def __init__(self, config: NodeConfig, context: zmq.Context[Any]) -> None:
        missing = [name for name in SECURE_OPTIONS if not getattr(config, name)]
        if missing:
            raise errors.ConfigError(f"security = \"curve\" needs {', '.join(missing)} (docs/SECURITY.md)")
        self.server = ServerSecurity.from_file(config.server_key_file)
        self.client = ClientSecurity.from_files(config.key_file, config.server_key_file)
        self.digest = read_digest(config.zk_digest_file)
        self.zk = connect(config.zk, self.digest)
        self.cache = SecurityCache(self.zk, on_change=self._on_change)
        self.zap = ZapAuthenticator(context, self.authorizer)
        self.throttle = Throttle()
        self._quotas_seen: object = None
        self._held: dict[tuple[bytes, int], float] = {}  # (client identity, correlation id) -> release time
        self._delayed: list[tuple[float, int, Envelope, list[Any]]] = []  # heap by release time
        self._order = itertools.count()
        self.principal = ""  # of the request being handled (the loop is one thread)
        self.refused_throttled = 0  # PRODUCEs refused THROTTLED (unwritten): the queue was full

    @classmethod
    def start(cls, config: NodeConfig, context: zmq.Context[Any]) -> NodeSecurity:
        security = cls(config, context)
        try:
            security.cache.start()  # reads principals, ACLs and quotas before returning
            security.zap.start()
        except BaseException:
            security.close()
            raise
        return security

    def authorizer(self) -> Authorizer:
        return self.cache.authorizer

    def zk_kwargs(self) -> dict[str, Any]:
        """For the node's own KazooClient: authenticate, and protect what it creates."""
        return secure_zk_kwargs(self.digest)

    def secure_sockets(self, sockets: Sockets) -> None:
        """Before the sockets bind or connect: CURVE options apply to later connections."""
        self.server.apply(sockets.router, DOMAIN_CLIENTS)
        self.server.apply(sockets.pub, DOMAIN_REPLICATION)
        self.client.apply(sockets.sub)

    @staticmethod
    def _on_change(authorizer: Authorizer) -> None:
        log.info("security: %d principals, %d ACL entries", len(authorizer.principals), len(authorizer.acls))

    # -- the check -------------------------------------------------------------------------
    def admit(self, node: NodeState, envelope: Envelope, first_frame: Any, request: apis.Message) -> bool:
        """True when the request may proceed; otherwise it has been answered with
        AUTHORIZATION_FAILED and logged."""
        authorizer = self.cache.authorizer
        principal, why = current_principal(authorizer, user_id(first_frame))
        api = request.header.api_key
        if why is not None:
            self._refuse(node, envelope, request.header, principal, "use", "the cluster", why)
            return False
        self.principal = principal  # for the METADATA filter, which runs right after this
        if api == ApiKey.METADATA:
            return True  # answered per topic by the filter (see wrap_handlers)
        denied = authorizer.first_denied(principal, required_access(api, request.body))
        if denied is not None:
            operation, resource = denied
            self._refuse(node, envelope, request.header, principal, operation.value, str(resource), "")
            return False
        if api == ApiKey.PRODUCE:
            return self._account(node, envelope, request, principal)
        return True

    def caller(self) -> tuple[str, Callable[[str, str], bool]]:
        """For the group coordinator: the principal of the request being handled, and the
        check it filters patterns and OFFSET_FETCH of all partitions with (describe)."""
        return self.principal, self.may_describe

    def caller_may_replicate(self) -> bool:
        """Whether the request being handled comes from a node or super key: what version 1
        of PRODUCE (the nodes' own) needs to skip a queue's header checks on a secure cluster."""
        return self.cache.authorizer.authorize(self.principal, Operation.REPLICATE, Resource(ResourceType.CLUSTER, CLUSTER_NAME))

    def may_describe(self, principal: str, topic: str) -> bool:
        return self.cache.authorizer.authorize(principal, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic))

    def _refuse(self, node: NodeState, envelope: Envelope, header: Header, principal: str, operation: str,
                resource: str, why: str) -> None:
        api_name = ApiKey(header.api_key).name if header.api_key in ApiKey._value2member_map_ else str(header.api_key)
        message = f"principal {principal!r} may not {operation} {resource}" + (f": {why}" if why else "")
        log.warning("denied %s: %s", api_name, message)
        node.send_error(envelope, header, errors.AuthorizationFailedError(
            message, principal=principal, operation=operation, resource=resource))

    def wrap_handlers(self, handlers: dict[int, Any]) -> None:
        """METADATA answers per topic, as Kafka: a named topic the principal may not
        describe comes back with AUTHORIZATION_FAILED and no partitions, and a request for
        all topics lists only those it may describe. (Refusing the whole request would
        fail a client's refresh of the topics it may use because of one it may not.)"""
        inner = handlers[ApiKey.METADATA]

        def metadata(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
            body = inner(node, envelope, request)
            if body is None:
                return None
            authorizer, principal = self.cache.authorizer, self.principal
            named = bool(request.body["topics"])
            topics = []
            for topic in body["topics"]:
                if authorizer.authorize(principal, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic["name"])):
                    topics.append(topic)
                elif named:
                    # Only the name asked for and the refusal: the same answer whether the
                    # topic exists or not (its settings would tell a guesser that it does).
                    topics.append({"error": errors.AuthorizationFailedError.code, "name": topic["name"],
                                   "strict_order": 0, "message_bytes_max": 0, "partitions": []})
            return {**body, "topics": topics}

        handlers[ApiKey.METADATA] = metadata
        # The all-topics forms of DESCRIBE_TOPICS and DESCRIBE_REPLICAS (``fabric topic
        # describe`` with no name) need describe on the cluster, and then answered every
        # topic's configs and log sizes, those METADATA hides from the principal included.
        # They list only what it may describe, as METADATA's all-topics form does; a name
        # asked for was checked by ``admit`` (refused whole when not describable).
        self._keep_describable(handlers, ApiKey.DESCRIBE_TOPICS, "names", "topics", "name")
        self._keep_describable(handlers, ApiKey.DESCRIBE_REPLICAS, "topics", "partitions", "topic")

    def _keep_describable(self, handlers: dict[int, Any], api: ApiKey, names_field: str, items_field: str,
                          topic_field: str) -> None:
        inner = handlers.get(api)
        if inner is None:
            return

        def answer(node: NodeState, envelope: Envelope, request: apis.Message) -> dict[str, Any] | None:
            body: dict[str, Any] | None = inner(node, envelope, request)
            if body is None or request.body[names_field]:
                return body
            principal = self.principal
            return {**body, items_field: [item for item in body[items_field]
                                          if self.may_describe(principal, item[topic_field])]}

        handlers[api] = answer

    # -- quotas ----------------------------------------------------------------------------
    def _account(self, node: NodeState, envelope: Envelope, request: apis.Message, principal: str) -> bool:
        """Charge a PRODUCE to its principal's quota; False when it was refused THROTTLED
        (unwritten) because the delay queue is full."""
        quotas = self.cache.quotas
        if quotas is not self._quotas_seen:  # the cache swaps the whole dict on a change
            self.throttle.set_quotas(quotas)
            self._quotas_seen = quotas
        if not self.throttle.quotas:
            return True
        now = time.monotonic()
        nbytes = sum(len(batch) for batch in request.batches)
        delay_ms = self.throttle.record(principal, nbytes, now)
        if delay_ms <= 0 or request.body.get("acks") == 0:
            # acks=0 has no answer to hold (its bytes are charged: the principal's later
            # answers are held for them). Registered as a hold, it took a place of the
            # queue below for HELD_FORGET_S that no answer would ever free.
            return True
        if self.throttled_count() >= THROTTLED_RESPONSES_MAX:
            self._forget_stale(now)
        if self.throttled_count() >= THROTTLED_RESPONSES_MAX:
            # Answering at once would let the producer past its quota; holding more would
            # grow without bound. Refuse before writing: nothing is lost, the client retries.
            self.throttle.refund(principal, nbytes)
            self.refused_throttled += 1
            log.warning("throttle queue full (%d responses): PRODUCE of %r refused THROTTLED",
                        THROTTLED_RESPONSES_MAX, principal)
            node.send_error(envelope, request.header, errors.ThrottledError(
                f"principal {principal!r} is over its produce quota and {THROTTLED_RESPONSES_MAX} responses "
                f"are already held; nothing was written, retry after {delay_ms} ms"))
            return False
        self._held[(envelope_identity(envelope), request.header.correlation_id)] = now + delay_ms / 1000.0
        return True

    def throttled_count(self) -> int:
        """PRODUCE responses held or promised a hold: the delay queue's occupancy."""
        return len(self._held) + len(self._delayed)

    def hold(self, envelope: Envelope, header: Header, frames: list[Any]) -> bool:
        """Called for every response: True when it was parked to go out later."""
        if header.api_key != ApiKey.PRODUCE or not self._held:
            return False
        release_s = self._held.pop((envelope_identity(envelope), header.correlation_id), None)
        if release_s is None or release_s <= time.monotonic():
            return False
        # No bound check here: ``_account`` admitted this request only with room for it
        # (held + delayed <= THROTTLED_RESPONSES_MAX), and a hold only moves between them.
        heapq.heappush(self._delayed, (release_s, next(self._order), envelope, frames))
        return True

    def release(self, node: NodeState, now: float) -> None:
        while self._delayed and self._delayed[0][0] <= now:
            _, _, envelope, frames = heapq.heappop(self._delayed)
            node.send(envelope, frames)
        if len(self._held) > THROTTLED_RESPONSES_MAX // 2:
            self._forget_stale(now)

    def next_release_s(self) -> float | None:
        return self._delayed[0][0] if self._delayed else None

    def _forget_stale(self, now: float) -> None:
        self._held = {key: due for key, due in self._held.items() if due > now - HELD_FORGET_S}

    def close(self) -> None:
        self.cache.close()
        try:
            self.zap.stop()
        except Exception:  # never started (start failed half-way): nothing to stop
            log.debug("ZAP authenticator was not running")
        close_client(self.zk)




# Loop duties (nodes/server.py duties()): send the throttled responses that are due.
def release_duty(node: NodeState, now: float) -> None:
    if node.authz is not None:
        node.authz.release(node, now)


def next_release(node: NodeState) -> float | None:
    return node.authz.next_release_s() if node.authz is not None else None
