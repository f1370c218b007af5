"""The compiled schema codecs agree with the schema walk, which stays the reference
(fabric/protocol/schema.py): the same bytes from the same values, the same values from
the same bytes, and for anything wrong the walk's own error."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.limits import STRING_BYTES_MAX
from fabric.protocol import apis, schema
from fabric.protocol.schema import Array, FieldType, Schema, Struct

SCHEMAS: list[Schema] = sorted({s for pair in apis.SCHEMAS.values() for s in pair} | {apis.ERROR_BODY}, key=repr)
INT_RANGES = {name: (-(1 << (8 * codec.size - 1)), (1 << (8 * codec.size - 1)) - 1) if name[0] == "i"
              else (0, (1 << (8 * codec.size)) - 1) for name, codec in schema._INTS.items()}


def values_for(ftype: FieldType) -> st.SearchStrategy[Any]:
    if isinstance(ftype, Array):
        return st.lists(values_for(ftype.item), max_size=3)
    if isinstance(ftype, Struct):
        return st.fixed_dictionaries({name: values_for(t) for name, t in ftype.fields})
    if ftype in ("str", "text"):
        return st.text(max_size=8)
    if ftype == "bytes":
        return st.none() | st.binary(max_size=8)
    low, high = INT_RANGES[ftype]
    return st.integers(low, high)


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # compared by type and text
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("sch", SCHEMAS, ids=lambda s: str(abs(hash(repr(s))))[:8])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trips_agree_with_the_walk(sch: Schema, data: st.DataObject) -> None:
    values = data.draw(values_for(Struct(sch)))
    wire = schema.encode(sch, values)
    assert wire == schema.encode_walk(sch, values)
    assert schema.decode(sch, wire) == schema.decode_walk(sch, wire) == values
    # Every cut, and each byte changed, decodes (or fails) as the walk does.
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    for cut in cuts:
        assert outcome(lambda c=cut: schema.decode(sch, wire[:c])) == outcome(lambda c=cut: schema.decode_walk(sch, wire[:c]))
    if wire:
        at = data.draw(st.integers(0, len(wire) - 1))
        changed = wire[:at] + bytes([data.draw(st.integers(0, 255))]) + wire[at + 1:]
        assert outcome(lambda: schema.decode(sch, changed)) == outcome(lambda: schema.decode_walk(sch, changed))
    padded = wire + b"\0"
    assert outcome(lambda: schema.decode(sch, padded)) == outcome(lambda: schema.decode_walk(sch, padded))


@pytest.mark.parametrize("sch", SCHEMAS, ids=lambda s: str(abs(hash(repr(s))))[:8])
@settings(max_examples=40, deadline=None)
@given(blob=st.binary(max_size=64))
def test_any_bytes_decode_as_the_walk_does(sch: Schema, blob: bytes) -> None:
    assert outcome(lambda: schema.decode(sch, blob)) == outcome(lambda: schema.decode_walk(sch, blob))


def test_bad_values_fail_with_the_walks_error() -> None:
    sch = apis.PRODUCE_REQUEST_V0
    good = {"acks": -1, "timeout_ms": 1000, "entries": [{"topic": "t", "partition": 0}]}
    bad = [
        {"acks": -1, "entries": []},  # a missing field
        {**good, "acks": 300},  # out of i8
        {**good, "timeout_ms": "1000"},  # not an int
        {**good, "entries": [{"topic": "t"}]},  # a missing field in an array item
        {**good, "entries": [{"topic": "x" * (STRING_BYTES_MAX + 1), "partition": 0}]},  # too long a str
        {**good, "entries": [{"topic": b"t", "partition": 0}]},  # bytes for a str
    ]
    for values in bad:
        walked = outcome(lambda v=values: schema.encode_walk(sch, v))
        assert walked[0] != "ok"
        assert outcome(lambda v=values: schema.encode(sch, v)) == walked


def test_an_iterator_for_an_array_is_encoded_whole() -> None:
    """Arrays given as generators go to the walk untouched, so nothing is used up first."""
    sch = apis.PRODUCE_REQUEST_V0
    values = {"acks": 1, "timeout_ms": 5, "entries": ({"topic": "t", "partition": p} for p in range(3))}
    listed = {**values, "entries": [{"topic": "t", "partition": p} for p in range(3)]}
    assert schema.encode(sch, values) == schema.encode_walk(sch, listed)


def test_any_field_name_is_kept() -> None:
    odd: Schema = (("", "str"), ("n", "i32"), ("'q\"", "bytes"))
    values = {"": "empty name", "n": 3, "'q\"": b"x"}
    wire = schema.encode_walk(odd, values)
    assert schema.encode(odd, values) == wire
    assert schema.decode(odd, wire) == schema.decode_walk(odd, wire) == values


def test_int_runs_are_one_struct() -> None:
    steps = schema._steps((("a", "i8"), ("b", "i32"), ("c", "str"), ("d", "u16"), ("e", "i64")))
    assert [(s[0], s[1].format if isinstance(s[1], struct.Struct) else s[1]) for s in steps] == [
        (("a", "b"), "<bi"), ("c", "str"), (("d", "e"), "<Hq")]
