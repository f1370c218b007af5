"""The direct plane's frames (docs/PROTOCOL.md section 10): bytes in, values out.

Services and their callers talk peer to peer over ZeroMQ DEALER -> ROUTER; publishers
send to subscribers over PUB -> SUB. Every message starts with one 16-byte header frame::

    offset size field           type
    0      4    magic           u32   0x31444246, the bytes "FBD1"
    4      1    version         u8    1
    5      1    type            u8    REQUEST, REPLY, ERROR, PING, PONG, PUBLISH
    6      1    flags           u8    bit 0 IDEMPOTENT, bit 1 HAS_HEADERS
    7      1    reserved        u8    0
    8      4    correlation_id  u32   request/reply pairing; PUBLISH: the sequence number
                                      (per subject)
    12     4    aux             u32   REQUEST: this attempt's timeout_ms; PING: the
                                      sender's heartbeat interval in ms (0: 200); PONG:
                                      load; PUBLISH: the publisher id; else 0

No socket, no clock, no thread here: the SDK, the tests and a C service share this code's
rules through the document.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from fabric import errors

MAGIC = 0x31444246  # b"FBD1" little-endian
VERSION = 1
HEADER_BYTES = 16

REQUEST = 1
REPLY = 2
ERROR = 3
PING = 4
PONG = 5
PUBLISH = 6
TYPE_NAMES = {REQUEST: "REQUEST", REPLY: "REPLY", ERROR: "ERROR", PING: "PING", PONG: "PONG", PUBLISH: "PUBLISH"}

FLAG_IDEMPOTENT = 0x01
FLAG_HAS_HEADERS = 0x02
_KNOWN_FLAGS = FLAG_IDEMPOTENT | FLAG_HAS_HEADERS

U32_MAX = 0xFFFFFFFF
HEADERS_COUNT_MAX = 256
HEADER_NAME_BYTES_MAX = 255
HEADER_VALUE_BYTES_MAX = 64 * 1024
SUBJECT_BYTES_MAX = 255
TYPE_NAME_BYTES_MAX = 255
ERROR_MESSAGE_BYTES_MAX = 4096
# Every direct-plane socket sets ZMQ_MAXMSGSIZE to this; a larger frame makes the receiver
# drop the whole connection (and every request pipelined on it), so senders refuse first.
PAYLOAD_BYTES_MAX = 64 * 1024 * 1024

_HEADER = struct.Struct("<IBBBBII")
_ERROR_PREFIX = struct.Struct("<hH")
_U16 = struct.Struct("<H")


class DirectHeader(NamedTuple):
    type: int
    flags: int
    correlation_id: int
    aux: int

    @property
    def idempotent(self) -> bool:
        return bool(self.flags & FLAG_IDEMPOTENT)

    @property
    def has_headers(self) -> bool:
        return bool(self.flags & FLAG_HAS_HEADERS)


class ErrorBody(NamedTuple):
    code: int  # a wire error code of fabric/errors.py (REMOTE_ERROR for a handler exception)
    type_name: str  # the remote exception's type, e.g. "ValueError"
    message: str


def encode_header(type_: int, correlation_id: int, *, flags: int = 0, aux: int = 0) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, type_, flags, 0, correlation_id & U32_MAX, aux & U32_MAX)


def decode_header(frame: bytes | memoryview) -> DirectHeader:
    if len(frame) != HEADER_BYTES:
        raise errors.MalformedRequestError(f"direct header is {len(frame)} bytes, expected {HEADER_BYTES}")
    magic, version, type_, flags, _reserved, correlation_id, aux = _HEADER.unpack(frame)
    if magic != MAGIC:
        raise errors.InvalidMagicError(f"direct header magic 0x{magic:08x}, expected 0x{MAGIC:08x} (FBD1)")
    if version != VERSION:
        raise errors.UnsupportedVersionError(f"direct protocol version {version}; this peer speaks {VERSION}")
    if type_ not in TYPE_NAMES:
        raise errors.MalformedRequestError(f"unknown direct message type {type_}")
    if flags & ~_KNOWN_FLAGS:
        raise errors.MalformedRequestError(f"unknown direct flags 0x{flags:02x}")
    return DirectHeader(type_, flags, correlation_id, aux)


def _check_str(value: str, limit: int, what: str) -> bytes:
    raw = value.encode()
    if len(raw) > limit:
        raise errors.InvalidRequestError(f"{what} is {len(raw)} bytes (max {limit})")
    return raw


def encode_headers(headers: dict[str, bytes]) -> bytes:
    """u16 count, then per header: u8 name length, name (UTF-8), u32 value length, value."""
    if len(headers) > HEADERS_COUNT_MAX:
        raise errors.InvalidRequestError(f"{len(headers)} headers (max {HEADERS_COUNT_MAX})")
    parts = [_U16.pack(len(headers))]
    for name, value in headers.items():
        raw_name = _check_str(name, HEADER_NAME_BYTES_MAX, "header name")
        if len(value) > HEADER_VALUE_BYTES_MAX:
            raise errors.InvalidRequestError(f"header {name!r} is {len(value)} bytes (max {HEADER_VALUE_BYTES_MAX})")
        parts += [bytes([len(raw_name)]), raw_name, struct.pack("<I", len(value)), value]
    return b"".join(parts)


def decode_headers(frame: bytes | memoryview) -> dict[str, bytes]:
    data = bytes(frame)
    if len(data) < 2:
        raise errors.MalformedRequestError("headers frame shorter than its count")
    (count,) = _U16.unpack_from(data, 0)
    if count > HEADERS_COUNT_MAX:
        raise errors.MalformedRequestError(f"{count} headers (max {HEADERS_COUNT_MAX})")
    pos = 2
    out: dict[str, bytes] = {}
    for _ in range(count):
        if pos + 1 > len(data):
            raise errors.MalformedRequestError("headers frame truncated in a name length")
        name_len = data[pos]
        pos += 1
        if pos + name_len + 4 > len(data):
            raise errors.MalformedRequestError("headers frame truncated in a name")
        try:
            name = data[pos:pos + name_len].decode()
        except UnicodeDecodeError:
            raise errors.MalformedRequestError("header name is not UTF-8") from None
        pos += name_len
        (value_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        # The limit is checked on its own: a complete frame with an over-long value is not
        # truncated, and its sender needs to know which limit it broke.
        if value_len > HEADER_VALUE_BYTES_MAX:
            raise errors.MalformedRequestError(
                f"header {name!r} value is {value_len} bytes (max {HEADER_VALUE_BYTES_MAX})")
        if pos + value_len > len(data):
            raise errors.MalformedRequestError(f"header {name!r} value length {value_len} runs past the frame")
        out[name] = data[pos:pos + value_len]
        pos += value_len
    if pos != len(data):
        raise errors.MalformedRequestError(f"{len(data) - pos} trailing bytes after the headers")
    return out


def encode_error(code: int, type_name: str, message: str) -> bytes:
    """i16 code, u16 type length, type (UTF-8), u16 message length, message (UTF-8).
    Over-long names and messages are cut (at a character boundary), not refused: an error
    reply must always be sendable."""
    raw_type = type_name.encode()[:TYPE_NAME_BYTES_MAX].decode(errors="ignore").encode()
    raw_message = message.encode()[:ERROR_MESSAGE_BYTES_MAX].decode(errors="ignore").encode()
    return b"".join([_ERROR_PREFIX.pack(code, len(raw_type)), raw_type, _U16.pack(len(raw_message)), raw_message])


def decode_error(frame: bytes | memoryview) -> ErrorBody:
    data = bytes(frame)
    if len(data) < _ERROR_PREFIX.size:
        raise errors.MalformedRequestError("error body shorter than its prefix")
    code, type_len = _ERROR_PREFIX.unpack_from(data, 0)
    pos = _ERROR_PREFIX.size
    if pos + type_len + 2 > len(data):
        raise errors.MalformedRequestError("error body truncated in the type name")
    type_raw = data[pos:pos + type_len]
    pos += type_len
    (message_len,) = _U16.unpack_from(data, pos)
    pos += 2
    if pos + message_len != len(data):
        raise errors.MalformedRequestError("error body message length does not match the frame")
    try:
        return ErrorBody(code, type_raw.decode(), data[pos:].decode())
    except UnicodeDecodeError:
        raise errors.MalformedRequestError("error body is not UTF-8") from None


def encode_load(load: int) -> int:
    """Loads travel in the header's aux field, clamped to u32."""
    return max(0, min(U32_MAX, load))


