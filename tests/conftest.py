"""Shared fixtures: one ZooKeeper for the whole session, clusters of real node processes.

Each cluster gets its own ZooKeeper chroot, so clusters share the server but never see
each other's topics. Every process a fixture starts is stopped in its finalizer, also
when the test fails, and dies with the test process (PR_SET_PDEATHSIG) if pytest itself
is killed.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric.local import LocalCluster, LocalZooKeeper

_names = itertools.count()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalZooKeeper]:
    server = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def make_cluster(zk_server: LocalZooKeeper, base_dir: Path, nodes: int = 3, **kwargs: object) -> LocalCluster:
    chroot = f"/fabric-test-{uuid.uuid4().hex[:12]}"
    return LocalCluster(nodes, base_dir, zk_address=zk_server.address, chroot=chroot, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cluster(zk_server: LocalZooKeeper, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three nodes shared by the tests of one module; tests use their own topics."""
    c = make_cluster(zk_server, tmp_path_factory.mktemp("cluster"))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def fresh_cluster(zk_server: LocalZooKeeper, tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own, for tests that kill or restart nodes."""
    c = make_cluster(zk_server, tmp_path / "cluster")
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = "".join(ch if ch.isalnum() else "-" for ch in request.node.name)[:60]
    return f"{base}-{os.getpid()}-{next(_names)}"
