"""The sequencer's Prometheus endpoint (``prometheus_client``), like a node's (nodes/metrics.py).

Series::

    fabric_sequencer_info{sequencer,address}          1
    fabric_sequencer_active                           1 while this instance grants IDs
    fabric_sequencer_granted_requests_total           ALLOCATE_IDS requests granted
    fabric_sequencer_granted_ids_total                global IDs handed out
    fabric_sequencer_request_duration_seconds         histogram: time to answer a request
    fabric_sequencer_request_errors_total{error}      refusals by wire error name

The endpoint's URL is in the active instance's ZooKeeper registration
(``/fabric/sequencer/active``, ``metrics_address``), which ``fabric status`` shows.
The counters the service keeps (plain ints, written by its loop thread) are read at scrape
time, so granting an ID costs nothing extra; only the histogram is observed per request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fabric import errors
from fabric.metrics_http import MetricsEndpoint

# An ID grant is a few microseconds; a reservation write to ZooKeeper, milliseconds.
LATENCY_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class _ServiceCollector(Collector):
    def __init__(self, service: Any) -> None:
        self.service = service

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.service
        info = GaugeMetricFamily("fabric_sequencer_info", "This instance's id and address (value 1).",
                                 labels=["sequencer", "address"])
        info.add_metric([str(s.sequencer_id), s.address], 1)
        yield info
        yield GaugeMetricFamily("fabric_sequencer_active", "1 while this instance is the active one.",
                                value=float(s.state == "active"))
        yield CounterMetricFamily("fabric_sequencer_granted_requests", "ALLOCATE_IDS requests granted.",
                                  value=s.granted_requests)
        yield CounterMetricFamily("fabric_sequencer_granted_ids", "Global IDs handed out.", value=s.granted_ids)


class SequencerMetrics:
    def __init__(self, service: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_ServiceCollector(service))
        self.request_seconds = Histogram("fabric_sequencer_request_duration_seconds",
                                         "Time to answer one request.", buckets=LATENCY_BUCKETS_S,
                                         registry=self.registry)
        self.request_errors = Counter("fabric_sequencer_request_errors", "Refusals by wire error name.",
                                      ["error"], registry=self.registry)
        self.endpoint = MetricsEndpoint(self.registry)

    def observe(self, seconds: float, error_code: int) -> None:
        self.request_seconds.observe(seconds)
        if error_code:
            self.request_errors.labels(errors.error_for_code(error_code).name).inc()
