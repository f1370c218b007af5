"""One health view per instance, fed by every caller path (sdk/direct/_blocking.py,
sdk/direct/_balance.py ``PeerHealth``).

A blocking request talks to its instance over its calling thread's own DEALER, so the
loop's DEALER never sees that traffic. Before, what a thread heard there (the reply, the
PONGs to its own PINGs) did not count for the instance's health: an instance that kept
answering blocking calls while the loop's PONG was late (its event loop busy behind those
very requests) turned suspect and then dead in the loop's view, and the calls waiting on it
gave up ("stopped answering heartbeats", a plain one as "may have run") although their
replies were on the way. The asyncio path has always counted its replies as signs of life.
The thread now stores the time it heard the instance; the loop's state machine decides.

Real ZeroMQ sockets (inproc), no ZooKeeper: the blocking path's wait and the loop's
heartbeat tick as the client runs them, with the loop's PONG simply not arriving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from fabric.protocol import direct as wire
from sdk.direct import _balance as balance
from sdk.direct._blocking import BlockingCaller
from sdk.direct._io import make_socket

INTERVAL_MS = 50  # shorter than the default 200 ms: the same rules, a faster test
LIVENESS = 4
LIMIT_S = INTERVAL_MS / 1000 * LIVENESS


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    """A blocking caller's DEALER and the instance's ROUTER."""
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    router.bind("inproc://instance")
    dealer = make_socket(ctx, zmq.DEALER)
    dealer.connect("inproc://instance")
    try:
        yield dealer, router
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()


def _caller() -> BlockingCaller:
    direct: Any = SimpleNamespace(retry_budget=balance.RetryBudget(), heartbeat_interval_ms=INTERVAL_MS)
    return BlockingCaller(direct, run_on_loop=lambda coro, margin_s: None, loop_thread=lambda: False)


def _peer(pinged_ago_s: float) -> Any:
    """An alive instance whose last PING from the loop went out ``pinged_ago_s`` ago and
    is not answered on the loop's own socket."""
    now = time.monotonic()
    health = balance.PeerHealth(now - 10, interval_ms=INTERVAL_MS, liveness=LIVENESS)
    health.heard(now - 10)
    assert health.ping_due(now - pinged_ago_s)
    return SimpleNamespace(znode="instance-0000000001", health=health, closed=False)


def _answer(router: zmq.Socket[Any], after_s: float = 0.0) -> None:
    """The instance: PONGs every PING at once (as its loop does while a handler runs),
    replies to the first REQUEST ``after_s`` after it came."""
    reply: tuple[bytes, int, float] | None = None  # identity, correlation id, when
    while True:
        wait_ms = 50 if reply is None else max(0, int((reply[2] - time.monotonic()) * 1000))
        if router.poll(wait_ms):
            identity, raw = router.recv_multipart()[:2]
            header = wire.decode_header(raw)
            if header.type == wire.PING:
                router.send_multipart([identity, *wire.pong_frames(1)])
            elif header.type == wire.REQUEST and reply is None:
                reply = identity, header.correlation_id, time.monotonic() + after_s
        if reply is not None and time.monotonic() >= reply[2]:
            router.send_multipart([reply[0], *wire.reply_frames(reply[1], b"ok")])
            return


def _tick(health: balance.PeerHealth, now: float) -> bool:
    """The loop's heartbeat tick for one peer (DirectClient._heartbeat_loop): what blocking
    callers heard counts first, then silence is judged. True when it turned dead."""
    health.absorb()
    return health.check(now)


