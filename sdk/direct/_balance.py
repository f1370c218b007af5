"""Decisions of the direct-plane client, free of sockets and clocks: which instance takes a
request, whether a retry is allowed, whether a peer is still alive. The caller passes the
time in (``now`` in monotonic seconds) so unit tests drive these with a fake clock.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping

from fabric import errors

# Paranoid Pirate timing (the ZeroMQ guide, ppqueue.py): a ping every interval; a peer
# silent for LIVENESS intervals is dead. 200 ms x 4 detects a dead or SIGSTOPped instance in
# well under a second, long before a ZooKeeper session (typically 10-30 s) expires.
HEARTBEAT_INTERVAL_MS = 200
HEARTBEAT_LIVENESS = 4
CALLERS_MAX = 10_000  # callers an instance tracks heartbeats of

CONNECTING = "connecting"  # registered, no PONG yet: not picked, so nothing queues to it
ALIVE = "alive"
DEAD = "dead"  # silent too long: not picked; pinged still, and alive again on its next PONG


class PeerHealth:
    """One peer's liveness, from the traffic received from it.

    Silence counts from the first PING the peer has left unanswered, not from the last
    frame heard: if this process itself stalls (SIGSTOP, a loop blocked by user code), it
    sent no PINGs meanwhile, so the peer had nothing to answer and is not blamed for the
    gap. It is dead once a PING has gone ``liveness`` intervals without any frame back,
    also when it has never answered at all (registered, but not serving: gathers, which
    ask peers not heard from yet, would otherwise keep asking it for ever).

    Frames count from every socket of this client to the peer. The loop's own DEALER
    calls ``heard``; a blocking caller's thread, which waits on a DEALER of its own, only
    stores the time it heard the peer in ``thread_heard_s`` (one attribute store: no lock
    on its request path), and ``absorb``, on the loop, turns that into a transition. So
    the state is decided here, on one thread, from all the evidence, and both caller paths
    see one verdict: an instance that answers blocking calls while the loop's PONG is late
    (its event loop busy behind those very requests) is no longer a suspect, then dead,
    for the loop (and so for the blocking calls waiting on it) while the threads hear it."""

    def __init__(self, now: float, *, interval_ms: int = HEARTBEAT_INTERVAL_MS,
                 liveness: int = HEARTBEAT_LIVENESS) -> None:
        if interval_ms <= 0 or liveness <= 0:
            raise ValueError("heartbeat interval_ms and liveness must be positive")
        self.interval_s = interval_ms / 1000.0
        self.silence_limit_s = self.interval_s * liveness
        self.state = CONNECTING
        self.created_s = now
        self.last_heard_s = now
        self.last_ping_s = float("-inf")
        self.unanswered_since_s: float | None = None  # the first PING sent since the last frame heard
        # Written by blocking callers' threads (sdk/direct/_blocking.py): the last time one
        # heard the peer on its own socket. A float store is atomic; when two threads race,
        # an earlier time may overwrite a later one, which only undercounts.
        self.thread_heard_s = float("-inf")
        self._thread_judged_s = float("-inf")  # the value of thread_heard_s ``absorb`` last took in

    def heard(self, now: float) -> bool:
        """Any frame from the peer. Returns True when this revives or first admits it."""
        self.last_heard_s = now
        self.unanswered_since_s = None
        if self.state != ALIVE:
            self.state = ALIVE
            return True
        return False

    def absorb(self) -> bool:
        """On the loop, before ``check``: a time a blocking caller stored in
        ``thread_heard_s`` since the last call is a frame heard then, if it answers the
        PING left unanswered (it came after it) or none is outstanding; one from before
        that PING is old news. Returns True when this revives the peer (as ``heard``)."""
        heard_s = self.thread_heard_s
        if heard_s == self._thread_judged_s:
            return False  # nothing new: the common case, one comparison per peer and tick
        self._thread_judged_s = heard_s
        since = self.unanswered_since_s
        if heard_s <= self.last_heard_s or (since is not None and heard_s < since):
            return False
        return self.heard(heard_s)

    def _answered(self, since: float) -> bool:
        """A blocking caller heard the peer after the PING sent at ``since``: it is not
        silent, though ``absorb`` has yet to take that in (any thread may ask)."""
        return self.thread_heard_s >= since

    def check(self, now: float) -> bool:
        """Returns True when the peer just turned dead (its in-flight requests are lost)."""
        since = self.unanswered_since_s
        if (self.state != DEAD and since is not None and now - since > self.silence_limit_s
                and not self._answered(since)):
            self.state = DEAD
            return True
        return False

    def excuse(self, stalled_s: float) -> None:
        """This process did not run for ``stalled_s`` (its heartbeat loop woke that late: a
        garbage-collector pause, a starved or stopped process, a VM's stolen time). A PING
        sent just before went unanswered through the stall through no fault of the peer's,
        whose PONG may be on its way or, in the same process or on the same stalled VM,
        not sent yet: the stall is not counted as its silence. Without this the first
        check after a stall of over ``silence_limit_s`` declared a healthy peer dead (and
        failed the requests waiting on it)."""
        if self.unanswered_since_s is not None and stalled_s > 0:
            self.unanswered_since_s += stalled_s

    def suspect(self, now: float) -> bool:
        """A PING unanswered for longer than an interval (a PONG normally takes well under a
        millisecond): maybe paused or dying, not dead yet. Picked only when nothing better
        is left, so a stalled instance stops taking requests long before it is declared dead."""
        since = self.unanswered_since_s
        return since is not None and now - since > self.interval_s and not self._answered(since)

    def ping_due(self, now: float) -> bool:
        if now - self.last_ping_s >= self.interval_s:
            self.last_ping_s = now
            if self.unanswered_since_s is None:
                self.unanswered_since_s = now
            return True
        return False

    @property
    def alive(self) -> bool:
        return self.state == ALIVE


class CallerLiveness:
    """An instance's view of its callers: the other half of Paranoid Pirate. A caller that
    PINGs is held to its own heartbeat interval (the PING's ``aux``); without any frame
    from it (a PING, a REQUEST, anything) for ``liveness`` of its intervals it is declared
    gone, and the instance drops what it keeps for it (requests still queued for a handler
    slot). Callers that never PING (a minimal C caller, a one-shot tool) are not tracked,
    so silence never costs them a request. Bounded: past ``callers_max`` the
    longest-silent caller is forgotten first."""

    def __init__(self, *, liveness: int = HEARTBEAT_LIVENESS, callers_max: int = CALLERS_MAX) -> None:
        if liveness <= 0 or callers_max <= 0:
            raise ValueError("caller liveness and callers_max must be positive")
        self.liveness = liveness
        self.callers_max = callers_max
        # caller -> the time by which it must be heard again; insertion order is the order
        # of last contact (a PING moves its caller to the end), so the front is the most silent.
        self._deadline_s: dict[bytes, float] = {}
        self._silence_limit_s: dict[bytes, float] = {}  # caller -> liveness x its interval
        # Followed callers that sent any other frame since the last expired(): their
        # deadlines move then, so the request path reads no clock (at most one sweep
        # interval of extra grace).
        self._touched: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._deadline_s)

    def __contains__(self, caller: object) -> bool:
        return caller in self._deadline_s

    def callers(self) -> list[bytes]:
        """The callers followed now (their identities), most silent first."""
        return list(self._deadline_s)

    def heard(self, caller: bytes, now: float, interval_ms: int = 0) -> None:
        """A PING from ``caller``, announcing its heartbeat interval (0: the default)."""
        limit_s = (interval_ms or HEARTBEAT_INTERVAL_MS) / 1000.0 * self.liveness
        self._deadline_s.pop(caller, None)
        self._deadline_s[caller] = now + limit_s
        self._silence_limit_s[caller] = limit_s
        while len(self._deadline_s) > self.callers_max:
            oldest = next(iter(self._deadline_s))
            del self._deadline_s[oldest]
            del self._silence_limit_s[oldest]

    def touch(self, caller: bytes) -> None:
        """Any frame from ``caller`` (called for every one, so kept cheap): a followed
        caller is alive; callers never PINGed stay untracked."""
        if caller in self._deadline_s:
            self._touched.add(caller)

    def expired(self, now: float) -> list[bytes]:
        """Callers silent past their limit, forgotten as they are returned. Callers
        touched since the last call are heard as of ``now`` first."""
        if self._touched:
            touched, self._touched = self._touched, set()
            for caller in touched:
                limit_s = self._silence_limit_s.get(caller)
                if limit_s is not None:  # not forgotten meanwhile (callers_max)
                    del self._deadline_s[caller]
                    self._deadline_s[caller] = now + limit_s
        gone = [caller for caller, deadline in self._deadline_s.items() if now > deadline]
        for caller in gone:
            del self._deadline_s[caller]
            del self._silence_limit_s[caller]
        return gone


def pick_instance(outstanding: Mapping[str, int], *, exclude: Iterable[str] = (), avoid: Iterable[str] = (),
                  rng: random.Random | None = None) -> str | None:
    """Least outstanding requests among the candidates (instance -> requests in flight),
    ties broken at random so equal instances share the load. Instances in ``exclude``
    (already tried by this call) are used only when nothing else is left; those in
    ``avoid`` (suspects: a heartbeat late) only when every untried one is avoided."""
    if not outstanding:
        return None
    excluded, avoided = set(exclude), set(avoid)
    untried = [name for name in outstanding if name not in excluded]
    pool = [name for name in untried if name not in avoided] or untried or list(outstanding)
    fewest = min(outstanding[name] for name in pool)
    best = [name for name in pool if outstanding[name] == fewest]
    if len(best) == 1:
        return best[0]
    return (rng or random).choice(best)


class RetryBudget:
    """Retries allowed as a share of recent requests (Finagle's RetryBudget): every request
    deposits ``ratio`` of a token, every retry withdraws one; a floor of
    ``min_retries_per_s`` keeps a quiet client able to retry. Bounded at ``tokens_max`` so a
    long calm period cannot bank a retry storm."""

    def __init__(self, *, ratio: float = 0.2, min_retries_per_s: float = 10.0, tokens_max: float = 100.0,
                 now: float = 0.0) -> None:
        if not 0.0 <= ratio <= 1.0 or min_retries_per_s < 0 or tokens_max < 1:
            raise ValueError("retry budget: ratio in [0, 1], min_retries_per_s >= 0, tokens_max >= 1")
        self.ratio = ratio
        self.min_retries_per_s = min_retries_per_s
        self.tokens_max = tokens_max
        self.tokens = min(tokens_max, max(1.0, min_retries_per_s))
        self._refilled_s = now
        self._deposits = 0  # requests since the last refill, whose ratio is not in tokens yet
        self.retries_refused = 0

    def _refill(self, now: float) -> None:
        # Deposits only add and the cap applies after each, so adding them all at once and
        # capping once gives the same tokens as adding each as its request came.
        elapsed = max(0.0, now - self._refilled_s)
        self._refilled_s = now
        deposits, self._deposits = self._deposits, 0
        self.tokens = min(self.tokens_max, self.tokens + elapsed * self.min_retries_per_s + deposits * self.ratio)

    def on_request(self, now: float) -> None:
        """Counted only: every request pays this, a retry (``try_retry``) is rare."""
        self._deposits += 1

    def try_retry(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        self.retries_refused += 1
        return False


class Attempts:
    """One request's attempts under Lazy Pirate: how long each may take, whether another may
    follow, and the error when none may. The asyncio and the blocking request paths both
    drive one of these, so the rules live here once.

    An attempt gets an equal share of the remaining time over the attempts still allowed
    (one for a non-idempotent call: it is sent once). An attempt may be repeated on another
    instance when the caller marked the call idempotent, or when the instance refused it
    without running it (``retry_safe``: overloaded, stopping, send queue full); always
    within ``attempts_max``, the deadline and the client's retry budget."""

    def __init__(self, *, timeout_ms: int, idempotent: bool, attempts_max: int, budget: RetryBudget,
                 now: float) -> None:
        self.start_s = now
        self.deadline_s = now + timeout_ms / 1000
        self.idempotent = idempotent
        self.attempts_max = attempts_max
        self.attempt = 0
        self._budget = budget
        budget.on_request(now)

    def begin(self, now: float) -> float:
        """Starts the next attempt; returns its share of the time, in seconds."""
        self.attempt += 1
        attempts_left = self.attempts_max - self.attempt + 1 if self.idempotent else 1
        return max(0.0, self.deadline_s - now) / attempts_left

    def may_repeat(self, now: float, *, retry_safe: bool) -> bool:
        if not (retry_safe or self.idempotent) or self.attempt >= self.attempts_max or now >= self.deadline_s:
            return False
        return self._budget.try_retry(now)

    def failure(self, service: str, problem: str, now: float, *, retry_safe: bool) -> errors.FabricError:
        """The error once no further attempt is allowed."""
        if retry_safe:
            return errors.NoServiceAvailable(
                f"service {service!r}: no instance took the request after {self.attempt} attempt(s): {problem}",
                attempts=self.attempt)
        elapsed_ms = (now - self.start_s) * 1000
        outcome = "" if self.idempotent else " (sent once, not retried: the handler may or may not have run)"
        return errors.RequestTimeout(
            f"service {service!r}: {problem} after {self.attempt} attempt(s), {elapsed_ms:.0f} ms{outcome}",
            attempts=self.attempt, service=service)
