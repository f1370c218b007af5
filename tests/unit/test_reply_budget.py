"""The bytes of FETCH answers a client has not taken (nodes/reply_budget.py), with fake
trackers standing in for libzmq's release of each answer's last frame."""

from __future__ import annotations

from dataclasses import dataclass

import zmq

from nodes.reply_budget import ReplyBudget


@dataclass
class Tracker:
    done: bool = False


def test_room_shrinks_with_unread_answers_and_comes_back_in_order() -> None:
    budget = ReplyBudget(client_bytes_max=100, node_bytes_max=150)
    first, second = Tracker(), Tracker()
    assert budget.room(b"a") == 100
    budget.sent(b"a", first, 60)
    budget.sent(b"a", second, 30)
    assert budget.room(b"a") == 10 and budget.room(b"b") == 60  # the node's bound counts everyone
    second.done = True  # released out of order: the older answer still holds the connection
    assert budget.pending_bytes(b"a") == 90
    first.done = True
    assert budget.room(b"a") == 100 and budget.total_bytes == 0 and budget.clients() == 0


def test_over_the_bound_means_no_room_and_the_node_bound_caps_a_new_client() -> None:
    budget = ReplyBudget(client_bytes_max=100, node_bytes_max=150)
    budget.sent(b"a", Tracker(), 120)
    assert budget.room(b"a") == 0
    budget.sent(b"b", Tracker(), 40)
    assert budget.room(b"c") == 0  # 160 of 150 held for others


def test_the_last_frame_is_sent_tracked_and_uncopied() -> None:
    frames, tracker = ReplyBudget().tracked([b"header", b"body", b"x" * 100])
    assert frames[:2] == [b"header", b"body"] and isinstance(frames[2], zmq.Frame)
    assert frames[2].tracker is tracker and not tracker.done  # held until libzmq lets go
