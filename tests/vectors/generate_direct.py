"""Write the direct plane's hex vectors (python -m tests.vectors.generate_direct).

Each ``direct_*.hex`` file holds the frames of one message, one frame per line (lowercase
hex); docs/PROTOCOL.md section 10 describes them. tests/unit/test_direct_codec.py checks
that the committed files equal what this produces and that they decode to these values.
"""

from __future__ import annotations

from pathlib import Path

from fabric.protocol import direct as wire

HERE = Path(__file__).parent


def vectors() -> dict[str, list[bytes]]:
    return {
        "direct_request.hex": wire.request_frames(7, b"hello", timeout_ms=1500, idempotent=True,
                                                  headers={"trace": b"\x01\x02"}),
        "direct_reply.hex": wire.reply_frames(7, b"world"),
        "direct_error.hex": wire.error_frames(7, 52, "ValueError", "bad input"),
        "direct_ping.hex": wire.ping_frames(200),  # a caller announcing its 200 ms heartbeat interval
        "direct_pong.hex": wire.pong_frames(12),
        "direct_publish.hex": wire.publish_frames("orders.eu", 0xDEADBEEF, 42, b"px"),
    }


def render(frames: list[bytes]) -> str:
    return "".join(frame.hex() + "\n" for frame in frames)


if __name__ == "__main__":
    for name, frames in vectors().items():
        (HERE / name).write_text(render(frames))
