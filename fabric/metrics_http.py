"""One Prometheus HTTP endpoint (``prometheus_client``), shared by every Fabric process that
serves metrics: storage nodes (nodes/metrics.py), the sequencer (sequencer/metrics.py) and
direct-plane services (sdk/direct/metrics.py)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

HTTP_STOP_TIMEOUT_S = 5.0


class MetricsEndpoint:
    """``/metrics`` for one registry on its own thread; ``stop`` ends it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.address = ""  # the endpoint's URL, once serving
        self._server: Any = None
        self._thread: Any = None

    def start(self, host: str, port: int) -> str:
        """Serve on host:port (0: a free port); returns the endpoint's URL."""
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.address = f"http://{host}:{self._server.server_address[1]}/metrics"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(HTTP_STOP_TIMEOUT_S)
            self._server = None
