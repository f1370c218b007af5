"""An Admin call any node can answer does not wait out the whole request timeout on a
paused node (a stopped process, a frozen VM) that comes first in the routing map.

Found by a fault sweep: the Admin asked the nodes in the map's order and gave a node that
took the request ``request_timeout_ms`` (30 s) before asking the next, so with node 1
stopped every ``describe_topic`` (the CLI's too) took 30 s. A read-only call now gives
each node a metadata request's timeout, and a node that did not answer is asked last.
"""

from __future__ import annotations

import pytest

from fabric.local import LocalCluster
from sdk import Admin


@pytest.mark.timeout(90)  # the old behaviour waits request_timeout_ms (below): this is what fails it
def test_describe_skips_a_paused_node(fresh_cluster: LocalCluster, topic_name: str) -> None:
    with Admin(fresh_cluster.bootstrap, request_timeout_ms=600_000) as admin:
        admin.create_topic(topic_name, partitions=1, replication_factor=3)
        admin.describe_topic(topic_name)  # connected to the node asked first
        first = admin._meta.candidates()[0]
        [node_id] = [i for i, address in admin._meta.metadata.nodes.items() if address == first]
        paused = fresh_cluster.nodes[node_id]
        paused.pause()
        try:
            assert admin.describe_topic(topic_name).name == topic_name  # from another node
            assert admin._meta.candidates()[-1] == first  # and the paused one is asked last now
            assert admin.describe_topic(topic_name).name == topic_name
        finally:
            paused.resume()
