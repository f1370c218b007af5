"""A direct-plane service's optional Prometheus endpoint (sdk/direct/metrics.py): its URL
travels in the instance's registration metadata, and scraped, the counters match the
requests the test made."""

from __future__ import annotations

import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sdk
from fabric import errors
from fabric.local import LocalZooKeeper
from sdk.direct import Request
from sdk.direct.metrics import ServiceMetrics

CALLS = 25


def test_service_metrics_count_the_requests(zk_server: LocalZooKeeper) -> None:
    bootstrap = f"zk://{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"

    def handler(request: Request) -> bytes:
        if request.payload == b"bad":
            raise ValueError("bad input")
        return request.payload

    metrics = ServiceMetrics.start()
    try:
        with sdk.Client(bootstrap) as server, sdk.Client(bootstrap) as client:
            svc = server.serve("echo", handler, metadata={"metrics_address": metrics.address})
            metrics.add(svc)
            for i in range(CALLS):
                assert client.request("echo", b"%d" % i, timeout_ms=10_000).payload == b"%d" % i
            with pytest.raises(errors.RemoteError):
                client.request("echo", b"bad", timeout_ms=10_000)
            (instance,) = client.services()["echo"].values()
            url = instance.metadata["metrics_address"]
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
    finally:
        metrics.stop()
    samples = {(s.name, s.labels.get("service")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("fabric_service_handled_total", "echo")] == CALLS
    assert samples[("fabric_service_failed_total", "echo")] == 1
    assert samples[("fabric_service_refused_total", "echo")] == 0
    assert samples[("fabric_service_in_flight", "echo")] == 0
