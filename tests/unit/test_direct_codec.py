"""The direct plane's frames: vectors, round trips, refusals, subject matching. No sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabric import errors
from fabric.protocol import direct as wire
from tests.vectors import generate_direct

VECTORS = Path(__file__).parent.parent / "vectors"


def test_committed_vectors_match_the_generator() -> None:
    for name, frames in generate_direct.vectors().items():
        assert (VECTORS / name).read_text() == generate_direct.render(frames), name


def read_frames(name: str) -> list[bytes]:
    return [bytes.fromhex(line) for line in (VECTORS / name).read_text().splitlines()]


def test_request_vector_decodes() -> None:
    header_frame, payload, headers = read_frames("direct_request.hex")
    assert header_frame.hex() == "46424431" "01" "01" "03" "00" "07000000" "dc050000"
    header = wire.decode_header(header_frame)
    assert header == wire.DirectHeader(wire.REQUEST, wire.FLAG_IDEMPOTENT | wire.FLAG_HAS_HEADERS, 7, 1500)
    assert header.idempotent and header.has_headers and wire.expected_frames(header) == 2
    assert payload == b"hello"
    assert wire.decode_headers(headers) == {"trace": b"\x01\x02"}


def test_error_and_publish_vectors_decode() -> None:
    header_frame, body = read_frames("direct_error.hex")
    assert wire.decode_header(header_frame).type == wire.ERROR
    assert wire.decode_error(body) == wire.ErrorBody(52, "ValueError", "bad input")
    subject, header_frame, payload = read_frames("direct_publish.hex")
    header = wire.decode_header(header_frame)
    assert (subject, header.type, header.correlation_id, header.aux, payload) == (
        b"orders.eu", wire.PUBLISH, 42, 0xDEADBEEF, b"px")
    (pong,) = read_frames("direct_pong.hex")
    assert wire.decode_header(pong) == wire.DirectHeader(wire.PONG, 0, 0, 12)


@pytest.mark.parametrize("frame,error", [
    (b"", errors.MalformedRequestError),
    (b"\x00" * 16, errors.InvalidMagicError),
    (wire.encode_header(wire.REQUEST, 1)[:4] + b"\x02" + wire.encode_header(wire.REQUEST, 1)[5:],
     errors.UnsupportedVersionError),
    (wire.encode_header(99, 1), errors.MalformedRequestError),
    (wire.encode_header(wire.REQUEST, 1, flags=0x80), errors.MalformedRequestError),
])
def test_bad_headers_are_refused(frame: bytes, error: type[errors.FabricError]) -> None:
    with pytest.raises(error):
        wire.decode_header(frame)


def test_headers_round_trip_and_refusals() -> None:
    headers = {"a": b"", "ü": b"x" * 100}
    assert wire.decode_headers(wire.encode_headers(headers)) == headers
    raw = wire.encode_headers(headers)
    for cut in range(len(raw)):
        with pytest.raises(errors.MalformedRequestError):
            wire.decode_headers(raw[:cut])
    with pytest.raises(errors.MalformedRequestError):
        wire.decode_headers(raw + b"\x00")
    with pytest.raises(errors.InvalidRequestError):
        wire.encode_headers({"x" * 300: b""})
    with pytest.raises(errors.InvalidRequestError):
        wire.encode_headers({"big": b"x" * (wire.HEADER_VALUE_BYTES_MAX + 1)})


def test_what_receivers_accept_as_documented() -> None:
    """docs/PROTOCOL.md section 10: the reserved byte is not checked; a headers frame may
    have count 0, an empty name, and a name twice (the last value wins)."""
    header = bytearray(wire.encode_header(wire.REPLY, 7, flags=wire.FLAG_HAS_HEADERS, aux=9))
    header[7] = 0xAB
    assert wire.decode_header(bytes(header)) == wire.DirectHeader(wire.REPLY, wire.FLAG_HAS_HEADERS, 7, 9)
    assert wire.decode_headers(b"\x00\x00") == {}
    one = (1).to_bytes(4, "little")
    frame = b"\x03\x00" + b"\x00" + one + b"e" + b"\x01d" + one + b"1" + b"\x01d" + one + b"2"
    assert wire.decode_headers(frame) == {"": b"e", "d": b"2"}


def test_an_over_long_header_value_is_refused_by_its_limit_not_as_truncated() -> None:
    """A complete frame whose value is one byte past the limit: the error names the limit
    (it said "runs past the frame" before, which sent its sender looking for a framing bug)."""
    value_len = wire.HEADER_VALUE_BYTES_MAX + 1
    frame = b"\x01\x00" + b"\x01a" + value_len.to_bytes(4, "little") + b"x" * value_len
    with pytest.raises(errors.MalformedRequestError, match=r"header 'a' value is 65537 bytes \(max 65536\)"):
        wire.decode_headers(frame)
    truncated = b"\x01\x00" + b"\x01a" + (10).to_bytes(4, "little") + b"x" * 5  # within the limit, cut short
    with pytest.raises(errors.MalformedRequestError, match="value length 10 runs past the frame"):
        wire.decode_headers(truncated)


def test_error_body_cuts_long_text_and_refuses_truncation() -> None:
    body = wire.encode_error(52, "T" * 1000, "é" * 5000)
    decoded = wire.decode_error(body)
    assert len(decoded.type_name.encode()) <= wire.TYPE_NAME_BYTES_MAX
    assert len(decoded.message.encode()) <= wire.ERROR_MESSAGE_BYTES_MAX
    with pytest.raises(errors.MalformedRequestError):
        wire.decode_error(body[:-1])
    with pytest.raises(errors.MalformedRequestError):
        wire.decode_error(b"\x01")


@pytest.mark.parametrize("pattern,subject,matches", [
    ("orders.*", "orders.new", True),
    ("orders.*", "orders.eu.new", False),
    ("orders.*", "orders", False),
    ("orders.>", "orders.eu.new", True),
    ("orders.>", "orders", False),
    ("orders.*.paid", "orders.eu.paid", True),
    ("orders.*.paid", "orders.eu.new", False),
    (">", "anything.at.all", True),
    ("*", "one", True),
    ("*", "one.two", False),
    ("orders.new", "orders.new", True),
    ("orders.new", "orders.newer", False),
])
def test_subject_matching(pattern: str, subject: str, matches: bool) -> None:
    assert wire.subject_matches(wire.validate_pattern(pattern), subject) is matches


def test_pattern_prefix_is_the_literal_part() -> None:
    assert wire.pattern_prefix("orders.*.paid") == b"orders."
    assert wire.pattern_prefix("orders.>") == b"orders."
    assert wire.pattern_prefix(">") == b""
    assert wire.pattern_prefix("orders.new") == b"orders.new"


@pytest.mark.parametrize("pattern", ["", "a..b", "a.>.b", "a.b*", "a.>x", "with space", "x" * 300])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(errors.InvalidRequestError):
        wire.validate_pattern(pattern)


@pytest.mark.parametrize("subject", ["orders.*", "orders.>", "", "a..b"])
def test_published_subjects_have_no_wildcards(subject: str) -> None:
    with pytest.raises(errors.InvalidRequestError):
        wire.encode_subject(subject)


def test_payloads_past_the_socket_limit_are_refused_before_sending() -> None:
    big = b"x" * (wire.PAYLOAD_BYTES_MAX + 1)
    with pytest.raises(errors.InvalidRequestError, match="max 67108864"):
        wire.request_frames(1, big, timeout_ms=10, idempotent=False)
    with pytest.raises(errors.InvalidRequestError):
        wire.reply_frames(1, big)
    with pytest.raises(errors.InvalidRequestError):
        wire.publish_frames("a.b", 1, 1, big)
    assert len(wire.reply_frames(1, big[:-1])[1]) == wire.PAYLOAD_BYTES_MAX