def test_a_reply_a_blocking_caller_heard_answers_the_loops_ping(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    dealer, router = pair
    caller, peer = _caller(), _peer(pinged_ago_s=0.5)
    assert peer.health.suspect(time.monotonic())  # the loop's PONG is late: picked last
    cid = 7
    dealer.send_multipart(wire.request_frames(cid, b"x", timeout_ms=1000, idempotent=False))
    _answer(router)
    response = caller._wait(dealer, peer, cid, time.monotonic() + 1.0)
    assert not isinstance(response, str)
    heard_s = time.monotonic()
    # The instance answered after the loop's PING: it is not a suspect for any caller path,
    # and the loop does not declare it dead when the silence limit of that PING passes.
    assert not peer.health.suspect(heard_s)
    assert not _tick(peer.health, heard_s + 2 * LIMIT_S)
    assert peer.health.alive and peer.health.unanswered_since_s is None


def test_pongs_on_a_blocking_callers_socket_keep_the_instance_alive_through_a_long_call(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    """A handler running for longer than the silence limit: the thread PINGs its instance
    every interval and hears its PONGs; meanwhile the loop ticks on a view where its own
    PONGs do not come. The call gets its reply; before, the loop declared the instance dead
    at the silence limit and the call gave up."""
    dealer, router = pair
    caller, peer = _caller(), _peer(pinged_ago_s=0.0)
    cid = 9
    dealer.send_multipart(wire.request_frames(cid, b"x", timeout_ms=3000, idempotent=False))
    instance = threading.Thread(target=_answer, args=(router, LIMIT_S + 0.1))
    instance.start()
    stop = threading.Event()
    died: list[float] = []

    def loop_ticks() -> None:
        while not stop.wait(INTERVAL_MS / 2000):
            if _tick(peer.health, time.monotonic()):
                died.append(time.monotonic())
            peer.health.ping_due(time.monotonic())  # the loop PINGs on: no PONG comes back to it

    ticker = threading.Thread(target=loop_ticks)
    ticker.start()
    try:
        response = caller._wait(dealer, peer, cid, time.monotonic() + 3.0)
    finally:
        stop.set()
        ticker.join()
        instance.join()
    assert not isinstance(response, str), response
    assert died == [] and peer.health.alive


def test_frames_left_in_a_threads_socket_from_an_earlier_call_are_no_evidence(
        pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    """A thread's socket is read only while it waits: a PONG or a late reply queued there
    since an earlier call may be old, so it does not make a silent instance look alive."""
    dealer, router = pair
    caller, peer = _caller(), _peer(pinged_ago_s=0.5)
    dealer.send_multipart(wire.ping_frames(INTERVAL_MS))
    identity, _ = router.recv_multipart()
    router.send_multipart([identity, *wire.pong_frames(0)])  # an answer nobody read
    router.send_multipart([identity, *wire.reply_frames(3, b"late")])  # a reply to an abandoned call
    time.sleep(0.05)
    response = caller._wait(dealer, peer, 4, time.monotonic() + 0.05)  # nothing else comes
    assert isinstance(response, str)
    assert peer.health.suspect(time.monotonic())
    assert _tick(peer.health, time.monotonic() + LIMIT_S)


def test_a_reply_already_here_is_taken_past_the_deadline(pair: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> None:
    """A caller stopped (SIGSTOP) past its deadline while the reply came: the wait looks at
    what is already in its socket before it gives up, as the asyncio path does. It returned
    "no reply in time" unread, which left a request that had run with an unknown outcome
    (direct-plane fault hunt)."""
    dealer, router = pair
    caller, peer = _caller(), _peer(pinged_ago_s=0.5)
    dealer.send_multipart(wire.ping_frames(INTERVAL_MS))
    identity, _ = router.recv_multipart()
    router.send_multipart([identity, *wire.reply_frames(3, b"old")])  # an abandoned call's: skipped
    router.send_multipart([identity, *wire.reply_frames(4, b"ran")])
    time.sleep(0.05)
    response = caller._wait(dealer, peer, 4, time.monotonic() - 1.0)  # woke 1 s past the deadline
    assert not isinstance(response, str), response
    header, frames = response
    assert header.correlation_id == 4 and frames[-1] == b"ran"
    assert isinstance(caller._wait(dealer, peer, 5, time.monotonic() - 1.0), str)  # and nothing else waits


def test_the_loop_decides_from_the_threads_evidence_with_a_fake_clock() -> None:
    """``PeerHealth.absorb``: a time a thread stored counts once, against the PING then
    outstanding; it revives a dead peer as a frame on the loop's socket would."""
    health = balance.PeerHealth(0.0, interval_ms=200, liveness=4)
    health.heard(0.0)
    assert health.ping_due(1.0)
    health.thread_heard_s = 0.5  # heard before that PING: answers nothing
    assert not health.absorb() and health.unanswered_since_s == 1.0
    assert health.suspect(1.3) and health.check(1.9)  # dead: no frame since the PING
    health.thread_heard_s = 2.0  # a blocking call got its reply after all
    assert health.absorb() and health.alive and health.unanswered_since_s is None
    assert not health.absorb()  # taken in once
    assert health.ping_due(2.2)
    health.thread_heard_s = 2.3  # not absorbed yet: no caller path calls it silent meanwhile
    assert not health.suspect(2.5) and not health.check(3.1) and health.alive


_STALLED_CALLER = """
import asyncio, sys
from sdk.direct import _sync
_sync.WAIT_SLICE_S = 0.1  # the bound below is 0.8 s: a few slices (the client's are 10 s and more)

async def two_steps() -> str:
    await asyncio.sleep(0.5)  # the process is stopped during this one
    await asyncio.sleep(0.2)  # and this one still needs the loop after it resumes
    return "done"

loop = _sync.LoopThread()
print("READY", flush=True)
try:
    print(loop.run(two_steps(), 0.8), flush=True)
except Exception as exc:
    print(type(exc).__name__, exc, flush=True)
loop.stop()
"""


def test_a_stall_of_the_whole_process_is_not_the_loops_delay() -> None:
    """The blocking API waits for its loop thread with a bound (a call's timeout plus
    CALL_MARGIN_S) so that a wedged loop surfaces as an error. A process stopped (SIGSTOP,
    a stalled VM) for longer than that bound while a call waited resumed with the bound
    gone before the loop thread had a turn: ``sub.next(timeout_ms=200)`` or ``gather()``
    raised RequestTimeout ("the client's loop did not finish the call") instead of
    returning (fault hunt: a blocking subscriber SIGSTOPped for 12 s). The stopped time is
    not counted, as the heartbeats excuse it."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen([sys.executable, "-c", _STALLED_CALLER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY"
        child.send_signal(signal.SIGSTOP)
        time.sleep(1.2)  # longer than the call's whole bound
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline().strip() == "done"
        assert child.wait(10) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
