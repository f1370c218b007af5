"""What handlers receive and callers get back on the direct plane."""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric import errors


@dataclass(frozen=True)
class Request:
    """A request as a handler sees it."""

    payload: bytes
    headers: dict[str, bytes] = field(default_factory=dict)
    idempotent: bool = False
    timeout_ms: int = 0  # the caller's remaining budget when it sent the request
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


def as_bytes(value: object, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if value is None:
        return b""
    raise errors.InvalidRequestError(f"{what} must be bytes or str, got {type(value).__name__}")


def as_headers(headers: dict[str, bytes | str] | None) -> dict[str, bytes] | None:
    if not headers:
        return None
    return {str(k): as_bytes(v, f"header {k!r}") for k, v in headers.items()}
