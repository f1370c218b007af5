"""The long-poll parking rule and the read limit of FETCH (nodes/fetch.py): no sockets."""

from __future__ import annotations

from fabric.protocol.apis import CONSUMER_REPLICA_ID
from nodes.fetch import fetch_ready, read_limit


def test_a_fetch_waits_until_min_bytes_an_error_or_its_deadline() -> None:
    assert fetch_ready(final=False, any_error=False, bytes_found=0, min_bytes=0)  # min_bytes=0: answer at once
    assert not fetch_ready(final=False, any_error=False, bytes_found=0, min_bytes=1)  # at the log end: park
    assert fetch_ready(final=False, any_error=False, bytes_found=1, min_bytes=0)
    assert not fetch_ready(final=False, any_error=False, bytes_found=999, min_bytes=1_000)
    assert fetch_ready(final=False, any_error=False, bytes_found=1_000, min_bytes=1_000)
    assert fetch_ready(final=False, any_error=True, bytes_found=0, min_bytes=1_000)
    assert fetch_ready(final=True, any_error=False, bytes_found=0, min_bytes=1_000)


def test_consumers_read_below_the_high_watermark_and_wait_above_it() -> None:
    # Log end 120, high watermark 100.
    assert read_limit(CONSUMER_REPLICA_ID, 100, 120, 50) == 100
    assert read_limit(CONSUMER_REPLICA_ID, 100, 120, 100) == 100  # at the HW: reads nothing, so parks
    assert read_limit(CONSUMER_REPLICA_ID, 100, 120, 110) is None  # above the HW, inside the log: wait
    assert read_limit(CONSUMER_REPLICA_ID, 100, 120, 120) is None
    # Outside the log: read, so the log reports it out of range instead of parking forever.
    assert read_limit(CONSUMER_REPLICA_ID, 100, 120, 121) == 100


def test_followers_read_the_whole_log() -> None:
    assert read_limit(2, 100, 120, 110) == 120
    assert read_limit(2, 100, 120, 120) == 120  # level with the leader: reads nothing
