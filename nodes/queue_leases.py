"""Handing leases out: what a receive's answer carries once its leases are durable, and
what goes back when the answer does not leave.

A receive leases messages at once and answers only once those leases are written to
``__queue_state`` (``nodes/queue_durable.py``). That write can take long: while the
``__queue_state`` leader fails over it is retried for seconds. The lease clock used to
start when the lease was taken, so an answer that waited longer than the visibility
timeout handed out leases already over: the worker's ack was refused, and the message,
counted as delivered each time, went to the dead-letter queue at ``max_deliveries``
without a worker ever holding a live lease of it (found by
``tests/fault/test_queue_compaction_fault.py``: 1,000 good messages dead-lettered after
two ``__queue_state`` leaders were killed in a row). Now the clock starts when the answer
leaves (``ShareState.answered``), and a lease that ends before (``ShareState.tick``) is
undone, not counted: a delivery counts once a worker can have the message.
"""

from __future__ import annotations

from typing import Any

from nodes.queue_compaction import QueueCompaction
from nodes.queue_durable import wall_ms


class QueueLeases(QueueCompaction):
    def _hand_over(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        """The messages of a receive whose leases are durable, as its answer carries them:
        each lease's clock restarted now (its deadline in the answer too), those whose lease
        ended meanwhile (undone, not counted) left out; and now, which the answer carries
        too (version 1), so that a worker reads the deadlines on its own clock."""
        now_ms = wall_ms()
        handed = []
        for m in messages:
            slot = self._slots.get((body["queue"], m["partition"]))
            g = slot.share.groups.get(body["group"]) if slot is not None else None
            deadline_ms = 0 if g is None else g.state.answered(body["consumer_id"], m["offset"], now_ms,
                                                               body["visibility_timeout_ms"])
            if deadline_ms:
                handed.append(dict(m, deadline_ms=deadline_ms))
        return now_ms, handed

    def _unlease(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """The answer to a long poll did not leave: its consumer closed (or died) while the
        poll was parked here. Its messages go back now, the delivery not counted, instead
        of staying invisible until the visibility timeout (and, at max_deliveries, dead)."""
        now_ms = wall_ms()
        for m in messages:
            slot = self._slots.get((body["queue"], m["partition"]))
            g = slot.share.groups.get(body["group"]) if slot is not None else None
            if slot is not None and g is not None:
                g.state.unlease(body["consumer_id"], m["offset"], now_ms)
                self._collect(slot, body["group"], g, [])
                self._wake = True  # the next turn writes it and offers it to waiting polls
