"""The direct plane from the command line, for debugging (docs/DIRECT.md)::

    fabric service list [NAME]               instances, address, load, version (NAME: exit 1 if none)
    fabric service credential FILE           secure cluster (operator): write the direct plane's
                                             ZooKeeper credential, which may write the registry only
    fabric request NAME PAYLOAD              one request; the reply on stdout
    fabric subscribe PATTERN                 messages matching a pattern (orders.*, orders.>)
    fabric publish SUBJECT PAYLOAD           one message to the current subscribers
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from fabric import errors
from fabric.cli import security as security_cli
from fabric.cli._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    I32_MAX,
    bootstrap,
    int_in_range,
    key_value,
    positive_int,
    usage_error,
    utf8_text,
    with_bootstrap,
)
from fabric.protocol import direct as direct_format
from fabric.wording import plural


def direct_timeout_ms(text: str) -> int:
    """A direct-plane wait in ms: 1 up to what the SDK accepts (it refused a longer one only
    after connecting, as an INVALID_REQUEST with exit 1)."""
    from sdk.direct._client import TIMEOUT_MS_MAX  # the SDK only once a command parses (fabric.cli)

    return int_in_range(1, TIMEOUT_MS_MAX, "TIMEOUT_MS_MAX, 24 h")(text)


def _checked_by(check: Callable[[str], object]) -> Callable[[str], str]:
    """An argument type from a fabric.protocol.direct check: its refusal becomes a usage
    error naming the flag (exit 2) instead of a cluster error after connecting (exit 1)."""

    def parse(text: str) -> str:
        try:
            check(utf8_text(text))
        except errors.FabricError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return text

    parse.__name__ = check.__name__  # argparse names the type in some messages
    return parse


subject_pattern = _checked_by(direct_format.validate_pattern)
subject = _checked_by(direct_format.encode_subject)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    service = subparsers.add_parser("service", help="direct-plane services: list instances")
    actions = service.add_subparsers(dest="service_command", required=True)
    listing = with_bootstrap(actions.add_parser("list", help="registered services and their instances"), zookeeper_only=True)
    listing.add_argument("name", nargs="?", help="only this service")
    listing.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    listing.set_defaults(run=cmd_service_list)
    credential = security_cli._with_zk(actions.add_parser(
        "credential", help="secure cluster: make the ZooKeeper credential services and callers use"))
    credential.add_argument("file", help="where to write user:password (mode 0600); an existing file is reused")
    credential.set_defaults(run=cmd_service_credential)

    request = with_bootstrap(subparsers.add_parser("request", help="send one request to a direct-plane service"), zookeeper_only=True)
    request.add_argument("name", type=utf8_text)
    request.add_argument("payload", type=utf8_text, help="the request body (UTF-8); '-' reads stdin")
    request.add_argument("--timeout-ms", type=direct_timeout_ms, default=5_000,
                         help="bound of the whole call, retries included")
    request.add_argument("--idempotent", action="store_true", help="allow retries on another instance")
    request.add_argument("--header", action="append", type=key_value, default=[], metavar="NAME=VALUE",
                         help="a request header (repeatable)")
    request.add_argument("--show-instance", action="store_true", help="print the answering instance on stderr")
    request.set_defaults(run=cmd_request)

    subscribe = with_bootstrap(subparsers.add_parser("subscribe", help="print direct-plane messages matching a pattern"), zookeeper_only=True)
    subscribe.add_argument("pattern", type=subject_pattern,
                           help="subject pattern: tokens split by '.', '*' one token, '>' the rest")
    subscribe.add_argument("--max-messages", type=positive_int, help="stop after this many")
    subscribe.add_argument("--timeout-ms", type=direct_timeout_ms, help="stop after this long without a message")
    subscribe.set_defaults(run=cmd_subscribe)

    publish = with_bootstrap(subparsers.add_parser("publish", help="publish one direct-plane message"), zookeeper_only=True)
    publish.add_argument("subject", type=subject, help="tokens split by '.', no wildcards")
    publish.add_argument("payload", type=utf8_text)
    publish.add_argument("--wait-ms", type=int_in_range(0, I32_MAX, "an i32 of milliseconds"), default=500,
                         help="wait this long for subscribers to connect first (PUB/SUB drops until then)")
    publish.set_defaults(run=cmd_publish)


def _zk(args: argparse.Namespace) -> str:
    import logging

    from sdk._client import Bootstrap

    # kazoo's connection warnings would repeat what the exit code and the message say.
    logging.getLogger("kazoo.client").setLevel(logging.ERROR)

    given = bootstrap(args, check=False)  # the kind of address first, then whether it answers
    spec = Bootstrap(given)
    if spec.zk is None:
        # A usage error (exit 2), as `fabric status` says of the same mistake; it was exit 1
        # as "[NO_SERVICE_AVAILABLE]", which read as if the service were down.
        raise usage_error(f"the direct plane finds services through ZooKeeper: pass --bootstrap zk://HOST:PORT[/chroot] "
                          f"(got {given!r})")
    bootstrap(args)
    return spec.zk


def cmd_service_credential(args: argparse.Namespace) -> int:
    """The operator (with the cluster's digest) lets a second credential write the direct
    plane's registry and nothing else (fabric.auth.store.open_direct_registry)."""
    from pathlib import Path

    from fabric.auth import store

    admin = security_cli._digest(args)
    if admin is None:
        raise errors.AuthorizationFailedError("the operator's ZooKeeper digest is needed: --zk-digest-file")
    path = Path(args.file)
    direct = store.read_digest(path) if path.exists() else store.write_digest(path, user=store.DIRECT_DIGEST_USER)
    with security_cli._zk(args) as zk:
        store.open_direct_registry(zk, admin, direct)
    print(f"{path}: services and callers use it as $FABRIC_ZK_DIGEST_FILE (with their own $FABRIC_KEY_FILE);"
          " it may write the direct plane's registry and nothing else")
    return 0


def cmd_service_list(args: argparse.Namespace) -> int:
    from fabric.zk import close_client
    from sdk.direct import _registry as registry

    zk = registry.start_client(_zk(args))
    try:
        services = registry.list_services(zk)
    finally:
        close_client(zk)
    # With a NAME the exit code answers "is it up?" for scripts (`fabric service list pricing
    # && ...`), as `fabric status` does for the cluster: 1 when no instance of it is
    # registered, after printing what was found.
    missing = EXIT_OK
    if args.name:
        services = {args.name: services.get(args.name, {})}
        missing = EXIT_OK if services[args.name] else EXIT_ERROR
        if missing and not args.json:  # "no services registered" while others are
            print(f"no instance of service {args.name!r} is registered")
            return missing
    if args.json:
        print(json.dumps({name: {z: i.__dict__ for z, i in inst.items()} for name, inst in services.items()},
                         indent=2, sort_keys=True))
        return missing
    if not any(services.values()):
        print("no services registered")
        return 0
    print(f"{'SERVICE':<24} {'INSTANCE':<22} {'ADDRESS':<24} {'LOAD':>5} {'VERSION':<10} {'HOST':<16} PID  UP")
    now_ms = int(time.time() * 1000)
    for name, instances in services.items():
        for znode, info in instances.items():
            # Entries that did not decode were skipped with a warning on stderr; optional
            # fields a registrar left out read 0: shown as unknown, not as 1970.
            up = f"{max(0, now_ms - info.started_ms) // 1000}s" if info.started_ms > 0 else "-"
            print(f"{name:<24} {znode:<22} {info.address:<24} {info.load:>5} {info.version or '-':<10} "
                  f"{info.host or '-':<16} {info.pid or '-'} {up}")
    return 0


def cmd_request(args: argparse.Namespace) -> int:
    from sdk.direct import SyncDirect

    payload = sys.stdin.buffer.read() if args.payload == "-" else args.payload.encode()
    headers: dict[str, bytes | str] = dict(args.header)  # NAME=VALUE pairs, checked while parsing
    client = SyncDirect(_zk(args))
    try:
        reply = client.request(args.name, payload, timeout_ms=args.timeout_ms, headers=headers or None,
                               idempotent=args.idempotent)
    finally:
        client.close()
    if args.show_instance:
        print(f"instance: {reply.instance}", file=sys.stderr)
    for name, value in reply.headers.items():
        print(f"{name}: {value.decode(errors='replace')}", file=sys.stderr)
    sys.stdout.buffer.write(reply.payload + b"\n")
    sys.stdout.flush()
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    from sdk.direct import SyncDirect

    client = SyncDirect(_zk(args))
    out = sys.stdout.buffer
    count = 0
    lost = 0
    interrupted = False
    try:
        subscription = client.subscribe(args.pattern)
        try:
            while args.max_messages is None or count < args.max_messages:
                message = subscription.next(args.timeout_ms if args.timeout_ms is not None else 1_000)
                if message is None:
                    if args.timeout_ms is not None:
                        break
                    continue
                out.write(message.subject.encode() + b"\t" + message.payload + b"\n")
                out.flush()
                count += 1
        except KeyboardInterrupt:
            # Stop reading but still report the lost count below; then exit 130, as
            # `consume --follow` and `queue receive` do (docs/PROTOCOL.md section 13).
            interrupted = True
        lost = subscription.lost
    finally:
        client.close()
    if lost:
        print(f"{plural(lost, 'message')} lost (dropped or gaps)", file=sys.stderr)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK


def cmd_publish(args: argparse.Namespace) -> int:
    from sdk.direct import SyncDirect

    client = SyncDirect(_zk(args))
    try:
        # Subscribers connect once the publisher is registered and drop what was sent
        # before (PUB/SUB's slow joiner), hence register first, then wait, then send.
        client.start_publisher()
        time.sleep(args.wait_ms / 1000)
        client.publish(args.subject, args.payload)
        time.sleep(0.1)  # let ZeroMQ hand the message to the kernel before the socket closes
    finally:
        client.close()
    return 0
