"""The raw baseline's receiving end: a bare PULL socket into bare rocksdict puts.

Run by bench.throughput as a separate process (as a node is), so the baseline pays the
same process boundary. Protocol with the driver (all on loopback):
  control: this PUSH -> driver PULL, "ready" once bound and the database is open (the
           driver starts its clock then, so the baseline does not pay this process's start-up)
  data:    PUSH -> this PULL, one frame per batch, an empty frame ends a run
  control: this PUSH -> driver PULL, "<records written> <seconds from first frame to last put>"
  then the driver sends b"read" on data: we read every batch back and decode it, and answer
  "<records read> <seconds>".
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import rocksdict
import zmq

from fabric.protocol import batch as batch_format


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--db", required=True)
    args = parser.parse_args(argv)
    ctx: zmq.Context[Any] = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1000)
    pull.bind(args.data)
    push = ctx.socket(zmq.PUSH)
    push.connect(args.control)
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    db = rocksdict.Rdict(args.db, options)
    push.send_string("ready")
    key = 0
    while True:
        first = pull.recv(copy=False)
        if bytes(first.buffer[:4]) == b"exit":
            break
        if bytes(first.buffer[:4]) == b"read":
            started = time.perf_counter()
            records = 0
            it = db.iter()
            it.seek_to_first()
            while it.valid():
                records += len(batch_format.decode_batch(it.value()).values)
                it.next()
            del it
            push.send_string(f"{records} {time.perf_counter() - started}")
            continue
        started = time.perf_counter()
        records = 0
        frame = first
        while len(frame.buffer):
            buf = bytearray(frame.buffer)  # what a node does: one copy to stamp into
            header = batch_format.read_header(buf)
            db.put(key.to_bytes(8, "big"), bytes(buf))
            key += 1
            records += header.record_count
            frame = pull.recv(copy=False)
        push.send_string(f"{records} {time.perf_counter() - started}")
    db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
