"""A caller forgets the services it stopped calling (sdk/direct/_peers.py ``_ServiceView.idle``):
a long-lived client that called many names (one per deployment, per job, typos) kept a
view, a ZooKeeper watch and connections for each of them for ever."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace
from typing import Any

from sdk.direct import _balance as balance
from sdk.direct._client import SERVICE_VIEW_IDLE_MS
from sdk.direct._peers import _ServiceView

IDLE_S = SERVICE_VIEW_IDLE_MS / 1000


def _view(used_s: float, *peers: Any) -> _ServiceView:
    view = _ServiceView("pricing")
    view.known.set()
    view.used_s = used_s
    view.peers = {f"instance-{i}": peer for i, peer in enumerate(peers)}
    return view


def test_a_view_unused_for_the_idle_time_may_go() -> None:
    quiet = SimpleNamespace(pending={}, blocking_outstanding=0)
    assert _view(100.0, quiet).idle(100.0 + IDLE_S, IDLE_S)
    assert not _view(100.0, quiet).idle(100.0 + IDLE_S - 0.001, IDLE_S)
    assert _view(100.0).idle(100.0 + IDLE_S, IDLE_S)  # a name nobody serves


def test_a_view_with_calls_in_flight_or_still_loading_stays() -> None:
    waiting = SimpleNamespace(pending={7: object()}, blocking_outstanding=0)
    blocking = SimpleNamespace(pending={}, blocking_outstanding=1)
    assert not _view(0.0, waiting).idle(IDLE_S * 10, IDLE_S)
    assert not _view(0.0, blocking).idle(IDLE_S * 10, IDLE_S)
    loading = _ServiceView("pricing")
    loading.used_s = 0.0
    assert not loading.idle(IDLE_S * 10, IDLE_S)


def test_picking_counts_as_use() -> None:
    view = _view(0.0)
    before_s = time.monotonic()
    assert view.pick([], random.Random(1)) is None
    assert view.used_s >= before_s
    assert not view.idle(view.used_s + IDLE_S / 2, IDLE_S)


def _peer(state: str, *, leaving: bool = False, draining: bool = False) -> Any:
    health = SimpleNamespace(state=state, alive=state == balance.ALIVE)
    return SimpleNamespace(health=health, leaving=leaving, draining=draining, trusted=True,
                           pickable=health.alive and not leaving and not draining)


def test_a_leaving_instance_is_the_last_resort_only_while_no_new_one_is_yet_to_answer() -> None:
    """An instance that left the registry but still answers heartbeats bridges a ZooKeeper
    session that expired and came back. One that has just stopped also counts as alive for
    up to a heartbeat interval, and a request it got in that window was lost; so while a
    registered instance (a replacement) has yet to answer its first PING, the caller waits
    for it instead."""
    left = _peer(balance.ALIVE, leaving=True)
    view = _view(0.0, left)
    view.refresh()
    assert view.ready == [left]
    view = _view(0.0, left, _peer(balance.CONNECTING))
    view.refresh()
    assert view.ready == []
    view = _view(0.0, left, _peer(balance.DEAD))  # the new one never answered: the old one again
    view.refresh()
    assert view.ready == [left]
    view = _view(0.0, _peer(balance.ALIVE, leaving=True, draining=True))  # it sent a stop notice
    view.refresh()
    assert view.ready == []
