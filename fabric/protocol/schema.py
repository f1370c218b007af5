"""Body frames declared as data: a schema is a tuple of (field name, type).

Types and their encodings (all little-endian, no padding)::

    i8 i16 i32 i64 u8 u16 u32   fixed-width integers
    str                         u16 byte length, then UTF-8 bytes (no terminator)
    text                        a str on the wire; the encoder cuts it to MESSAGE_TEXT_BYTES_MAX
                                (error messages: they may quote a 65,535-byte name and must
                                still fit, so a bad request can never break its own reply)
    bytes                       i32 byte length (-1 = null), then the bytes
    Array(T)                    u32 item count, then the items
    Struct(schema)              the fields in order

A decoder refuses trailing bytes, lengths that run past the frame, bad UTF-8 and arrays
above ARRAY_ITEMS_MAX, so a truncated or padded frame is MALFORMED_REQUEST, never a
half-parsed request. Encoders and decoders are pure: bytes in, dicts out.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from fabric.errors import MalformedRequestError
from fabric.limits import ARRAY_ITEMS_MAX, MESSAGE_TEXT_BYTES_MAX, STRING_BYTES_MAX

_INTS: dict[str, struct.Struct] = {
    "i8": struct.Struct("<b"),
    "i16": struct.Struct("<h"),
    "i32": struct.Struct("<i"),
    "i64": struct.Struct("<q"),
    "u8": struct.Struct("<B"),
    "u16": struct.Struct("<H"),
    "u32": struct.Struct("<I"),
}
_U16 = _INTS["u16"]
_I32 = _INTS["i32"]
_U32 = _INTS["u32"]


class Array:
    __slots__ = ("item",)

    def __init__(self, item: FieldType) -> None:
        self.item = item

    def __repr__(self) -> str:
        return f"Array({self.item!r})"


class Struct:
    __slots__ = ("fields",)

    def __init__(self, fields: Schema) -> None:
        self.fields = fields

    def __repr__(self) -> str:
        return f"Struct({self.fields!r})"


FieldType = str | Array | Struct
Schema = tuple[tuple[str, FieldType], ...]


TEXT_CUT_MARK = " [...]"


def bounded_text(text: str, bytes_max: int = MESSAGE_TEXT_BYTES_MAX) -> str:
    """``text`` if its UTF-8 fits ``bytes_max``; else its longest prefix that fits with
    a cut mark, cut at a character boundary. Pure; the result always encodes."""
    raw = text.encode("utf-8", "replace")  # a lone surrogate becomes "?" rather than an error
    if len(raw) <= bytes_max:
        return raw.decode("utf-8")
    mark = TEXT_CUT_MARK.encode()
    return raw[: max(0, bytes_max - len(mark))].decode("utf-8", "ignore") + TEXT_CUT_MARK


def encode(schema: Schema, values: dict[str, Any]) -> bytes:
    out: list[bytes] = []
    _encode_struct(schema, values, out)
    return b"".join(out)


def _encode_struct(schema: Schema, values: dict[str, Any], out: list[bytes]) -> None:
    for name, ftype in schema:
        try:
            value = values[name]
        except KeyError:
            raise ValueError(f"missing field {name!r}") from None
        _encode_value(ftype, value, out)


def _encode_value(ftype: FieldType, value: Any, out: list[bytes]) -> None:
    if isinstance(ftype, str):
        if ftype == "text":
            raw = bounded_text(str(value)).encode("utf-8")
            out.append(_U16.pack(len(raw)))
            out.append(raw)
        elif ftype == "str":
            raw = value.encode("utf-8")
            if len(raw) > STRING_BYTES_MAX:
                raise ValueError(f"string of {len(raw)} bytes exceeds STRING_BYTES_MAX={STRING_BYTES_MAX}")
            out.append(_U16.pack(len(raw)))
            out.append(raw)
        elif ftype == "bytes":
            if value is None:
                out.append(_I32.pack(-1))
            else:
                out.append(_I32.pack(len(value)))
                out.append(bytes(value))
        else:
            out.append(_INTS[ftype].pack(value))
    elif isinstance(ftype, Array):
        items = list(value)
        out.append(_U32.pack(len(items)))
        for item in items:
            _encode_value(ftype.item, item, out)
    else:
        _encode_struct(ftype.fields, value, out)


def decode(schema: Schema, frame: bytes | memoryview) -> dict[str, Any]:
    """Decode one whole frame; trailing bytes are an error."""
    view = memoryview(frame)
    values, end = _decode_struct(schema, view, 0)
    if end != len(view):
        raise MalformedRequestError(f"{len(view) - end} unexpected trailing bytes in body frame")
    return values


def _need(view: memoryview, pos: int, size: int, what: str) -> None:
    if pos + size > len(view):
        raise MalformedRequestError(
            f"truncated frame: {what} needs {size} bytes at offset {pos}, frame has {len(view)}"
        )


def _decode_struct(schema: Schema, view: memoryview, pos: int) -> tuple[dict[str, Any], int]:
    values: dict[str, Any] = {}
    for name, ftype in schema:
        values[name], pos = _decode_value(ftype, view, pos, name)
    return values, pos


def _decode_value(ftype: FieldType, view: memoryview, pos: int, name: str) -> tuple[Any, int]:
    if isinstance(ftype, str):
        if ftype == "str" or ftype == "text":
            _need(view, pos, 2, name)
            (length,) = _U16.unpack_from(view, pos)
            pos += 2
            _need(view, pos, length, name)
            try:
                text = bytes(view[pos : pos + length]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedRequestError(f"field {name!r} is not valid UTF-8") from exc
            return text, pos + length
        if ftype == "bytes":
            _need(view, pos, 4, name)
            (length,) = _I32.unpack_from(view, pos)
            pos += 4
            if length == -1:
                return None, pos
            if length < 0:
                raise MalformedRequestError(f"field {name!r} has negative length {length}")
            _need(view, pos, length, name)
            return bytes(view[pos : pos + length]), pos + length
        codec = _INTS[ftype]
        _need(view, pos, codec.size, name)
        return codec.unpack_from(view, pos)[0], pos + codec.size
    if isinstance(ftype, Array):
        _need(view, pos, 4, name)
        (count,) = _U32.unpack_from(view, pos)
        pos += 4
        if count > ARRAY_ITEMS_MAX:
            raise MalformedRequestError(
                f"array {name!r} claims {count} items, above ARRAY_ITEMS_MAX={ARRAY_ITEMS_MAX}"
            )
        # Every item takes at least one byte, so a count above the remaining bytes is a lie;
        # checking it first keeps a tiny frame from making us loop a million times.
        if count > len(view) - pos and not _zero_width(ftype.item):
            raise MalformedRequestError(f"array {name!r} claims {count} items in {len(view) - pos} bytes")
        items = []
        for _ in range(count):
            item, pos = _decode_value(ftype.item, view, pos, name)
            items.append(item)
        return items, pos
    return _decode_struct(ftype.fields, view, pos)


def _zero_width(ftype: FieldType) -> bool:
    return isinstance(ftype, Struct) and not ftype.fields


def field_names(schema: Sequence[tuple[str, FieldType]]) -> list[str]:
    return [name for name, _ in schema]