# Messages as frame lists. A ROUTER prepends the peer's identity on receipt and strips it
# on send; these functions build and read what comes after it.


def _check_payload(payload: bytes) -> None:
    if len(payload) > PAYLOAD_BYTES_MAX:
        raise errors.InvalidRequestError(f"payload is {len(payload)} bytes (max {PAYLOAD_BYTES_MAX})")


def request_frames(correlation_id: int, payload: bytes, *, timeout_ms: int, idempotent: bool,
                   headers: dict[str, bytes] | None = None) -> list[bytes]:
    _check_payload(payload)
    flags = FLAG_IDEMPOTENT if idempotent else 0
    if headers:
        flags |= FLAG_HAS_HEADERS
        return [encode_header(REQUEST, correlation_id, flags=flags, aux=timeout_ms), payload, encode_headers(headers)]
    return [encode_header(REQUEST, correlation_id, flags=flags, aux=timeout_ms), payload]


def reply_frames(correlation_id: int, payload: bytes, headers: dict[str, bytes] | None = None) -> list[bytes]:
    _check_payload(payload)
    if headers:
        return [encode_header(REPLY, correlation_id, flags=FLAG_HAS_HEADERS), payload, encode_headers(headers)]
    return [encode_header(REPLY, correlation_id), payload]


def error_frames(correlation_id: int, code: int, type_name: str, message: str) -> list[bytes]:
    return [encode_header(ERROR, correlation_id), encode_error(code, type_name, message)]


