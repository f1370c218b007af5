"""The fixed 16-byte header frame that starts every request and response.

Layout (little-endian)::

    offset size field
    0      4    magic            u32  0x31524246 (the bytes "FBR1")
    4      1    protocol_version u8   1
    5      1    flags            u8   bit 0: 1 on responses
    6      2    api_key          u16
    8      2    api_version      u16
    10     2    error_code       i16  0 on requests; a request-level error on responses
    12     4    correlation_id   u32  chosen by the client, echoed by the node
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from fabric.errors import InvalidMagicError, MalformedRequestError, UnsupportedVersionError
from fabric.limits import HEADER_BYTES, PROTOCOL_MAGIC, PROTOCOL_VERSION

_HEADER = struct.Struct("<IBBHHhI")
FLAG_RESPONSE = 0x01


class Header(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    error_code: int = 0
    flags: int = 0
    protocol_version: int = PROTOCOL_VERSION

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)


def encode_header(header: Header) -> bytes:
    return _HEADER.pack(
        PROTOCOL_MAGIC,
        header.protocol_version,
        header.flags,
        header.api_key,
        header.api_version,
        header.error_code,
        header.correlation_id,
    )


def encode_request_header(api_key: int, api_version: int, correlation_id: int) -> bytes:
    return _HEADER.pack(PROTOCOL_MAGIC, PROTOCOL_VERSION, 0, api_key, api_version, 0, correlation_id)


def encode_response_header(request: Header, error_code: int = 0) -> bytes:
    return _HEADER.pack(
        PROTOCOL_MAGIC,
        PROTOCOL_VERSION,
        FLAG_RESPONSE,
        request.api_key,
        request.api_version,
        error_code,
        request.correlation_id,
    )


def decode_header(frame: bytes | memoryview) -> Header:
    """Parse a header frame. Raises a ProtocolError subclass on anything but a valid header.

    The magic is checked before the length so that a stray non-Fabric peer gets
    INVALID_MAGIC rather than a confusing length complaint.
    """
    if len(frame) >= 4:
        (magic,) = struct.unpack_from("<I", frame, 0)
        if magic != PROTOCOL_MAGIC:
            raise InvalidMagicError(f"header magic 0x{magic:08x}, expected 0x{PROTOCOL_MAGIC:08x} (FBR1)")
    if len(frame) != HEADER_BYTES:
        raise MalformedRequestError(f"header frame is {len(frame)} bytes, expected {HEADER_BYTES}")
    _magic, version, flags, api_key, api_version, error_code, correlation_id = _HEADER.unpack(frame)
    if version != PROTOCOL_VERSION:
        # The 16-byte layout is the same in every protocol version, so the rest of the
        # header is still meaningful: the refusal echoes it (docs/PROTOCOL.md section 2).
        exc = UnsupportedVersionError(
            f"protocol version {version}, this peer speaks {PROTOCOL_VERSION}",
            correlation_id=correlation_id,
        )
        exc.header = Header(api_key, api_version, correlation_id, error_code, flags, version)  # type: ignore[attr-defined]
        raise exc
    return Header(api_key, api_version, correlation_id, error_code, flags, version)


def readable_header(frame: bytes | memoryview) -> Header | None:
    """The header of a request that is refused anyway (too many frames, say), if it reads:
    the refusal then echoes it. None when even the header is unreadable."""
    try:
        return decode_header(frame)
    except UnsupportedVersionError as exc:
        return getattr(exc, "header", None)
    except (InvalidMagicError, MalformedRequestError):
        return None
