"""Principals, ACL entries and the authorizer: pure, no sockets, no ZooKeeper, no clock.

A **principal** is a name bound to one CURVE public key, with a role:

* ``user``   gets what its ACL entries allow and nothing else (deny by default);
* ``super``  an operator key: every operation on every resource;
* ``node``   a storage node: every operation, including the replication APIs that no
             user may call (``replicate``), so a user key cannot pose as a follower.

An **ACL entry** allows one principal (or ``*``, every authenticated principal) one
operation on resources of one type whose name equals (``literal``) or starts with
(``prefix``) the entry's pattern. ``all`` as the operation allows every user operation.
Granting produce, consume, create, delete or alter also allows describe on the same
resources, as Kafka does: a producer needs the topic's metadata.

``Authorizer.authorize(principal, operation, resource)`` decides; ``required_access``
maps a decoded request to the (operation, resource) pairs it needs, in one table, so the
node checks every request in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from fabric.auth.keys import validate_name
from fabric.errors import InvalidRequestError
from fabric.protocol import queues
from fabric.protocol.apis import ApiKey, is_internal_topic


class Operation(str, Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    DESCRIBE = "describe"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    ADMIN = "admin"
    ALL = "all"  # only in ACL entries: every user operation
    REPLICATE = "replicate"  # node-to-node replication; only node and super keys


class ResourceType(str, Enum):
    TOPIC = "topic"
    GROUP = "group"
    QUEUE = "queue"  # a queue is a topic: an entry built for a queue is stored as the topic's
    SERVICE = "service"
    CLUSTER = "cluster"


class PatternType(str, Enum):
    LITERAL = "literal"
    PREFIX = "prefix"


class Role(str, Enum):
    USER = "user"
    SUPER = "super"
    NODE = "node"


CLUSTER_NAME = "cluster"  # the one cluster resource's name
ANY_PRINCIPAL = "*"
IMPLIES_DESCRIBE = frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.CREATE, Operation.DELETE, Operation.ALTER})
USER_OPERATIONS = frozenset(Operation) - {Operation.ALL, Operation.REPLICATE}
# What some request checks on each kind of resource (required_access below, and the direct
# plane's services: serving or publishing is produce, calling or subscribing is consume).
# An entry granting anything else could never allow a request, so adding one is refused
# (as kafka-acls refuses an operation its resource type does not take); `all` fits each.
OPERATIONS_BY_RESOURCE: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.DESCRIBE, Operation.CREATE,
                                   Operation.DELETE, Operation.ALTER, Operation.ALL}),
    ResourceType.QUEUE: frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.DESCRIBE, Operation.CREATE,
                                   Operation.DELETE, Operation.ALTER, Operation.ALL}),
    ResourceType.GROUP: frozenset({Operation.CONSUME, Operation.DESCRIBE, Operation.DELETE, Operation.ALL}),
    ResourceType.SERVICE: frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.ALL}),
    ResourceType.CLUSTER: frozenset({Operation.DESCRIBE, Operation.ALTER, Operation.ADMIN, Operation.ALL}),
}
_WHY_NOT = {
    (ResourceType.CLUSTER, Operation.CREATE): "creating a topic needs create on the topic: --topic-prefix '' for all",
    (ResourceType.CLUSTER, Operation.PRODUCE): "produce is granted per topic: --topic-prefix '' for all",
    (ResourceType.CLUSTER, Operation.CONSUME): "consume is granted per topic and group: --topic-prefix '' for all",
    (ResourceType.CLUSTER, Operation.DELETE): "delete is granted per topic or group: --topic-prefix '' for all",
}


@dataclass(frozen=True)
class Resource:
    type: ResourceType
    name: str

    def __str__(self) -> str:
        return self.type.value if self.type is ResourceType.CLUSTER else f"{self.type.value} {self.name!r}"


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True)
class Principal:
    name: str
    public_key: str  # Z85 text
    role: Role = Role.USER

    def encode(self) -> bytes:
        return json.dumps({"public_key": self.public_key, "role": self.role.value}, sort_keys=True).encode()

    @classmethod
    def decode(cls, name: str, raw: bytes) -> Principal:
        data = json.loads(raw)
        return cls(name, str(data["public_key"]), Role(data.get("role", "user")))


@dataclass(frozen=True)
class AclEntry:
    principal: str
    operation: Operation
    resource_type: ResourceType
    pattern: str
    pattern_type: PatternType = PatternType.LITERAL

    @classmethod
    def build(cls, principal: str, operation: str, resource_type: str, pattern: str,
              pattern_type: str = "literal") -> AclEntry:
        """Parse user input; InvalidRequestError names the bad value and the choices."""
        try:
            op = Operation(operation)
            rtype = ResourceType(resource_type)
            ptype = PatternType(pattern_type)
        except ValueError as exc:
            raise InvalidRequestError(
                f"{exc}; operations: {', '.join(o.value for o in Operation if o is not Operation.REPLICATE)}; "
                f"resources: {', '.join(r.value for r in ResourceType)}; patterns: literal, prefix"
            ) from None
        if op is Operation.REPLICATE:
            raise InvalidRequestError("replicate is granted by the node role, not by an ACL")
        if rtype is ResourceType.CLUSTER:
            pattern, ptype = CLUSTER_NAME, PatternType.LITERAL
        if rtype is ResourceType.QUEUE:
            # Queue mode's requests name the topic the queue is (required_access), so an
            # entry for a queue must be one for that topic; kept apart, it granted nothing.
            rtype = ResourceType.TOPIC
        if not principal or (not pattern and ptype is PatternType.LITERAL):
            raise InvalidRequestError("an ACL needs a principal and a resource name (or --prefix '')")
        return cls(principal, op, rtype, pattern, ptype)

    def check_grants_something(self) -> None:
        """InvalidRequestError unless some request checks this operation on this kind of
        resource and the principal is `*` or a name a principal can have: `produce
        --cluster`, `admin --topic t` or `-p 'alice bob'` would be stored and never allow
        anything. Checked when an entry is added, not when one is removed (an entry stored
        before this check must still be removable)."""
        if self.principal != ANY_PRINCIPAL:
            validate_name(self.principal)  # a name no principal can have would match nobody
        allowed = OPERATIONS_BY_RESOURCE[self.resource_type]
        if self.operation in allowed:
            return
        what = "the cluster" if self.resource_type is ResourceType.CLUSTER else f"a {self.resource_type.value}"
        hint = _WHY_NOT.get((self.resource_type, self.operation))
        raise InvalidRequestError(
            f"{self.operation.value} on {what} allows no request; {what} takes "
            f"{', '.join(o.value for o in Operation if o in allowed)}" + (f" ({hint})" if hint else ""))

    def matches(self, principal: str, operation: Operation, resource: Resource) -> bool:
        entry_type = ResourceType.TOPIC if self.resource_type is ResourceType.QUEUE else self.resource_type  # stored before build() mapped it
        if self.principal not in (principal, ANY_PRINCIPAL) or entry_type is not resource.type:
            return False
        if self.pattern_type is PatternType.LITERAL:
            if self.pattern != resource.name:
                return False
        elif not resource.name.startswith(self.pattern):
            return False
        if operation is Operation.REPLICATE:
            return False
        if self.operation in (operation, Operation.ALL):
            return True
        return operation is Operation.DESCRIBE and self.operation in IMPLIES_DESCRIBE

    def to_json(self) -> dict[str, str]:
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AclEntry:
        return cls(str(data["principal"]), Operation(data["operation"]), ResourceType(data["resource_type"]),
                   str(data["pattern"]), PatternType(data.get("pattern_type", "literal")))

    def __str__(self) -> str:
        where = "cluster" if self.resource_type is ResourceType.CLUSTER else (
            f"{self.resource_type.value} {'prefix ' if self.pattern_type is PatternType.PREFIX else ''}{self.pattern!r}")
        return f"{self.principal} may {self.operation.value} on {where}"


def encode_acls(entries: Iterable[AclEntry]) -> bytes:
    return json.dumps({"version": 1, "acls": [e.to_json() for e in entries]}, sort_keys=True).encode()


def decode_acls(raw: bytes | None) -> list[AclEntry]:
    if not raw:
        return []
    return [AclEntry.from_json(item) for item in json.loads(raw).get("acls", [])]


class Authorizer:
    """One immutable snapshot of principals and ACLs. Swap the whole object on a change,
    so a request is never checked against half an update."""

    def __init__(self, principals: Mapping[str, Principal], acls: Iterable[AclEntry]) -> None:
        self.principals = dict(principals)
        self.by_key = {p.public_key: p for p in self.principals.values()}
        self.acls = tuple(acls)

    def principal_for_key(self, public_key: str) -> Principal | None:
        return self.by_key.get(public_key)

    def authorize(self, principal: str, operation: Operation, resource: Resource) -> bool:
        known = self.principals.get(principal)
        if known is None:
            return False
        if known.role in (Role.SUPER, Role.NODE):
            return True
        return any(entry.matches(principal, operation, resource) for entry in self.acls)

    def first_denied(self, principal: str, needs: Iterable[tuple[Operation, Resource]]) -> tuple[Operation, Resource] | None:
        for operation, resource in needs:
            if not self.authorize(principal, operation, resource):
                return operation, resource
        return None


def _topics(items: Iterable[Mapping[str, Any]], key: str = "topic") -> list[Resource]:
    seen: dict[str, Resource] = {}
    for item in items:
        seen.setdefault(item[key], Resource(ResourceType.TOPIC, item[key]))
    return list(seen.values())


def required_access(api_key: int, body: Mapping[str, Any]) -> list[tuple[Operation, Resource]]:
    """What a decoded request needs. APIs not in this table need ``admin`` on the cluster,
    so an API added later is closed in secure mode until someone decides its access here."""
    if api_key == ApiKey.API_VERSIONS:
        return []
    if api_key == ApiKey.METADATA:
        # Asking for all topics is allowed to every principal and lists only the topics it
        # may describe (nodes/authz.py); asking for named topics needs describe.
        return [(Operation.DESCRIBE, Resource(ResourceType.TOPIC, t)) for t in dict.fromkeys(body["topics"])]
    if api_key == ApiKey.PRODUCE:
        # Writing an internal topic is the nodes' business (the coordinators' state), like
        # replication: no topic ACL grants it, not even a wildcard one.
        return [(Operation.REPLICATE, CLUSTER) if is_internal_topic(r.name) else (Operation.PRODUCE, r)
                for r in _topics(body["entries"])]
    if api_key == ApiKey.FETCH:
        if body["replica_id"] >= 0:
            return [(Operation.REPLICATE, CLUSTER)]
        return [(Operation.CONSUME, r) for r in _topics(body["partitions"])]
    if api_key == ApiKey.LIST_OFFSETS:
        return [(Operation.DESCRIBE, r) for r in _topics(body["partitions"])]
    if api_key == ApiKey.CREATE_TOPIC:
        if is_internal_topic(body["name"]):
            return [(Operation.REPLICATE, CLUSTER)]
        return [(Operation.CREATE, Resource(ResourceType.TOPIC, body["name"]))]
    if api_key == ApiKey.DELETE_TOPIC:
        return [(Operation.DELETE, Resource(ResourceType.TOPIC, body["name"]))]
    if api_key in (ApiKey.DESCRIBE_TOPICS, ApiKey.DESCRIBE_REPLICAS):  # `fabric topic describe` sends both
        names = body["names"] if api_key == ApiKey.DESCRIBE_TOPICS else body["topics"]
        if not names:
            return [(Operation.DESCRIBE, CLUSTER)]
        return [(Operation.DESCRIBE, Resource(ResourceType.TOPIC, t)) for t in dict.fromkeys(names)]
    if api_key == ApiKey.INIT_PRODUCER_ID:
        return []  # any authenticated principal; the ids are useless without produce rights
    if api_key in (ApiKey.REPLICA_ACK, ApiKey.OFFSETS_FOR_LEADER_EPOCH):
        return [(Operation.REPLICATE, CLUSTER)]
    if api_key in (ApiKey.ELECT_LEADERS, ApiKey.REASSIGN_PARTITION):
        return [(Operation.ALTER, CLUSTER)]
    if api_key in (ApiKey.CREATE_PARTITIONS, ApiKey.ALTER_TOPIC_CONFIGS):
        return [(Operation.ALTER, Resource(ResourceType.TOPIC, body["name"]))]
    group_needs = _group_access(api_key, body)
    if group_needs is not None:
        return group_needs
    queue_needs = _queue_access(api_key, body)
    if queue_needs is not None:
        return queue_needs
    return [(Operation.ADMIN, CLUSTER)]


def _group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


def _group_access(api_key: int, body: Mapping[str, Any]) -> list[tuple[Operation, Resource]] | None:
    """Consumer groups, as Kafka: joining and committing read the group (consume), and a
    commit also needs consume on each topic it names."""
    if api_key == ApiKey.FIND_COORDINATOR:
        return [(Operation.DESCRIBE, _group(body["group_id"]))]
    if api_key == ApiKey.CONSUMER_GROUP_HEARTBEAT:
        return [(Operation.CONSUME, _group(body["group_id"]))]
    if api_key == ApiKey.OFFSET_COMMIT:
        return [(Operation.CONSUME, _group(body["group_id"])),
                *[(Operation.CONSUME, r) for r in _topics(body["offsets"])]]
    if api_key == ApiKey.OFFSET_FETCH:
        return [(Operation.DESCRIBE, _group(body["group_id"])),
                *[(Operation.DESCRIBE, r) for r in _topics(body["partitions"])]]
    if api_key == ApiKey.LIST_GROUPS:
        return [(Operation.DESCRIBE, CLUSTER)]
    if api_key == ApiKey.DESCRIBE_GROUPS:
        return [(Operation.DESCRIBE, _group(g)) for g in dict.fromkeys(body["group_ids"])]
    if api_key == ApiKey.DELETE_GROUPS:
        return [(Operation.DELETE, _group(g)) for g in dict.fromkeys(body["group_ids"])]
    return None


def _queue_access(api_key: int, body: Mapping[str, Any]) -> list[tuple[Operation, Resource]] | None:
    """Queue mode (API keys 40-44), as Kafka share groups: a queue is a topic, so receiving
    and settling need consume on the topic (which also lets the worker see its routing) and
    consume on the group; describing needs describe on the topic; deleting a queue group
    needs delete on the group, as DELETE_GROUPS (Kafka's DeleteShareGroupState, DELETE on the
    group). Creating, deleting and sending are topic operations, checked as such."""
    if api_key in (queues.API_QUEUE_RECEIVE, queues.API_QUEUE_SETTLE):
        return [(Operation.CONSUME, Resource(ResourceType.TOPIC, body["queue"])),
                (Operation.CONSUME, _group(body["group"]))]
    if api_key == queues.API_QUEUE_DESCRIBE:
        return [(Operation.DESCRIBE, Resource(ResourceType.TOPIC, body["queue"]))]
    if api_key == queues.API_QUEUE_DELETE_GROUP:
        return [(Operation.DELETE, _group(body["group"]))]
    if api_key == queues.API_QUEUE_PURGE:
        # Every group's messages: delete on the topic, as Kafka's DeleteRecords. One group's:
        # delete on that group (as deleting its state) and consume on the topic (it settles
        # what that group's workers could have acknowledged).
        topic = Resource(ResourceType.TOPIC, body["queue"])
        if not body["group"]:
            return [(Operation.DELETE, topic)]
        return [(Operation.CONSUME, topic), (Operation.DELETE, _group(body["group"]))]
    return None
