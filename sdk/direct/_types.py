"""What handlers receive and callers get back on the direct plane."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric import errors


@dataclass(frozen=True)
class Request:
    """A request as a handler sees it."""

    payload: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    idempotent: bool = False
    # The REQUEST's aux: this attempt's timeout as the caller sent it (the SDK: the time
    # left over the attempts still allowed, all of it when not idempotent; a gather: its
    # whole timeout), 0 for none. Time spent queued at the instance is not taken off
    # (docs/PROTOCOL.md section 10.1).
    timeout_ms: int = 0
    service: str = ""


@dataclass(frozen=True)
class Reply:
    """A handler may return one of these (to send headers); callers receive one.
    ``instance`` names the znode of the instance that answered (caller side only)."""

    payload: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    instance: str = ""

    def text(self) -> str:
        return self.payload.decode()


@dataclass(frozen=True)
class GatherResult:
    """Scatter-gather outcome: replies that came in time, and who did not answer."""

    replies: list[Reply]
    missing: list[str]  # instances that sent nothing before the deadline
    failed: dict[str, errors.FabricError]  # instances that answered with an error


@dataclass(frozen=True)
class Message:
    """One pub/sub message as a subscriber receives it."""

    subject: str
    payload: bytes
    headers: dict[str, bytes]
    publisher_id: int
    sequence: int


def to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """``fn(*args)`` on ``loop``, from another thread (a kazoo watch). A loop closed meanwhile
    (an application that ended without ``close()``) has nobody left to tell: dropped, where
    ``call_soon_threadsafe`` raised RuntimeError on kazoo's thread, logged with a traceback."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def as_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b""
    # A wrong type is a TypeError naming the argument, as every other argument check here
    # (below; docs/DIRECT.md) and in the rest of the SDK (sdk/_arguments.py).
    raise TypeError(f"{what} must be bytes or str, got {type(value).__name__}")


def as_headers(headers: Mapping[str, bytes | str] | None) -> dict[str, bytes] | None:
    if not headers:
        return None
    if not isinstance(headers, Mapping):
        raise TypeError(f"headers must be a dict of name -> bytes or str, got {type(headers).__name__}")
    return {str(k): as_bytes(v, f"header {k!r}") for k, v in headers.items()}


# Argument checks of the public calls: a wrong type is a TypeError naming the argument, a
# value out of range an InvalidRequestError (as the other SDK calls, sdk/_arguments.py).


def ms_arg(name: str, value: object, high: int) -> float:
    """A duration in milliseconds within (0, high]; int or float, not bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of milliseconds, got {type(value).__name__} {value!r:.60}")
    if not 0 < value <= high:
        raise errors.InvalidRequestError(f"{name}={value} must be within (0, {high}]")
    return value


def count_arg(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.60}")
    if value < low:
        raise errors.InvalidRequestError(f"{name}={value} must be at least {low}")
    return value


def handler_arg(value: object, *, optional: bool = False) -> Callable[..., Any] | None:
    if value is None and optional:
        return None
    if not callable(value):
        raise TypeError(f"handler must be callable{' or None' if optional else ''}, got {type(value).__name__}")
    return value
