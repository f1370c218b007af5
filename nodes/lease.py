"""What a node may still do while its ZooKeeper connection is in doubt: one decision, one place.

ZooKeeper trouble is an outage of metadata changes, not of the data path. The rule:

* **acks=all** stays acknowledged while the connection is down (SUSPENDED), for as long
  as every in-sync replica keeps acknowledging. It is safe even after the session has
  expired and a new leader was elected: the ISR the leader uses only shrinks through a
  version-checked ZooKeeper write, so without ZooKeeper it cannot shrink, and a write
  counts as committed only once every member of it has the batch. Any new leader comes
  from that ISR and already holds every such batch (followers acknowledge only what they
  appended, and stop acknowledging the old leader as soon as they follow the new one).
* **acks=1** (and METADATA answers, which steer clients) only within the *lease*, in
  every state, CONNECTED included: the session cannot have expired before ``last_contact + session_timeout``, where
  ``last_contact`` is when a ZooKeeper request that was answered was *sent* (the server
  heard from us at or after that moment). Past the lease a new leader may exist, and an
  acks=1 write taken now could be cut off when this node rejoins: refuse it with a
  retriable error; refuse METADATA so clients ask another node. CONNECTED is not enough:
  kazoo notices a dead session only once its thread runs again, so a process SIGSTOPped
  past its session reads CONNECTED for a while after waking. The lease is renewed by
  every answered ZooKeeper round trip the node makes: a heartbeat every
  ``heartbeat_interval_s`` while connected, and one at once after every (re)connection,
  so the lease never starves after ZooKeeper comes back.
* **Session lost** (LOST/EXPIRED): step down from everything, register again, re-read.
* Fetches below the high watermark are always served: they are committed data.

Clocks are monotonic and passed in, so the rule is unit-tested without sleeping. A process
that was itself stopped (SIGSTOP) also sees its lease run out, since the monotonic clock
keeps counting; the node additionally re-verifies its session after any stalled loop turn.
"""

from __future__ import annotations

from typing import Final

CONNECTED: Final = "connected"
SUSPENDED: Final = "suspended"
LOST: Final = "lost"

# Part of the session timeout the lease trusts: a margin for the server's tick granularity
# and for the time between sending a heartbeat and the server reading it.
LEASE_FRACTION: Final[float] = 0.8
HEARTBEAT_INTERVAL_MAX_S: Final[float] = 1.0  # a heartbeat at least this often, and 4 per session


class SessionLease:
    def __init__(self, session_timeout_s: float, now: float) -> None:
        self.session_timeout_s = session_timeout_s
        self.state = CONNECTED
        self.last_contact_s = now
        self.since_s = now  # when the current state began

    @property
    def heartbeat_interval_s(self) -> float:
        return min(HEARTBEAT_INTERVAL_MAX_S, self.session_timeout_s / 4)

    def contact(self, sent_s: float) -> None:
        """A ZooKeeper request sent at ``sent_s`` was answered: the server heard us then."""
        if sent_s > self.last_contact_s:
            self.last_contact_s = sent_s

    def set_state(self, state: str, now: float) -> None:
        if state != self.state:
            self.state = state
            self.since_s = now

    def lease_end_s(self) -> float:
        return self.last_contact_s + self.session_timeout_s * LEASE_FRACTION

    def within_lease(self, now: float) -> bool:
        """acks=1 writes and METADATA answers are allowed now.

        Checked against the clock in every state: the monotonic clock kept counting while
        the process was stopped, so the lease has run out after a long stop whatever
        kazoo's (not yet updated) state says."""
        return self.state != LOST and now < self.lease_end_s()

    def replicated_writes_allowed(self) -> bool:
        """acks=all writes (acknowledged only once the whole ISR has them) are allowed."""
        return self.state != LOST

    def describe(self, now: float) -> str:
        if self.state == CONNECTED and now < self.lease_end_s():
            return "connected to ZooKeeper"
        return (f"{self.state} for {now - self.since_s:.1f} s; last ZooKeeper contact "
                f"{now - self.last_contact_s:.1f} s ago (session timeout {self.session_timeout_s:g} s)")
