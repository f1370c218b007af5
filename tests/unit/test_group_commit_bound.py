"""A member holding partitions waits for a commit (or an offset fetch) no longer than it may
hold them unheard: a commit to a coordinator paused past its session waited 10 s
(GROUP_REQUEST_TIMEOUT_MS) while the coordinator's successor gave the partitions to another
member after the session, and both held them meanwhile (a fault hunt: 1 of 6 runs)."""

from __future__ import annotations

import time

import pytest
import zmq

from fabric import errors
from sdk import Consumer, ConsumerRebalanceListener, TopicPartition

TP = TopicPartition("t", 0)


class Lost(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.lost: list[TopicPartition] = []

    def on_partitions_lost(self, lost: list[TopicPartition]) -> None:
        self.lost.extend(lost)


def test_a_commit_to_a_silent_coordinator_gives_the_partitions_up_when_the_member_could_be_expired() -> None:
    silent = zmq.Context.instance().socket(zmq.ROUTER)  # a coordinator that takes requests and never answers
    silent.setsockopt(zmq.LINGER, 0)
    address = f"tcp://127.0.0.1:{silent.bind_to_random_port('tcp://127.0.0.1')}"
    consumer = Consumer(address, group_id="g", session_timeout_ms=6_000)
    try:
        group = consumer._group
        assert group is not None
        listener = Lost()
        group.listener = listener
        group.owned, group.member_id, group.member_epoch, group._coordinator = {TP}, "m", 1, address
        # Heard from 0.5 s before its own fence deadline (session less the margin).
        group._last_ok_s = group._clock() - (group.session_timeout_ms - group.fence_margin_ms) / 1000.0 + 0.5
        started = time.monotonic()
        with pytest.raises(errors.RequestTimedOutError, match="partitions are lost"):
            group.commit({TP: (5, "")}, in_group=True)
        assert time.monotonic() - started < 5.0  # by the fence deadline, not the 10 s request bound
        assert group.owned == set() and listener.lost == [TP]
    finally:
        consumer.close()
        silent.close()
