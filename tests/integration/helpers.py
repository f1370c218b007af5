"""Small helpers for integration tests: raw requests to a node, leaders, reading a topic."""

from __future__ import annotations

import time
from typing import Any

import zmq

from fabric.protocol import apis
from sdk import Admin, Consumer, Producer, TopicPartition

RAW_TIMEOUT_MS = 10_000


def raw_request(address: str, frames: list[bytes], timeout_ms: int = RAW_TIMEOUT_MS) -> list[bytes]:
    """Send raw frames on a fresh DEALER and return the reply frames."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send_multipart(frames)
        if not sock.poll(timeout_ms):
            raise TimeoutError(f"no reply from {address} within {timeout_ms} ms")
        return sock.recv_multipart()
    finally:
        sock.close(linger=0)


def leader_address(bootstrap: str, topic: str, partition: int = 0) -> str:
    with Admin(bootstrap) as admin:
        desc = admin.describe_topic(topic)
        nodes = admin.nodes()
    return nodes[desc.partitions[partition].leader]


def topic_with_one_record(bootstrap: str, name: str) -> str:
    """A one-partition topic holding one record ("before" at offset 0): what a test of bad
    input checks is still there, and still the only thing there, afterwards."""
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions=1)
    with Producer(bootstrap) as producer:
        producer.send(name, b"before", partition=0).result(10)
    return name


def leader_id(bootstrap: str, topic: str, partition: int = 0) -> int:
    with Admin(bootstrap) as admin:
        return admin.describe_topic(topic).partitions[partition].leader


def read_all(bootstrap: str, topic: str, partitions: int, expected: int | None = None,
             timeout_s: float = 60.0, **consumer_args: Any) -> list[Any]:
    """Every record of the topic, from the beginning up to the end offsets seen at the start
    (or until ``expected`` records arrived)."""
    out: list[Any] = []
    with Consumer(bootstrap, **consumer_args) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        target = expected if expected is not None else sum(ends[tp] - consumer.position(tp) for tp in tps)
        deadline = time.monotonic() + timeout_s
        while len(out) < target and time.monotonic() < deadline:
            out.extend(consumer.poll(timeout_ms=500))
    return out


def decode(frames: list[bytes]) -> apis.Message:
    return apis.decode_response(frames)


def interrupted_start(argv: list[str], signum: int, cwd: str, wait_s: float = 3.0) -> tuple[int, str]:
    """Start ``argv`` (a node or sequencer pointed at a ZooKeeper that never answers),
    send ``signum`` once its imports are done and it waits, and return its exit status and
    stderr. Killed if it has not exited 10 s after the signal."""
    import subprocess

    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(wait_s)
        proc.send_signal(signum)
        _out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, err
