"""The Python examples of the README and docs/, run as written against a real cluster.

A user's first program is one of these, copied. Each block is read from its file at test
time (so an edit to the docs is what gets tested), with the docs' bootstrap address
replaced by this cluster's and the names the prose leaves to the reader (``handle``,
``values``...) defined. Loops the docs show running for ever end at their first record:
the reader's ``handle`` (or ``print``) raises ``_Done``.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fabric.local import LocalCluster
from sdk import Admin, Consumer, Producer
from tests.conftest import make_cluster

ROOT = Path(__file__).resolve().parents[2]
DOCS_ADDRESS = "zk://127.0.0.1:2181"


class _Done(Exception):
    """Raised by the reader's handler: the example's endless loop got its first record."""


def python_blocks(name: str) -> list[str]:
    text = (ROOT / name).read_text()
    return [m.group(1) for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


@pytest.fixture(scope="module")
def docs_cluster(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = make_cluster(zk_server, tmp_path_factory.mktemp("docs"), sequencer_count=1)
    c.start()
    try:
        yield c
    finally:
        c.stop()


def run_block(code: str, cluster: LocalCluster, **names: Any) -> dict[str, Any]:
    namespace: dict[str, Any] = {"bootstrap": cluster.bootstrap, "__name__": "docs_example", **names}
    exec(compile(code.replace(DOCS_ADDRESS, cluster.bootstrap), "<docs>", "exec"), namespace)
    return namespace


def first_call_ends_the_loop(*_args: Any) -> None:
    raise _Done


def test_readme_blocks(docs_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    quickstart, offsets, bulk, aio, tags, ordered = python_blocks("README.md")

    namespace = run_block(quickstart, docs_cluster)
    assert namespace["bootstrap"] == docs_cluster.bootstrap  # the example's own address was replaced
    out = capsys.readouterr().out
    assert "RecordMetadata(" in out and "clicked" in out

    namespace = run_block(offsets, docs_cluster)  # seek, end offsets, offsets_for_times as the prose says
    assert namespace["first"] == 0 and namespace["end"] >= 0 and set(namespace["found"]) == {namespace["tp"]}

    with Producer(docs_cluster.bootstrap) as producer:
        values = [b"a", "b", None]
        table = pa.table({"value": pa.array([b"x", b"y"], pa.binary())})
        run_block(bulk, docs_cluster, producer=producer, values=values, keys=[b"k1", b"k2", b"k3"],
                  pa_table=table, per_record_headers=[[("h", b"1")], []])
        assert "BatchMetadata(" in capsys.readouterr().out

    async def asyncio_example() -> None:
        scope: dict[str, Any] = {}
        body = aio.replace(DOCS_ADDRESS, docs_cluster.bootstrap)
        exec("import sdk\nasync def example():\n" + textwrap.indent(body, "    ")
             + "    await client.close()\n    return reply, metadata\n", scope)
        reply, metadata = await scope["example"]()
        assert reply.payload == b"189.20" and metadata.topic == "events"

    asyncio.run(asyncio_example())

    with Admin(docs_cluster.bootstrap) as admin:
        admin.create_topic("orders", partitions=3)
    with Producer(docs_cluster.bootstrap) as producer, pytest.raises(_Done):  # the loop prints its first record
        run_block(tags, docs_cluster, producer=producer, Consumer=Consumer, print=first_call_ends_the_loop)

    run_block(ordered, docs_cluster)
    assert "debit 10" in capsys.readouterr().out


def test_direct_block(docs_cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    (example,) = python_blocks("docs/DIRECT.md")
    run_block(example, docs_cluster)
    out = capsys.readouterr().out
    assert "b'AAPL 189.20'" in out and "1 answered; missing: [] failed: {}" in out
    assert out.splitlines()[-1] == "1 0 0"  # its own publish reached its own subscription


def test_groups_block(docs_cluster: LocalCluster) -> None:
    listener_example, _tag_lines = python_blocks("docs/GROUPS.md")
    with Admin(docs_cluster.bootstrap) as admin:
        if "orders" not in admin.list_topics():
            admin.create_topic("orders", partitions=3)
    with Producer(docs_cluster.bootstrap) as producer:
        producer.send("orders", b"order 1").result(timeout=10)
    with pytest.raises(_Done):
        run_block(listener_example, docs_cluster, handle=first_call_ends_the_loop,
                  flush_my_state=lambda revoked: None, drop_my_state=lambda lost: None)


def test_queues_block(docs_cluster: LocalCluster) -> None:
    example, _stop_example, asyncio_example = python_blocks("docs/QUEUES.md")  # the middle one: run(should_stop=)
    handled: list[bytes] = []

    def handle(value: bytes) -> None:
        handled.append(value)
        if len(handled) == 4:  # everything not delayed: the worker's loop would wait for more
            raise _Done

    with pytest.raises(_Done):
        run_block(example, docs_cluster, handle=handle, TransientError=ConnectionError)
    assert sorted(handled) == [b"charge order 17", b"page on-call", b"price tick", b"resize 17.jpg"]
    # (Priority orders each partition's messages; these four span partitions, so which
    # comes first depends on which leader answers first.)

    async def run_asyncio_example() -> None:
        code = asyncio_example.replace('"jobs"', '"jobs-async"')  # a queue of its own
        with Admin(docs_cluster.bootstrap) as admin:
            admin.create_queue("jobs-async", partitions=2)
        with Producer(docs_cluster.bootstrap) as producer:
            for n in range(3):
                producer.send("jobs-async", f"async {n}".encode()).result(timeout=10)
        scope: dict[str, Any] = {"bootstrap": docs_cluster.bootstrap}
        exec("import sdk\nasync def example():\n    global worker\n"
             + textwrap.indent(code, "    "), scope)
        task = asyncio.ensure_future(scope["example"]())
        deadline = asyncio.get_running_loop().time() + 30
        while await asyncio.to_thread(_unsettled, docs_cluster.bootstrap) > 0:
            assert asyncio.get_running_loop().time() < deadline, "the asyncio example did not ack its messages"
            assert not task.done(), task.exception()
            await asyncio.sleep(0.2)
        await scope["worker"].close()  # "close() ends it": its loop ends, then client.close() runs
        await asyncio.wait_for(task, 10)

    asyncio.run(run_asyncio_example())


def _unsettled(bootstrap: str) -> int:
    with Admin(bootstrap) as admin:
        description = admin.describe_queue("jobs-async", "workers")
    return description.total("visible") + description.total("in_flight")
