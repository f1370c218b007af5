"""A direct-plane service endpoint (sdk/direct/metrics.py) over instances that come and go:
its exposition stays valid and bounded.

Before, an instance was reported from ``add`` on for as long as the process ran: a stopped
one (deregistered, its address never used again) kept its series, frozen, and a process
that restarted its instances grew a set of series per restart; an instance added twice
gave every series twice, an exposition Prometheus rejects whole."""

from __future__ import annotations

import collections
import urllib.request
import uuid

from prometheus_client.parser import text_string_to_metric_families

import sdk
from fabric.local import LocalZooKeeper
from sdk.direct import Request
from sdk.direct.metrics import ServiceMetrics
from tests.fault.harness import wait_until

CALLS = 5
RESTARTS = 3
SCRAPE_TIMEOUT_S = 10


def echo(request: Request) -> bytes:
    return request.payload


def series(url: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text = response.read().decode()
    return [(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def handled(url: str) -> dict[str, float]:
    """fabric_service_handled_total per instance address."""
    return {dict(labels)["address"]: value for name, labels, value in series(url)
            if name == "fabric_service_handled_total"}


def test_stopped_instances_leave_and_an_instance_added_twice_is_reported_once(zk_server: LocalZooKeeper) -> None:
    bootstrap = f"zk://{zk_server.address}/direct-{uuid.uuid4().hex[:10]}"
    metrics = ServiceMetrics.start()
    try:
        with sdk.Client(bootstrap) as server, sdk.Client(bootstrap) as client:
            addresses = []
            for _ in range(RESTARTS):  # serve, answer, stop: as a process reconfiguring itself would
                svc = server.serve("echo", echo, metadata={"metrics_address": metrics.address})
                metrics.add(svc)
                metrics.add(svc)
                # The caller's view of the instances follows ZooKeeper; a request sent to the
                # instance stopped just before would time out (not this test's subject).
                wait_until(lambda address=svc.address: [i.address for i in client.services().get("echo", {}).values()]
                           == [address], "the caller to see only the new instance")
                for i in range(CALLS):
                    assert client.request("echo", b"%d" % i, timeout_ms=10_000).payload == b"%d" % i
                samples = series(metrics.address)
                duplicates = [k for k, n in collections.Counter((name, labels) for name, labels, _ in samples).items()
                              if n > 1]
                assert duplicates == []
                assert handled(metrics.address) == {svc.address: CALLS}  # the live instance only
                addresses.append(svc.address)
                svc.stop()
                assert handled(metrics.address) == {}
            assert len(set(addresses)) == RESTARTS  # each instance had an address, hence series, of its own

            svc = server.serve("echo", echo)
            metrics.add(svc)
            assert list(handled(metrics.address)) == [svc.address]
            metrics.remove(svc)
            assert handled(metrics.address) == {}
            svc.stop()
    finally:
        metrics.stop()
