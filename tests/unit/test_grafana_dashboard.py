"""The Grafana dashboard queries only series a node really exports (no typo'd names)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fabric import errors
from fabric.protocol.apis import ApiKey
from nodes.metrics import NodeMetrics, PartitionSample, Snapshot

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "fabric-cluster.json"


def exported_series() -> set[str]:
    metrics = NodeMetrics(node_id=1)
    metrics.observe_request(ApiKey.PRODUCE, 0.001, 10)
    metrics.observe_response(ApiKey.PRODUCE, [errors.NotEnoughReplicasError.code], 10)
    metrics.latest = Snapshot((PartitionSample("t", 0, True, 1, 0, 1, 1, 1, 3, 2, 2, ((2, 1),)),), 0, 0, 0, True,
                              group_lag=(("g", "t", 0, 5),), queues=(("q", 0, "g", (("visible", 3),)),))
    text = generate_latest(metrics.registry).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_dashboard_uses_only_exported_series() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\b(fabric_\w+)", expr)}
    missing = used - exported_series()
    assert used and not missing, sorted(missing)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
