"""Queue-mode wire schemas: every body round-trips, and two pinned vectors stay byte-exact."""

from __future__ import annotations

from typing import Any

from fabric.protocol import apis
from fabric.protocol import queues as q
from fabric.protocol import schema as s

BODIES: dict[str, tuple[s.Schema, dict[str, Any]]] = {
    "receive_request": (q.RECEIVE_REQUEST_V0, {
        "queue": "jobs", "group": "w", "consumer_id": "c1", "partition": -1, "max_messages": 10,
        "wait_ms": 20000, "visibility_timeout_ms": 0}),
    "receive_response": (q.RECEIVE_RESPONSE_V0, {"error": 0, "message": "", "messages": [{
        "partition": 0, "offset": 7, "delivery_count": 2, "deadline_ms": 1700000030000,
        "timestamp_ms": 1700000000000, "priority": 9, "key": None, "value": b"work",
        "headers": [{"key": q.HEADER_PRIORITY, "value": b"9"}]}]}),
    "settle_request": (q.SETTLE_REQUEST_V0, {"queue": "jobs", "group": "w", "consumer_id": "c1", "entries": [
        {"partition": 0, "offset": 7, "action": q.ACTION_NACK, "arg_ms": 500, "reason": "boom"}]}),
    "settle_response": (q.SETTLE_RESPONSE_V0, {"error": 0, "message": "", "results": [
        {"partition": 0, "offset": 7, "error": 71, "deadline_ms": 0}]}),
    "describe_request": (q.DESCRIBE_REQUEST_V0, {"queue": "jobs", "group": "w"}),
    "describe_response": (q.DESCRIBE_RESPONSE_V0, {"error": 0, "message": "", "partitions": [
        {"partition": 0, "group": "w", "visible": 5, "in_flight": 1, "delayed": 2, "dead_lettered": 0, "dropped": 0,
         "deduplicated": 3, "oldest_age_ms": 1234}]}),
    "purge_request": (q.PURGE_REQUEST_V0, {"queue": "jobs", "group": ""}),
    "purge_response": (q.PURGE_RESPONSE_V0, {"error": 0, "message": "", "partitions": [
        {"partition": 0, "group": "w", "end_offset": 12, "purged": 9},
        {"partition": 0, "group": "", "end_offset": 12, "purged": 0}]}),
}


def test_every_queue_body_round_trips() -> None:
    for name, (schema, values) in BODIES.items():
        assert s.decode(schema, s.encode(schema, values)) == values, name


def test_pinned_vectors() -> None:
    settle = BODIES["settle_request"]
    assert s.encode(*settle).hex() == (
        "04006a6f6273010077020063310100000000000000070000000000000001f40100000400626f6f6d")
    receive = BODIES["receive_request"]
    assert s.encode(*receive).hex() == "04006a6f627301007702006331ffffffff0a000000204e000000000000"


def test_queue_keys_are_in_their_range_and_do_not_collide() -> None:
    keys = {key for key, _ in q.SCHEMAS}
    assert keys == {40, 41, 42, 43, 44}
    for key, version in q.SCHEMAS:  # registered with the node's API table, same schemas
        assert apis.SCHEMAS[(key, version)] == q.SCHEMAS[(key, version)]
        assert apis.ApiKey(key).name.startswith("QUEUE_")


def test_send_headers_read_back() -> None:
    hs = q.send_headers(delay_ms=500, priority=9, ttl_ms=60_000, dedup_id="order-17", now_ms=0)
    assert q.read_headers([*hs, ("other", None)]) == {
        "delay_ms": 500, "deliver_at_ms": 0, "priority": 9, "ttl_ms": 60_000, "dedup_id": "order-17"}
    assert q.read_headers([]) == {"delay_ms": 0, "deliver_at_ms": 0, "priority": None, "ttl_ms": 0, "dedup_id": ""}


def test_bad_header_is_a_clear_error() -> None:
    import pytest

    from fabric import errors

    with pytest.raises(errors.InvalidRequestError, match=r"fabric\.priority"):
        q.read_headers([(q.HEADER_PRIORITY, b"high")])


def test_dead_letter_headers_name_the_origin() -> None:
    hs = dict(q.dead_letter_headers("jobs", 2, 41, 5, "visibility timeout"))
    assert hs[q.HEADER_DLQ_QUEUE] == b"jobs" and hs[q.HEADER_DLQ_OFFSET] == b"41"
    assert hs[q.HEADER_DLQ_COUNT] == b"5" and hs[q.HEADER_DLQ_REASON] == b"visibility timeout"


def test_state_record_fast_encoder_matches_the_schema() -> None:
    cases = [(5, "leased", 1, 0, "", -1), (7, "dead", 3, 1_700_000_000_000, "poison \u00e9", 9),
             (0, "acked", 1, 0, "x" * 70_000, -1)]
    for offset, state, count, visible_at, reason, last in cases:
        raw = q.encode_state_record(offset, state, count, visible_at, reason, last_offset=last)
        fields = q.decode_state_record(raw)
        expected = {"version": 0, "offset": offset, "last_offset": offset if last < 0 else last,
                    "state": q.STATE_CODES[state], "delivery_count": count, "visible_at_ms": visible_at,
                    "reason": fields["reason"]}
        assert raw == s.encode(q.STATE_RECORD_V0, expected)
        assert fields["reason"] == reason[:65_535]


def test_state_record_refuses_runs_out_of_bounds() -> None:
    import pytest

    from fabric import errors

    for last in (4, 5 + q.STATE_RANGE_MAX):
        raw = s.encode(q.STATE_RECORD_V0, {"version": 0, "offset": 5, "last_offset": last, "state": 3,
                                           "delivery_count": 1, "visible_at_ms": 0, "reason": ""})
        with pytest.raises(errors.CorruptMessageError, match="covers offsets"):
            q.decode_state_record(raw)