def ping_frames(interval_ms: int = 0) -> list[bytes]:
    """A heartbeat announcing the sender's interval: the receiver holds it to that pace."""
    return [encode_header(PING, 0, aux=encode_load(interval_ms))]


def pong_frames(load: int) -> list[bytes]:
    return [encode_header(PONG, 0, aux=encode_load(load))]


def publish_frames(subject: str, publisher_id: int, sequence: int, payload: bytes,
                   headers: dict[str, bytes] | None = None) -> list[bytes]:
    """Frame 0 is the subject (ZeroMQ SUB filters on its prefix), then the header."""
    raw_subject = encode_subject(subject)
    _check_payload(payload)
    flags = FLAG_HAS_HEADERS if headers else 0
    frames = [raw_subject, encode_header(PUBLISH, sequence, flags=flags, aux=publisher_id), payload]
    if headers:
        frames.append(encode_headers(headers))
    return frames


def expected_frames(header: DirectHeader) -> int:
    """Frames after the header (and after the subject for PUBLISH)."""
    if header.type in (PING, PONG):
        return 0
    if header.type == ERROR:
        return 1
    return 2 if header.has_headers else 1


class DirectMessage(NamedTuple):
    """A whole direct-plane message as a receiver reads it."""

    header: DirectHeader
    payload: bytes  # REQUEST, REPLY, PUBLISH; b"" otherwise
    headers: dict[str, bytes]
    error: ErrorBody | None  # ERROR only
    subject: str  # PUBLISH only


def decode_message(frames: Sequence[bytes], *, published: bool = False) -> DirectMessage:
    """Every frame of one message (after a ROUTER's identity frame; ``published``: as a SUB
    socket receives it, subject first), checked as a receiver must: the header, the number
    of frames its type and flags call for, the headers frame, the error body, the subject.
    Raises a FabricError for anything else, never another exception."""
    subject = ""
    if published:
        if not frames:
            raise errors.MalformedRequestError("PUBLISH without a subject frame")
        try:
            subject = bytes(frames[0]).decode()
        except UnicodeDecodeError:
            raise errors.MalformedRequestError("subject is not UTF-8") from None
        encode_subject(subject)
        frames = frames[1:]
    if not frames:
        raise errors.MalformedRequestError("message without a header frame")
    header = decode_header(frames[0])
    if (header.type == PUBLISH) != published:
        raise errors.MalformedRequestError(f"{TYPE_NAMES[header.type]} where {'PUBLISH' if published else 'no PUBLISH'} belongs")
    if len(frames) - 1 != expected_frames(header):
        raise errors.MalformedRequestError(f"{TYPE_NAMES[header.type]} with {len(frames) - 1} body frames")
    if header.type == ERROR:
        return DirectMessage(header, b"", {}, decode_error(frames[1]), subject)
    if header.type in (PING, PONG):
        return DirectMessage(header, b"", {}, None, subject)
    headers = decode_headers(frames[2]) if header.has_headers else {}
    return DirectMessage(header, bytes(frames[1]), headers, None, subject)


# Subjects, as NATS spells them: dot-separated tokens; in patterns `*` matches one token
# and `>` (last token only) matches one or more.


def _tokens(subject: str, what: str) -> list[str]:
    if not subject or len(subject.encode()) > SUBJECT_BYTES_MAX:
        raise errors.InvalidRequestError(f"{what} {subject!r} must be 1 to {SUBJECT_BYTES_MAX} bytes")
    tokens = subject.split(".")
    for token in tokens:
        if not token or any(ch.isspace() for ch in token):
            raise errors.InvalidRequestError(f"{what} {subject!r} has an empty token or whitespace")
    return tokens


def encode_subject(subject: str) -> bytes:
    for token in _tokens(subject, "subject"):
        if token in ("*", ">"):
            raise errors.InvalidRequestError(f"subject {subject!r}: wildcards belong in patterns, not in published subjects")
    return subject.encode()


def validate_pattern(pattern: str) -> list[str]:
    tokens = _tokens(pattern, "pattern")
    for i, token in enumerate(tokens):
        if ">" in token and (token != ">" or i != len(tokens) - 1):
            raise errors.InvalidRequestError(f"pattern {pattern!r}: '>' must be a whole last token")
        if "*" in token and token != "*":
            raise errors.InvalidRequestError(f"pattern {pattern!r}: '*' must be a whole token")
    return tokens


def pattern_prefix(pattern: str) -> bytes:
    """The literal prefix before the first wildcard: what ZeroMQ's SUB filter can use.
    The exact match happens in the client (subject_matches)."""
    tokens = validate_pattern(pattern)
    literal: list[str] = []
    for token in tokens:
        if token in ("*", ">"):
            return ".".join(literal).encode() + b"." if literal else b""
        literal.append(token)
    return ".".join(literal).encode()


def subject_matches(pattern_tokens: list[str], subject: str) -> bool:
    tokens = subject.split(".")
    for i, want in enumerate(pattern_tokens):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or (want != "*" and want != tokens[i]):
            return False
    return len(tokens) == len(pattern_tokens)
