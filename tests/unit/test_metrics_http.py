"""The shared Prometheus endpoint (fabric/metrics_http.py) under load and bad clients: a real
HTTP server on a free loopback port, scraped with urllib and raw sockets.

It runs inside a storage node, so what a scraper can cost is bounded: before, 500
clients that sent half a request held 500 threads in a node (and stalled its loop when
they woke together), and concurrent scrapes rendered concurrently (33 at once here)."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from fabric import metrics_http
from fabric.metrics_http import MetricsEndpoint

RENDER_S = 0.05  # how long the slow collector takes to collect
SCRAPES = 40
SCRAPE_TIMEOUT_S = 30.0
THREAD_SETTLE_S = 1.0  # time for the server to start (or end) a connection's thread


class SlowCollector(Collector):
    """Counts how many collects run at once, and takes RENDER_S each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.running_max = 0
        self.collects = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            self.running += 1
            self.collects += 1
            self.running_max = max(self.running_max, self.running)
        time.sleep(RENDER_S)
        with self.lock:
            self.running -= 1
        yield GaugeMetricFamily("fabric_test_collects", "Collects so far.", value=self.collects)


@pytest.fixture
def slow() -> Iterator[tuple[SlowCollector, MetricsEndpoint]]:
    collector = SlowCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    endpoint = MetricsEndpoint(registry, connections_max=SCRAPES + 4)
    endpoint.start("127.0.0.1", 0)
    try:
        yield collector, endpoint
    finally:
        endpoint.stop()


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def test_concurrent_scrapes_render_one_at_a_time_and_share_the_result(
        slow: tuple[SlowCollector, MetricsEndpoint]) -> None:
    collector, endpoint = slow
    answers: list[str] = []
    failures: list[str] = []

    def scrape() -> None:
        try:
            with urllib.request.urlopen(endpoint.address, timeout=SCRAPE_TIMEOUT_S) as response:
                answers.append(response.read().decode())
        except OSError as e:
            failures.append(repr(e))

    threads = [threading.Thread(target=scrape) for _ in range(SCRAPES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [] and len(answers) == SCRAPES
    for text in answers:  # every answer is a valid exposition
        assert [f.name for f in text_string_to_metric_families(text)] == ["fabric_test_collects"]
    assert collector.running_max == 1, "collects ran concurrently"
    # Scrapes that waited share the next rendering: far fewer renderings than scrapes.
    assert collector.collects < SCRAPES / 2, collector.collects


def test_a_scrape_after_a_rendering_gets_fresh_data(slow: tuple[SlowCollector, MetricsEndpoint]) -> None:
    _collector, endpoint = slow
    for expected in (1, 2, 3):
        with urllib.request.urlopen(endpoint.address, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode()
        (family,) = text_string_to_metric_families(text)
        assert family.samples[0].value == expected  # never the previous rendering again


def test_slow_clients_hold_at_most_the_cap_of_threads() -> None:
    connections_max = 4
    endpoint = MetricsEndpoint(CollectorRegistry(), connections_max=connections_max)
    endpoint.start("127.0.0.1", 0)
    held: list[socket.socket] = []
    try:
        threads_before = threading.active_count()
        for _ in range(30):  # each sends half a request line and then nothing
            s = socket.create_connection(("127.0.0.1", port_of(endpoint.address)), timeout=5)
            s.sendall(b"GET /metr")
            held.append(s)
        time.sleep(THREAD_SETTLE_S)
        assert threading.active_count() - threads_before <= connections_max
        # Over the cap, a scrape is told so at once instead of waiting behind them.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(endpoint.address, timeout=SCRAPE_TIMEOUT_S)
        assert refused.value.code == 503
        for s in held:
            s.close()
        held.clear()
        time.sleep(THREAD_SETTLE_S)
        with urllib.request.urlopen(endpoint.address, timeout=SCRAPE_TIMEOUT_S) as response:
            assert response.status == 200
    finally:
        for s in held:
            s.close()
        endpoint.stop()


def test_a_client_that_sends_nothing_is_dropped_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_http._Handler, "timeout", 0.3)
    endpoint = MetricsEndpoint(CollectorRegistry(), connections_max=1)
    endpoint.start("127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", port_of(endpoint.address)), timeout=5) as silent:
            silent.sendall(b"GET /metr")
            assert silent.recv(1024) == b""  # the server closed it (a timeout here would raise)
        # Its slot is free again (the thread gives it back just after closing the socket).
        deadline_s = time.monotonic() + THREAD_SETTLE_S
        while True:
            try:
                with urllib.request.urlopen(endpoint.address, timeout=SCRAPE_TIMEOUT_S) as response:
                    assert response.status == 200
                    break
            except urllib.error.HTTPError as busy:
                assert busy.code == 503 and time.monotonic() < deadline_s
                time.sleep(0.01)
    finally:
        endpoint.stop()


def test_head_unknown_paths_methods_gzip_and_openmetrics() -> None:
    registry = CollectorRegistry()
    registry.register(SlowCollector())
    endpoint = MetricsEndpoint(registry)
    endpoint.start("127.0.0.1", 0)
    port = port_of(endpoint.address)

    def request(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=SCRAPE_TIMEOUT_S)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    try:
        status, headers, body = request("HEAD", "/metrics")
        assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
        assert headers["Content-Type"].startswith("text/plain")
        assert request("GET", "/nope")[0] == 404
        assert request("GET", "/")[0] == 404
        assert request("POST", "/metrics")[0] == 501
        status, headers, body = request("GET", "/metrics?x=1", {"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert b"fabric_test_collects" in gzip.decompress(body)
        status, headers, body = request("GET", "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert headers["Content-Type"].startswith("application/openmetrics-text") and body.endswith(b"# EOF\n")
    finally:
        endpoint.stop()


def test_a_wildcard_endpoint_publishes_a_reachable_url() -> None:
    # Bound to every interface (a node's `metrics_host = "0.0.0.0"`), its URL names the
    # process's own address: "http://0.0.0.0:..." in a node's znode is no scrape target.
    endpoint = MetricsEndpoint(CollectorRegistry(auto_describe=False))
    address = endpoint.start("0.0.0.0", 0, reachable_host="127.0.0.1")
    try:
        assert address.startswith("http://127.0.0.1:") and address.endswith("/metrics"), address
        with urllib.request.urlopen(address, timeout=SCRAPE_TIMEOUT_S) as answer:
            assert answer.status == 200
    finally:
        endpoint.stop()
    specific = MetricsEndpoint(CollectorRegistry(auto_describe=False))
    try:  # a specific address is its own URL, whatever the process's host
        assert specific.start("127.0.0.1", 0, reachable_host="10.0.0.11").startswith("http://127.0.0.1:")
    finally:
        specific.stop()
