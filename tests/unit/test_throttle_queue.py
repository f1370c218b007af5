"""The node's quota delay queue when it is full: an over-quota PRODUCE is refused THROTTLED
before it is written (never answered at once unthrottled, never dropped after writing).

The decision is ``nodes.authz.NodeSecurity._account``/``hold``; this drives them with a
clock-free recording node (no ZooKeeper, no sockets: the real-cluster quota test is in
tests/integration/test_secure_cluster.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from fabric import errors
from fabric.auth.acl import Authorizer
from fabric.auth.quota import Quota, Throttle
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import Header
from nodes import authz

QUEUE_MAX = 3


class _RecordingNode:
    def __init__(self) -> None:
        self.errors: list[errors.FabricError] = []

    def send_error(self, envelope: Any, header: Header | None, exc: errors.FabricError) -> None:
        self.errors.append(exc)


class _Cache:
    def __init__(self, quotas: dict[str, Quota]) -> None:
        self.quotas = quotas
        self.authorizer = Authorizer({}, [])


def _security(quotas: dict[str, Quota]) -> authz.NodeSecurity:
    security = authz.NodeSecurity.__new__(authz.NodeSecurity)  # no ZooKeeper, no ZAP: only the queue
    security.cache = _Cache(quotas)  # type: ignore[assignment]
    security.throttle = Throttle()
    security._quotas_seen = None
    security._held = {}
    security._delayed = []
    security._order = itertools.count()
    security.refused_throttled = 0
    return security


def _produce(correlation_id: int, nbytes: int, acks: int = 1) -> apis.Message:
    return apis.Message(Header(ApiKey.PRODUCE, 0, correlation_id), {"acks": acks, "entries": []}, [b"x" * nbytes])


@pytest.fixture(autouse=True)
def small_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(authz, "THROTTLED_RESPONSES_MAX", QUEUE_MAX)


def test_full_queue_refuses_over_quota_produce_unwritten() -> None:
    security, node = _security({"greedy": Quota(1_000)}), _RecordingNode()
    envelope = [b"client-1"]
    admitted = [security._account(node, envelope, _produce(cid, 5_000), "greedy")  # type: ignore[arg-type]
                for cid in range(1, QUEUE_MAX + 3)]
    # 5,000 bytes at 1,000 B/s exceed the one-second burst: every one is held or refused.
    assert admitted == [True] * QUEUE_MAX + [False, False]
    assert security.throttled_count() == QUEUE_MAX
    assert [type(e) for e in node.errors] == [errors.ThrottledError, errors.ThrottledError]
    assert all(e.retriable for e in node.errors)
    assert security.refused_throttled == 2
    # Held responses still wait their turn; none went out early.
    for cid in range(1, QUEUE_MAX + 1):
        assert security.hold(envelope, Header(ApiKey.PRODUCE, 0, cid), [b"response"])
    assert security.throttled_count() == QUEUE_MAX


def test_refused_produce_is_not_charged() -> None:
    security, node = _security({"greedy": Quota(1_000)}), _RecordingNode()
    for cid in range(1, QUEUE_MAX + 1):
        security._account(node, [b"c"], _produce(cid, 5_000), "greedy")  # type: ignore[arg-type]
    charged = security.throttle._tat["greedy"]
    assert not security._account(node, [b"c"], _produce(99, 5_000), "greedy")  # type: ignore[arg-type]
    assert security.throttle._tat["greedy"] == pytest.approx(charged)


def test_within_quota_passes_even_when_the_queue_is_full() -> None:
    security, node = _security({"greedy": Quota(1_000), "polite": Quota(10_000_000)}), _RecordingNode()
    for cid in range(1, QUEUE_MAX + 1):
        security._account(node, [b"g"], _produce(cid, 5_000), "greedy")  # type: ignore[arg-type]
    assert security._account(node, [b"p"], _produce(1, 1_000), "polite")  # type: ignore[arg-type]
    assert not node.errors


def test_an_over_quota_acks_0_produce_is_charged_but_takes_no_place_in_the_queue() -> None:
    security, node = _security({"greedy": Quota(1_000)}), _RecordingNode()
    for cid in range(1, 2 * QUEUE_MAX + 1):  # more than the queue holds: none is refused
        assert security._account(node, [b"c"], _produce(cid, 5_000, acks=0), "greedy")  # type: ignore[arg-type]
    assert security.throttled_count() == 0 and not node.errors
    # The bytes count: the principal's next answered PRODUCE is held for them.
    assert security._account(node, [b"c"], _produce(99, 10, acks=1), "greedy")  # type: ignore[arg-type]
    assert security.throttled_count() == 1
