"""How a service instance answers its handler's outcome (docs/PROTOCOL.md section 10.2),
without sockets: Service._reply turns a result or an exception into frames; a stopping
instance refuses new requests."""

from __future__ import annotations

import asyncio

import pytest

from fabric import errors
from fabric.protocol import direct as wire
from sdk.direct import Reply, Service


def _service() -> Service:
    return Service(None, None, "svc", lambda request: b"")  # type: ignore[arg-type]


def _error(frames: list[bytes]) -> tuple[int, wire.ErrorBody]:
    header = wire.decode_header(frames[0])
    assert header.type == wire.ERROR and header.correlation_id == 9
    return header.correlation_id, wire.decode_error(frames[1])


@pytest.mark.parametrize("raised", [errors.ServiceOverloaded("busy downstream"), errors.ServiceStopping("bye")])
def test_a_handler_raising_a_not_run_code_is_a_remote_error(raised: errors.FabricError) -> None:
    """53 and 54 tell a caller the handler did not run, so it sends even a non-idempotent
    request elsewhere: a handler that raised them did run (it ran 3 times in the audit)."""
    frames, ok = _service()._reply(9, None, raised)
    _cid, body = _error(frames)
    assert not ok
    assert body.code == errors.RemoteError.code
    assert body.type_name == type(raised).__name__ and body.message == raised.message


def test_other_fabric_errors_keep_their_code_and_plain_exceptions_are_remote_errors() -> None:
    service = _service()
    _cid, body = _error(service._reply(9, None, errors.InvalidRequestError("bad symbol"))[0])
    assert (body.code, body.type_name, body.message) == (errors.InvalidRequestError.code, "InvalidRequestError",
                                                         "bad symbol")
    _cid, body = _error(service._reply(9, None, ValueError("empty"))[0])
    assert (body.code, body.type_name, body.message) == (errors.RemoteError.code, "ValueError", "empty")


def test_a_result_is_a_reply() -> None:
    frames, ok = _service()._reply(9, Reply(b"x", {"h": b"1"}), None)
    assert ok and wire.decode_header(frames[0]).type == wire.REPLY and frames[1] == b"x"


class _Registered:
    """A Registration as stop() sees it: close() forgets the path, as the real one does."""

    path: str | None = "/fabric/services/svc/instance-0000000007"

    def close(self) -> None:
        self.path = None


def test_a_stopping_instance_names_itself_after_deregistering() -> None:
    """stop() deregisters before it refuses anything, so the refusal cannot read the
    znode then (it said "instance None of 'svc' is stopping")."""
    service = _service()
    service._registration = _Registered()  # type: ignore[assignment]
    service.address = "tcp://127.0.0.1:5555"
    asyncio.run(service.stop())
    sent: list[list[bytes]] = []
    service._send = lambda identity, frames: sent.append(frames)  # type: ignore[method-assign]
    request = wire.request_frames(9, b"x", timeout_ms=100, idempotent=False)
    service._on_message([b"caller", *request])
    _cid, body = _error(sent[0])
    assert body.code == errors.ServiceStopping.code
    assert body.message == "instance instance-0000000007 at tcp://127.0.0.1:5555 of 'svc' is stopping"
