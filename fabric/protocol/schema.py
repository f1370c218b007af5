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

Each schema is also compiled, on first use, into one generated function per direction
(runs of fixed-width ints read or written by one ``struct`` call, no per-field dispatch):
about 3x faster than walking the schema, on the path every request and reply takes. The
walk stays the reference: the compiled code only ever succeeds with the walk's result,
and whenever it meets something wrong (any check fails, any exception) the walk runs
instead and raises its exact error. tests/unit/test_schema_compiled.py checks the two agree.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Sequence
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
    try:
        return _compiled(schema, _ENCODERS, _compile_encoder)(values)
    except Exception:  # the walk below raises the precise error
        pass
    return encode_walk(schema, values)


def encode_walk(schema: Schema, values: dict[str, Any]) -> bytes:
    """``encode`` by walking the schema: the reference the compiled encoder matches."""
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
    try:
        decoded: dict[str, Any] = _compiled(schema, _DECODERS, _compile_decoder)(view)
        return decoded
    except Exception:  # the walk below raises the precise error
        pass
    return decode_walk(schema, view)


def decode_walk(schema: Schema, frame: bytes | memoryview) -> dict[str, Any]:
    """``decode`` by walking the schema: the reference the compiled decoder matches."""
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


# -- compiled codecs ------------------------------------------------------------------------
class _Fallback(Exception):
    """Raised by compiled code at anything it does not decide itself (the walk then runs)."""


_COMPILED_MAX = 1024  # schemas are module constants; a caller making them on the fly only refills this
_DECODERS: dict[int, tuple[Schema, Callable[[memoryview], dict[str, Any]]]] = {}
_ENCODERS: dict[int, tuple[Schema, Callable[[dict[str, Any]], bytes]]] = {}


def _compiled(schema: Schema, cache: dict[int, tuple[Schema, Any]], compile_: Callable[[Schema], Any]) -> Any:
    entry = cache.get(id(schema))
    if entry is None or entry[0] is not schema:  # (an id is reused once its object is gone)
        if len(cache) >= _COMPILED_MAX:
            cache.clear()
        entry = cache[id(schema)] = (schema, compile_(schema))
    return entry[1]


def _steps(schema: Schema) -> list[tuple[tuple[str, ...], struct.Struct] | tuple[str, FieldType]]:
    """The fields, with each run of consecutive fixed-width ints merged into one Struct
    (little-endian, no padding: the same bytes as packing them one by one)."""
    steps: list[tuple[tuple[str, ...], struct.Struct] | tuple[str, FieldType]] = []
    run: list[tuple[str, str]] = []

    def close_run() -> None:
        if run:
            steps.append((tuple(n for n, _t in run), struct.Struct("<" + "".join(_INTS[t].format[1:] for _n, t in run))))
            run.clear()

    for name, ftype in schema:
        if isinstance(ftype, str) and ftype in _INTS:
            run.append((name, ftype))
        else:
            close_run()
            steps.append((name, ftype))
    close_run()
    return steps


