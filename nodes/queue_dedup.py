"""The dedup window of a queue partition's leader (SQS FIFO semantics), apart from the
share state: every group of a partition replays the same sends through its own window."""

from __future__ import annotations

from collections import OrderedDict

from fabric import errors
from fabric.protocol.queues import DEDUP_IDS_MAX, DEDUP_WINDOW_MS_DEFAULT


class DedupWindow:
    """Dedup ids seen on a partition's leader in the last ``window_ms`` (SQS FIFO semantics:
    a repeat within the window is accepted and dropped)."""

    def __init__(self, window_ms: int = DEDUP_WINDOW_MS_DEFAULT, ids_max: int = DEDUP_IDS_MAX) -> None:
        if window_ms <= 0:
            raise errors.InvalidQueueConfigError("dedup_window_ms must be > 0")
        self.window_ms = window_ms
        self.ids_max = ids_max
        self._seen: OrderedDict[str, int] = OrderedDict()  # id -> first seen ms, oldest first

    def admit(self, dedup_id: str, now_ms: int) -> bool:
        """True when the message is new and must be written; False for a repeat in the window."""
        while self._seen:
            first_id, first_ms = next(iter(self._seen.items()))
            if now_ms - first_ms < self.window_ms and len(self._seen) < self.ids_max:
                break
            del self._seen[first_id]
        if dedup_id in self._seen:
            return False
        self._seen[dedup_id] = now_ms
        return True
