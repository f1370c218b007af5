"""Sequencer grants asked off the node's loop (docs/DESIGN.md, "Strict-order topics").

The loop serves every partition of the node, so it must never wait on the sequencer. It
used to: a grant was asked for in the middle of staging a produce request, for up to 500
ms, and a paused sequencer held the loop that long again and again (ticks ask too), so
produces to *plain* topics on the same node had a p99 of 559 ms until the sequencer failed
over. Now:

* A produce request with strict-order batches is parked here (``park``), in arrival order.
* One records grant at a time is asked on the ``sequencer-grants`` thread, for every
  request parked when it is sent; requests parked while it is out wait for the next one.
  So arrival order is stamping order, as it was, and a busy node asks fewer grants.
* When the answer is back, the loop takes the requests it covers (``take_ready``) and
  stages them with the grant, or with its error: a retry of a batch already written is
  still answered from the log; new batches get SEQUENCER_NOT_AVAILABLE (retriable).
* Ticks ask on the same thread (``ask_ticks``, ``ask_records_end``); their answer is used
  on a later tick.

Every wait is bounded: ``GRANT_WAITERS_MAX`` parked requests (more are refused at once),
``GRANT_WAIT_MAX_S`` for an answer (the thread's call has its own shorter timeout; this
guards a stuck thread), and ``GRANT_JOBS_MAX`` jobs queued for the thread.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric import errors
from fabric import zk as zkl
from fabric.protocol import apis
from fabric.protocol.sequencer import ID_KIND_RECORDS, ID_KIND_TICKS, SEQUENCER_GRANT_IDS_MAX, Grant
from nodes.state import Envelope

if TYPE_CHECKING:
    from nodes.strict_order import GrantPool, StrictOrder

log = logging.getLogger("fabric.node")

GRANT_WAITERS_MAX = 1_000  # produce requests parked for a grant; past this SEQUENCER_NOT_AVAILABLE at once
GRANT_WAIT_MAX_S = 2.0  # an answer not back by then fails what waits on it
GRANT_JOBS_MAX = 4  # jobs queued for the grant thread (at most one records and one ticks job are out)


@dataclass
class Parked:
    envelope: Envelope
    request: apis.Message
    records: int  # IDs it needs (strict_order.records_to_stamp)
    principal: str  # who sent it (secure clusters): its staging runs later, for another caller
    demand: int = 0  # the records grant asked for it; 0 until one is


@dataclass
class Answer:
    pool: GrantPool | None
    failure: errors.FabricError | None


@dataclass
class _Out:
    """A grant asked and not answered yet."""

    demand: int
    count: int
    sent_s: float


class GrantAsker:
    """Per node, owned by the loop's thread; only ``allocate`` runs on the grant thread."""

    def __init__(self, order: StrictOrder, wake: Callable[[], None]) -> None:
        self.order = order
        self.allocate = order.grant_source  # (count, kind) -> Grant, blocking but bounded
        self.worker = zkl.Worker(wake, name="sequencer-grants", queue_max=GRANT_JOBS_MAX)
        self.parked: deque[Parked] = deque()
        self.records_out: _Out | None = None
        self.ticks_out: _Out | None = None
        self.ticks_answer: Answer | None = None
        self._answers: dict[int, Answer] = {}  # records demand -> its answer, until taken
        self._demands = itertools.count(1)

    # -- produce requests ------------------------------------------------------------------
    def park(self, envelope: Envelope, request: apis.Message, records: int, principal: str, now_s: float) -> None:
        """Park a request for a grant; raises SequencerNotAvailableError when it must be
        answered at once instead (the sequencer failed a moment ago, or too many wait)."""
        if not self.parked:
            self.order.check_backoff()  # with others parked it queues behind them: their order
        if len(self.parked) >= GRANT_WAITERS_MAX:
            raise errors.SequencerNotAvailableError(
                f"{GRANT_WAITERS_MAX} produce requests already wait for the sequencer (GRANT_WAITERS_MAX); retry")
        self.parked.append(Parked(envelope, request, records, principal))
        self._ask_records(now_s)

    def take_ready(self, now_s: float) -> list[tuple[Parked, Answer]]:
        """On the loop: the parked requests whose grant is answered, oldest first."""
        self.worker.run_completions()
        if self.records_out is not None and now_s - self.records_out.sent_s >= GRANT_WAIT_MAX_S:
            self._answers[self.records_out.demand] = Answer(None, errors.SequencerNotAvailableError(
                f"the sequencer's grant did not come back within {GRANT_WAIT_MAX_S} s"))
            self.records_out = None  # its late answer, if any, is dropped (no longer current)
        ready: list[tuple[Parked, Answer]] = []
        while self.parked and self.parked[0].demand in self._answers:
            head = self.parked.popleft()
            ready.append((head, self._answers[head.demand]))
        # Grants are asked and used oldest first: an answer older than the oldest request
        # still parked (or any, when none waits on one) has no request left.
        oldest = self.parked[0].demand if self.parked else 0
        self._answers = {d: a for d, a in self._answers.items() if oldest and d >= oldest}
        self._ask_records(now_s)
        return ready

    def next_deadline(self) -> float | None:
        out = [o.sent_s + GRANT_WAIT_MAX_S for o in (self.records_out, self.ticks_out) if o is not None]
        return min(out, default=None)

    def _ask_records(self, now_s: float) -> None:
        if self.records_out is not None:
            return
        waiting: list[Parked] = []
        count = 0
        for p in self.parked:  # oldest first, as many as one grant holds; the rest ask next
            if p.demand:
                continue
            if waiting and count + p.records > SEQUENCER_GRANT_IDS_MAX:
                break  # not skipped: grants must be used in arrival order, IDs rising along it
            waiting.append(p)
            count += p.records
        if not waiting:
            return
        demand = next(self._demands)
        for p in waiting:
            p.demand = demand
        try:
            self.order.check_backoff()  # failed a moment ago: these fail fast too
        except errors.FabricError as exc:
            self._answers[demand] = Answer(None, exc)
            return
        out = _Out(demand, count, now_s)
        try:
            self.worker.submit(lambda: self.allocate(count, ID_KIND_RECORDS),
                               lambda grant, error: self._records_done(out, grant, error))
        except errors.FabricError as exc:
            self._answers[demand] = Answer(None, errors.SequencerNotAvailableError(str(exc)))
            return
        self.records_out = out

    def _records_done(self, out: _Out, grant: Grant | None, error: BaseException | None) -> None:
        if self.records_out is not out:
            return  # given up on (GRANT_WAIT_MAX_S): its requests were answered already
        self.records_out = None
        self._answers[out.demand] = self._answer(out.count, grant, error)

    # -- ticks -----------------------------------------------------------------------------
    def ask_ticks(self, count: int, now_s: float) -> None:
        self._ask_for_ticks(count, ID_KIND_TICKS, now_s)

    def ask_records_end(self, now_s: float) -> None:
        """Ask for no IDs, only the sequencer's ``records_end`` (StrictOrder.needs_tick)."""
        self._ask_for_ticks(0, ID_KIND_RECORDS, now_s)

    def take_ticks_answer(self, now_s: float) -> Answer | None:
        self.worker.run_completions()
        if self.ticks_out is not None and now_s - self.ticks_out.sent_s >= GRANT_WAIT_MAX_S:
            self.ticks_out = None
        answer, self.ticks_answer = self.ticks_answer, None
        return answer

    @property
    def ticks_asked(self) -> bool:
        return self.ticks_out is not None

    def _ask_for_ticks(self, count: int, kind: int, now_s: float) -> None:
        if self.ticks_out is not None:
            return
        try:
            self.order.check_backoff()
        except errors.FabricError:
            return
        out = _Out(0, count, now_s)
        try:
            self.worker.submit(lambda: self.allocate(count, kind), lambda grant, error: self._ticks_done(out, grant, error))
        except errors.FabricError as exc:
            log.debug("no tick grant asked: %s", exc)
            return
        self.ticks_out = out

    def _ticks_done(self, out: _Out, grant: Grant | None, error: BaseException | None) -> None:
        if self.ticks_out is not out:
            return
        self.ticks_out = None
        self.ticks_answer = self._answer(out.count, grant, error)

    # -- both ------------------------------------------------------------------------------
    def _answer(self, count: int, grant: Grant | None, error: BaseException | None) -> Answer:
        """On the loop: the StrictOrder's checks decide (epochs only rise, no short grant)."""
        if error is None and grant is not None:
            try:
                return Answer(self.order.accept(grant, count), None)
            except errors.FabricError as exc:
                return Answer(None, exc)
        self.order.failed()
        if isinstance(error, errors.FabricError):
            return Answer(None, error)
        log.warning("asking the sequencer for a grant failed: %r", error)
        return Answer(None, errors.SequencerNotAvailableError(f"asking the sequencer failed: {error!r}"))

    def close(self) -> list[Parked]:
        """Stop the thread; returns the requests still parked (the node answers them)."""
        self.worker.stop()
        parked, self.parked = list(self.parked), deque()
        return parked