class _Source:
    """Python source being generated, with the constants it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {"F": _Fallback, "ARRAY_ITEMS_MAX": ARRAY_ITEMS_MAX,
                                       "STRING_BYTES_MAX": STRING_BYTES_MAX, "bounded_text": bounded_text,
                                       "U16": _U16, "I32": _I32, "U32": _U32, "NULL": _I32.pack(-1)}
        self._ids = itertools.count()

    def var(self) -> str:
        return f"v{next(self._ids)}"

    def const(self, value: Any) -> str:
        name = f"c{next(self._ids)}"
        self.consts[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def function(self, name: str, argument: str) -> Any:
        namespace = dict(self.consts)
        exec(f"def {name}({argument}):\n" + "\n".join(self.lines), namespace)  # our own generated code, from schemas
        return namespace[name]


def _compile_decoder(schema: Schema) -> Callable[[memoryview], dict[str, Any]]:
    src = _Source()
    src.emit(1, "n = len(view)")
    src.emit(1, "pos = 0")
    result = _decode_struct_code(src, schema, 1)
    src.emit(1, "if pos != n: raise F")
    src.emit(1, f"return {result}")
    decoder: Callable[[memoryview], dict[str, Any]] = src.function("decode", "view")
    return decoder


def _decode_struct_code(src: _Source, schema: Schema, depth: int) -> str:
    fields: list[tuple[str, str]] = []
    for step in _steps(schema):
        if isinstance(step[1], struct.Struct):
            names, codec = step
            targets = [src.var() for _ in names]
            src.emit(depth, f"if pos + {codec.size} > n: raise F")
            src.emit(depth, f"{', '.join(targets)}, = {src.const(codec)}.unpack_from(view, pos)")
            src.emit(depth, f"pos += {codec.size}")
            fields.extend(zip(names, targets, strict=True))
        else:
            name, ftype = step
            fields.append((name, _decode_value_code(src, ftype, depth)))
    result = src.var()
    src.emit(depth, f"{result} = {{{', '.join(f'{n!r}: {v}' for n, v in fields)}}}")
    return result


def _decode_value_code(src: _Source, ftype: FieldType, depth: int) -> str:
    out = src.var()
    if isinstance(ftype, Array):
        count = src.var()
        src.emit(depth, "if pos + 4 > n: raise F")
        src.emit(depth, f"{count}, = U32.unpack_from(view, pos)")
        src.emit(depth, "pos += 4")
        limit = "ARRAY_ITEMS_MAX" if _zero_width(ftype.item) else "min(ARRAY_ITEMS_MAX, n - pos)"
        src.emit(depth, f"if {count} > {limit}: raise F")
        src.emit(depth, f"{out} = []")
        src.emit(depth, f"for _ in range({count}):")
        src.emit(depth + 1, f"{out}.append({_decode_value_code(src, ftype.item, depth + 1)})")
        return out
    if isinstance(ftype, Struct):
        return _decode_struct_code(src, ftype.fields, depth)
    if ftype in ("str", "text", "bytes"):
        length = src.var()
        size, prefix = (4, "I32") if ftype == "bytes" else (2, "U16")
        src.emit(depth, f"if pos + {size} > n: raise F")
        src.emit(depth, f"{length}, = {prefix}.unpack_from(view, pos)")
        src.emit(depth, f"pos += {size}")
        if ftype == "bytes":
            src.emit(depth, f"if {length} == -1: {out} = None")
            src.emit(depth, "else:")
            depth += 1
        src.emit(depth, f"if {length} < 0 or pos + {length} > n: raise F")
        # str(buffer, 'utf-8') raises on bad UTF-8 as bytes.decode does: the walk then says so.
        read = f"str(view[pos : pos + {length}], 'utf-8')" if ftype != "bytes" else f"bytes(view[pos : pos + {length}])"
        src.emit(depth, f"{out} = {read}")
        src.emit(depth, f"pos += {length}")
        return out
    codec = _INTS[ftype]
    src.emit(depth, f"if pos + {codec.size} > n: raise F")
    src.emit(depth, f"{out}, = {src.const(codec)}.unpack_from(view, pos)")
    src.emit(depth, f"pos += {codec.size}")
    return out


def _compile_encoder(schema: Schema) -> Callable[[dict[str, Any]], bytes]:
    src = _Source()
    src.emit(1, "out = []")
    src.emit(1, "add = out.append")
    _encode_struct_code(src, schema, "values", 1)
    src.emit(1, "return b''.join(out)")
    encoder: Callable[[dict[str, Any]], bytes] = src.function("encode", "values")
    return encoder


def _encode_struct_code(src: _Source, schema: Schema, values: str, depth: int) -> None:
    for step in _steps(schema):
        if isinstance(step[1], struct.Struct):
            names, codec = step
            src.emit(depth, f"add({src.const(codec)}.pack({', '.join(f'{values}[{n!r}]' for n in names)}))")
        else:
            name, ftype = step
            value = src.var()
            src.emit(depth, f"{value} = {values}[{name!r}]")
            _encode_value_code(src, ftype, value, depth)


def _encode_value_code(src: _Source, ftype: FieldType, value: str, depth: int) -> None:
    if isinstance(ftype, Array):
        # Only lists and tuples: any other iterable could be used up here, and the walk
        # must see it whole if it runs after a failure.
        src.emit(depth, f"if type({value}) is not list and type({value}) is not tuple: raise F")
        src.emit(depth, f"add(U32.pack(len({value})))")
        item = src.var()
        src.emit(depth, f"for {item} in {value}:")
        _encode_value_code(src, ftype.item, item, depth + 1)
    elif isinstance(ftype, Struct):
        _encode_struct_code(src, ftype.fields, value, depth)
    elif ftype in ("str", "text"):
        raw = src.var()
        text = f"bounded_text(str({value}))" if ftype == "text" else value
        src.emit(depth, f"{raw} = {text}.encode('utf-8')")
        if ftype == "str":
            src.emit(depth, f"if len({raw}) > STRING_BYTES_MAX: raise F")
        src.emit(depth, f"add(U16.pack(len({raw})))")
        src.emit(depth, f"add({raw})")
    elif ftype == "bytes":
        src.emit(depth, f"if {value} is None: add(NULL)")
        src.emit(depth, "else:")
        src.emit(depth + 1, f"add(I32.pack(len({value})))")
        src.emit(depth + 1, f"add(bytes({value}))")
    else:
        src.emit(depth, f"add({src.const(_INTS[ftype])}.pack({value}))")
