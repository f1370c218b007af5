"""One Prometheus HTTP endpoint (``prometheus_client``), shared by every Fabric process that
serves metrics: storage nodes (nodes/metrics.py), the sequencer (sequencer/metrics.py) and
direct-plane services (sdk/direct/metrics.py).

The endpoint lives inside a process with more important work (a node's request loop, its
ZooKeeper session), so every cost a scraper can cause is bounded:

- At most ``CONNECTIONS_MAX`` connections are served at once, one thread each; a
  connection over that is answered ``503`` at once and closed (as node_exporter's
  ``--web.max-requests``). prometheus_client's own server starts a thread per connection
  without limit or timeout: 500 clients that sent half a request held 500 threads in a
  node, and when they closed together the threads woke at once and held the node's loop
  off the GIL for 0.5 to 8 s, once long enough to cost it its ZooKeeper session.
- A client that sends its request, or reads the answer, slower than
  ``CONNECTION_TIMEOUT_S`` per socket operation is dropped.
- One rendering at a time, shared: a scrape that arrives while another renders waits for
  the next rendering and takes it (its data are newer than the request), so a burst of
  scrapes costs the CPU of a few renderings, not one per scrape.

``GET /metrics`` and ``HEAD /metrics`` are served (gzip and OpenMetrics when asked for, as
prometheus_client does); any other path is ``404``, any other method ``501``.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import socketserver
import threading
import time
import urllib.parse
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

HTTP_STOP_TIMEOUT_S = 5.0
CONNECTIONS_MAX = 16  # connections served at once (Prometheus needs one per scrape)
CONNECTION_TIMEOUT_S = 10.0  # per socket read or write of one connection
LISTEN_BACKLOG = 64  # a burst of connects waits here, not in SYN retries (socketserver's default: 5)
METRICS_PATH = "/metrics"
# Bind addresses meaning every interface: no scraper can reach a URL that names them.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
_BUSY_RESPONSE = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Renderer:
    """Renders the registry one scrape at a time; scrapes that waited share the next result."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.renders = 0  # how many times the registry was rendered (tests read it)
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, bytes]] = {}  # content type -> (render start, body)

    def render(self, accept_header: str) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept_header)
        arrived_s = time.monotonic()
        with self._lock:
            latest = self._latest.get(content_type)
            # A rendering that started after this request arrived is as fresh as one of its own.
            if latest is not None and latest[0] >= arrived_s:
                return latest[1], content_type
            started_s = time.monotonic()
            body = encoder(self.registry)
            self.renders += 1
            self._latest[content_type] = (started_s, body)
            return body, content_type


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = CONNECTION_TIMEOUT_S  # StreamRequestHandler sets it on the socket
    server: _Server

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        if urllib.parse.urlsplit(self.path).path != METRICS_PATH:
            self.send_error(404, f"metrics are served at {METRICS_PATH}")
            return
        try:
            body, content_type = self.server.renderer.render(self.headers.get("Accept", ""))
        except Exception as e:  # a collector's bug must not kill the thread silently
            self.send_error(500, f"rendering the metrics failed: {type(e).__name__}")
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line on stderr per scrape would drown the process's own log


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    # socketserver.TCPServer, not http.server.HTTPServer: the latter resolves the host's
    # FQDN when it binds, a DNS lookup that can take seconds.
    daemon_threads = True  # the process's exit does not wait for a stuck client
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], renderer: _Renderer, connections_max: int) -> None:
        self.renderer = renderer
        self._slots = threading.BoundedSemaphore(connections_max)
        self.address_family = socket.getaddrinfo(address[0] or None, address[1], type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)[0][0]
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Over the cap: say so and close, rather than start one more thread.
            try:
                request.setblocking(False)
                request.send(_BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class MetricsEndpoint:
    """``/metrics`` for one registry on its own thread; ``stop`` ends it."""

    def __init__(self, registry: CollectorRegistry, connections_max: int = CONNECTIONS_MAX) -> None:
        if connections_max < 1:
            raise ValueError(f"connections_max must be at least 1, not {connections_max}")
        self.registry = registry
        self.renderer = _Renderer(registry)
        self.connections_max = connections_max
        self.address = ""  # the endpoint's URL, once serving
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int, *, reachable_host: str = "") -> str:
        """Serve on host:port (0: a free port); returns the endpoint's URL (the one a node or
        sequencer publishes). A wildcard ``host`` (every interface) is named in the URL as
        ``reachable_host``, the process's own address, when one is given."""
        self._server = _Server((host, port), self.renderer, self.connections_max)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        bound_port = self._server.server_address[1]
        if host in WILDCARD_HOSTS and reachable_host:
            host = reachable_host
        url_host = f"[{host}]" if ":" in host else host
        self.address = f"http://{url_host}:{bound_port}{METRICS_PATH}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(HTTP_STOP_TIMEOUT_S)
            self._server = None
