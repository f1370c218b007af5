"""Per-principal produce byte-rate quotas: how long to hold a response. Pure, clock passed in.

The node writes every batch it accepts at once and only *delays the response* by the time
this computes, as Kafka throttles: a producer keeps a bounded number of requests in
flight, so a later acknowledgement slows it down to its quota, and nothing is dropped.

The rule is GCRA (the generic cell rate algorithm, a token bucket kept as one number per
principal): a principal's "theoretical arrival time" ``tat`` moves forward by
``bytes / rate`` for each batch; the response waits until ``tat - burst``. Over any
window the principal gets at most ``rate * window + rate * burst`` bytes acknowledged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from fabric.errors import InvalidRequestError

DEFAULT_PRINCIPAL = "*"  # a quota for every principal without one of its own
BURST_S_DEFAULT = 1.0
# The longest one response is held. A client following docs/PROTOCOL.md section 8 gives
# each request 30 s (the SDKs' request_timeout_ms); a hold of 30 s (this was the cap) made
# a single large batch answer just as that timeout fired, and the client resent it (a
# duplicate without idempotence). 10 s leaves two thirds of the timeout for the request's
# own work (an acks=all wait for replicas) and the network, and is about Kafka's default
# quota window (11 samples of 1 s), over which its throttle is computed. The cap forgives
# nothing: ``record`` charges the whole batch to the principal's ``tat``, so the debt past
# the cap holds its next responses in turn, and a client that waits for its answers is
# held to the quota on average as long as it keeps less than rate * 10 s unanswered (with
# B bytes unanswered it gets at most about B per 10 s: docs/PROTOCOL.md 5.2, "Quotas").
THROTTLE_MS_MAX = 10_000
TRACKED_PRINCIPALS_MAX = 100_000


@dataclass(frozen=True)
class Quota:
    produce_bytes_per_s: int

    def __post_init__(self) -> None:
        if self.produce_bytes_per_s <= 0:
            raise InvalidRequestError(f"produce_bytes_per_s must be positive, got {self.produce_bytes_per_s}")


def encode_quotas(quotas: Mapping[str, Quota]) -> bytes:
    return json.dumps({"version": 1, "quotas": {p: {"produce_bytes_per_s": q.produce_bytes_per_s}
                                                for p, q in sorted(quotas.items())}}).encode()


def decode_quotas(raw: bytes | None) -> dict[str, Quota]:
    if not raw:
        return {}
    data = json.loads(raw).get("quotas", {})
    return {p: Quota(int(v["produce_bytes_per_s"])) for p, v in data.items()}


class Throttle:
    """Throttle decisions for every principal, from the quotas in force. One thread only
    (the node's loop)."""

    def __init__(self, quotas: Mapping[str, Quota] | None = None, burst_s: float = BURST_S_DEFAULT) -> None:
        self.quotas: dict[str, Quota] = dict(quotas or {})
        self.burst_s = burst_s
        self._tat: dict[str, float] = {}  # principal -> theoretical arrival time, monotonic s

    def set_quotas(self, quotas: Mapping[str, Quota]) -> None:
        self.quotas = dict(quotas)

    def quota_for(self, principal: str) -> Quota | None:
        return self.quotas.get(principal) or self.quotas.get(DEFAULT_PRINCIPAL)

    def record(self, principal: str, nbytes: int, now_s: float) -> int:
        """Account ``nbytes`` produced by ``principal`` at ``now_s``; return the delay in ms
        before its response may go out (0 when within quota)."""
        quota = self.quota_for(principal)
        if quota is None or nbytes <= 0:
            return 0
        if len(self._tat) >= TRACKED_PRINCIPALS_MAX and principal not in self._tat:
            self._forget_idle(now_s)
        tat = max(self._tat.get(principal, now_s), now_s) + nbytes / quota.produce_bytes_per_s
        self._tat[principal] = tat
        delay_s = tat - now_s - self.burst_s
        return min(THROTTLE_MS_MAX, int(delay_s * 1000) + 1) if delay_s > 0 else 0

    def refund(self, principal: str, nbytes: int) -> None:
        """Take back what ``record`` charged for a request that was then refused unwritten."""
        quota = self.quota_for(principal)
        if quota is not None and principal in self._tat and nbytes > 0:
            self._tat[principal] -= nbytes / quota.produce_bytes_per_s

    def _forget_idle(self, now_s: float) -> None:
        # A principal whose tat is in the past owes nothing: forgetting it changes no decision.
        self._tat = {p: t for p, t in self._tat.items() if t > now_s}
