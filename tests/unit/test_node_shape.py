"""The node stays carved into rooms (issue 9): small modules, one dispatch table."""

from __future__ import annotations

from pathlib import Path

from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from nodes import server

NODES = Path(__file__).resolve().parents[2] / "nodes"
SERVER_LINES_MAX = 400
MODULE_LINES_MAX = 500


def test_no_node_module_grows_past_its_limit() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in NODES.glob("*.py")}
    assert sizes["server.py"] < SERVER_LINES_MAX, sizes["server.py"]
    assert {name: n for name, n in sizes.items() if n > MODULE_LINES_MAX} == {}


def test_every_dispatched_api_is_a_known_key_with_a_schema() -> None:
    supported = apis.supported_versions()
    for key, handler in server.DISPATCH.items():
        ApiKey(key)  # raises ValueError for a key the protocol does not define
        assert key in supported, ApiKey(key).name
        assert isinstance(handler, server.GroupCommit) or callable(handler)


def test_the_node_serves_the_durable_plane_apis() -> None:
    for key in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.METADATA, ApiKey.REPLICA_ACK, ApiKey.OFFSETS_FOR_LEADER_EPOCH):
        assert key in server.DISPATCH


def test_duties_have_names_and_non_negative_intervals() -> None:
    duties = server.duties(server.NodeConfig(node_id=1, zk="127.0.0.1:1", data_dir="/nonexistent"))
    names = [d.name for d in duties]
    assert len(names) == len(set(names))
    assert all(d.interval_s >= 0 for d in duties)
