"""How a service instance answers its handler's outcome (docs/PROTOCOL.md section 10.2),
without sockets: Service._reply turns a result or an exception into frames."""

from __future__ import annotations

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
