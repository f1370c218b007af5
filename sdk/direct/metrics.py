"""An optional Prometheus endpoint for direct-plane services (``prometheus_client``).

Nothing in the request path changes: a ``Service`` already counts what it does (plain
ints on its loop), and this endpoint reads those counters only when Prometheus scrapes,
so serving metrics costs nothing per request, and not serving them costs nothing at all.

    from sdk.direct.metrics import ServiceMetrics

    metrics = ServiceMetrics.start(port=9464)           # 0: a free port
    svc = client.serve("billing.quote", quote, metadata={"metrics_address": metrics.address})
    metrics.add(svc)                                    # a Service or a SyncService

The URL in the instance's registration metadata is how a scrape config (or an operator
reading ``/fabric/services/...`` in ZooKeeper) finds it. Series, labelled
``service`` and ``address`` (one instance each)::

    fabric_service_handled_total        requests answered by the handler
    fabric_service_failed_total         handler errors returned as REMOTE_ERROR (or its code)
    fabric_service_refused_total        requests refused: queue full, stopping, expired
    fabric_service_requests_dropped_total   queued requests of callers that went away
    fabric_service_callers_lost_total   callers that stopped heartbeating
    fabric_service_in_flight            handler calls running plus requests queued
    fabric_service_callers              callers whose heartbeats the instance follows

An instance's series go once it has stopped and finished its requests (or on ``remove``),
as a deleted topic's do: a process that serves and stops instances (a new address each
time) would otherwise keep reporting every one of them, frozen, for as long as it runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fabric.metrics_http import MetricsEndpoint

COUNTERS = (
    ("handled", "fabric_service_handled", "Requests answered by the handler."),
    ("failed", "fabric_service_failed", "Handler errors sent back to the caller."),
    ("refused", "fabric_service_refused", "Requests refused (queue full, stopping, expired while queued)."),
    ("requests_dropped", "fabric_service_requests_dropped", "Queued requests of callers that went away."),
    ("callers_lost", "fabric_service_callers_lost", "Callers that stopped heartbeating."),
)
GAUGES = (
    ("in_flight", "fabric_service_in_flight", "Handler calls running plus requests queued."),
    ("callers", "fabric_service_callers", "Callers whose heartbeats this instance follows."),
)


class _Services(Collector):
    def __init__(self) -> None:
        self.services: list[Any] = []
        self.lock = threading.Lock()

    def add(self, service: Any) -> None:
        with self.lock:
            # Reported twice, an instance would give every series twice: an exposition
            # Prometheus rejects whole ("duplicate sample").
            if not any(s is service for s in self.services):
                self.services.append(service)

    def remove(self, service: Any) -> None:
        with self.lock:
            self.services = [s for s in self.services if s is not service]

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["service", "address"]
        with self.lock:
            # A stopped instance is reported until its last requests are done (draining),
            # then forgotten: it is deregistered, and nothing it reports changes any more.
            self.services = [s for s in self.services if not (getattr(s, "stopped", False) and s.in_flight == 0)]
            services = list(self.services)
        families: list[CounterMetricFamily | GaugeMetricFamily] = []
        for attr, name, doc in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=labels)
            for svc in services:
                counter.add_metric([svc.name, svc.address], getattr(svc, attr))
            families.append(counter)
        for attr, name, doc in GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            for svc in services:
                gauge.add_metric([svc.name, svc.address], getattr(svc, attr))
            families.append(gauge)
        yield from families


class ServiceMetrics:
    """One endpoint for any number of service instances in this process."""

    def __init__(self) -> None:
        self._services = _Services()
        registry = CollectorRegistry(auto_describe=True)
        registry.register(self._services)
        self.endpoint = MetricsEndpoint(registry)

    @classmethod
    def start(cls, host: str = "127.0.0.1", port: int = 0) -> ServiceMetrics:
        metrics = cls()
        metrics.endpoint.start(host, port)
        return metrics

    @property
    def address(self) -> str:
        return self.endpoint.address

    def add(self, service: Any) -> None:
        """Report ``service`` (a ``Service``, or the ``SyncService`` the blocking API returns)
        until it stops; adding it again changes nothing."""
        self._services.add(getattr(service, "service", service))

    def remove(self, service: Any) -> None:
        """Stop reporting ``service`` now (a stopped one goes by itself)."""
        self._services.remove(getattr(service, "service", service))

    def stop(self) -> None:
        self.endpoint.stop()
