"""The blocking entry point over both planes: ``sdk.Client(bootstrap)``.

    with sdk.Client("zk://127.0.0.1:2181") as client:
        client.serve("echo", lambda request: request.payload)
        print(client.request("echo", b"hi", timeout_ms=500).payload)
        with client.producer() as producer:
            producer.send("events", b"x").result(timeout=10)

The direct plane runs its asyncio core on one background loop thread (sdk.direct._sync);
``producer()`` and ``consumer()`` are the ordinary threaded Producer and Consumer.
"""

from __future__ import annotations

from typing import Any

from fabric import errors
from sdk._client import Bootstrap
from sdk.consumer import Consumer
from sdk.direct._sync import SyncDirect, SyncService, SyncSubscription
from sdk.direct._types import GatherResult, Reply
from sdk.producer import Producer

__all__ = ["Client"]


class Client:
    """``bootstrap``: ``zk://HOST:PORT[/chroot]`` gives both planes, node addresses
    (``tcp://HOST:PORT,...``) topics only; None: ``$FABRIC_BOOTSTRAP``, else the cluster
    ``fabric up`` recorded (ConfigError if neither, fabric/bootstrap.py), found once, here."""

    def __init__(self, bootstrap: str | None = None, **direct_options: Any) -> None:
        spec = Bootstrap(bootstrap)
        self.bootstrap: str = bootstrap if bootstrap is not None else spec.text
        self._direct = SyncDirect(spec.zk, **direct_options) if spec.zk is not None else None

    @property
    def direct(self) -> SyncDirect:
        if self._direct is None:
            raise errors.NoServiceAvailable(
                "the direct plane finds services through ZooKeeper: connect with a zk://host:port bootstrap")
        return self._direct

    def producer(self, **config: Any) -> Producer:
        return Producer(self.bootstrap, **config)

    def consumer(self, **config: Any) -> Consumer:
        return Consumer(self.bootstrap, **config)

    def request(self, name: str, payload: bytes | str, **options: Any) -> Reply:
        return self.direct.request(name, payload, **options)

    def gather(self, name: str, payload: bytes | str, **options: Any) -> GatherResult:
        return self.direct.gather(name, payload, **options)

    def serve(self, name: str, handler: Any, **options: Any) -> SyncService:
        return self.direct.serve(name, handler, **options)

    def publish(self, subject: str, payload: bytes | str, **options: Any) -> None:
        self.direct.publish(subject, payload, **options)

    def start_publisher(self) -> None:
        """Bind and register this client's PUB socket now, not on the first publish."""
        self.direct.start_publisher()

    def subscribe(self, pattern: str, handler: Any = None, **options: Any) -> SyncSubscription:
        return self.direct.subscribe(pattern, handler, **options)

    def services(self) -> dict[str, Any]:
        return self.direct.services()

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
