"""The direct plane: brokerless request-reply, scatter-gather and pub/sub between services,
found by name through ZooKeeper (docs/DIRECT.md, frames in docs/PROTOCOL.md section 10).

    import sdk
    client = await sdk.connect("zk://127.0.0.1:2181")
    await client.serve("echo", lambda request: request.payload)
    reply = await client.request("echo", b"hi", timeout_ms=1000, idempotent=True)
"""

from fabric.errors import (
    AuthenticationFailedError,
    AuthorizationFailedError,
    ClientClosedError,
    InvalidRequestError,
    MalformedRequestError,
    NoServiceAvailable,
    RemoteError,
    RequestTimeout,
    ServiceOverloaded,
    ServiceStopping,
    UnknownServerError,
)
from sdk.direct._client import DirectClient
from sdk.direct._pubsub import Publisher, Subscription
from sdk.direct._registry import InstanceInfo
from sdk.direct._secure import DirectCredentials
from sdk.direct._server import Service
from sdk.direct._sync import SyncDirect, SyncService, SyncSubscription
from sdk.direct._types import GatherResult, Message, Reply, Request

__all__ = [
    "AuthenticationFailedError",
    "AuthorizationFailedError",
    "ClientClosedError",
    "DirectClient",
    "DirectCredentials",
    "GatherResult",
    "InstanceInfo",
    "InvalidRequestError",
    "MalformedRequestError",
    "Message",
    "NoServiceAvailable",
    "Publisher",
    "RemoteError",
    "Reply",
    "Request",
    "RequestTimeout",
    "Service",
    "ServiceOverloaded",
    "ServiceStopping",
    "Subscription",
    "SyncDirect",
    "SyncService",
    "SyncSubscription",
    "UnknownServerError",
]
