"""What the node's loop runs besides requests: ``Duty`` (the list is ``nodes/server.py`` ``duties()``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nodes.state import NodeState


@dataclass
class Duty:
    """Something the loop does every turn (``interval_s`` 0) or every ``interval_s``, after
    the turn's requests, or before them (``before_requests``: after the session check and
    role changes, for a duty that must know the node's roles before it answers anyone)."""

    name: str
    run: Callable[[NodeState, float], None]
    interval_s: float = 0.0
    before_requests: bool = False
    is_due: Callable[[NodeState], bool] | None = None  # run now, before the interval ends
    deadline: Callable[[NodeState], float | None] | None = None  # wake the loop by then
    next_s: float = 0.0
