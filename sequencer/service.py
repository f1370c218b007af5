"""One sequencer instance: stands by, or, while it holds ``/fabric/sequencer/active``,
grants global IDs over ZeroMQ (ALLOCATE_IDS, docs/PROTOCOL.md).

States (decided in ``_set_state`` only)::

    STANDBY --created the active znode and reserved a range--> ACTIVE
    ACTIVE  --session lost / znode not ours / reservation write refused--> STANDBY
    any     --stop()--> STOPPED

Safety (see ``sequencer/allocator.py``): IDs come only from ranges reserved in
ZooKeeper with a version-checked write before they are granted, so they are unique across
any failover; answers go out only while the session lease is valid, so an instance paused
past its session answers nothing after it wakes before confirming it is still active.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import zmq
from kazoo.client import KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from fabric import config, errors, logs
from fabric import zk as zkl
from fabric.auth.curve import DOMAIN_REPLICATION, ServerSecurity, ZapAuthenticator
from fabric.auth.store import SecurityCache, read_digest, secure_zk_kwargs
from fabric.limits import REQUEST_FRAMES_MAX
from fabric.protocol import apis
from fabric.protocol.apis import ApiKey
from fabric.protocol.header import Header, decode_header
from fabric.protocol.sequencer import check_count, check_kind
from fabric.sequencer_client import (
    SEQUENCER_ACTIVE,
    SEQUENCER_ROOT,
    SEQUENCER_STATE,
    ZK_CALL_TIMEOUT_S,
    ActiveSequencer,
)
from sequencer.allocator import (
    RESERVATION_BLOCK_IDS_DEFAULT,
    IdAllocator,
    Lease,
    Reservation,
    takeover,
)
from sequencer.metrics import SequencerMetrics

log = logging.getLogger("sequencer")

STANDBY, ACTIVE, STOPPED = "standby", "active", "stopped"
POLL_INTERVAL_MS = 50
STANDBY_RETRY_S = 1.0  # also woken at once by the watch on the active znode
REQUESTS_PER_TURN_MAX = 1_000
SOCKET_HWM = 10_000
TAKEOVER_ATTEMPTS_MAX = 5
# A stop hands the active place over at once by deleting our znode and closing the
# session; with ZooKeeper unreachable neither can happen, and the session timeout hands the
# place over instead. So the stop waits on ZooKeeper at most about this long in all,
# whatever the lease thread is doing.
SHUTDOWN_ZK_S = 2.0
SHUTDOWN_CLOSE_S_MIN = 0.2  # the close's share when the rest used the time up (it is a round trip)
SERVED_API_KEYS = frozenset({ApiKey.API_VERSIONS, ApiKey.ALLOCATE_IDS})


class SequencerService:
    def __init__(self, zk_hosts: str, sequencer_id: int, *, host: str = "127.0.0.1", port: int = 0,
                 session_timeout_ms: int = 6_000, block_ids: int = RESERVATION_BLOCK_IDS_DEFAULT,
                 server_key_file: str = "", zk_digest_file: str = "", metrics_port: int = -1,
                 metrics_host: str = "") -> None:
        self.zk_hosts = zk_hosts
        self.sequencer_id = sequencer_id
        self.host = host
        self.port = port
        self.session_timeout_ms = session_timeout_ms
        self.block_ids = block_ids
        self.lease = Lease(session_timeout_ms)
        self.state = STANDBY
        self.allocator: IdAllocator | None = None
        self.state_version = -1  # znode version of /fabric/sequencer/state as we last wrote it
        self.address = ""
        self.granted_requests = 0
        self.granted_ids = 0
        self._stop = threading.Event()
        self.started = False  # ZooKeeper answered: from then on a signal stops the service cleanly
        self._active_changed = threading.Event()
        self._session_lost = threading.Event()
        self._lock = threading.Lock()  # guards state changes against the lease thread
        # Secure mode (docs/SECURITY.md): CURVE with the cluster key on the ROUTER, admitting
        # node and super keys only; znodes written with the ZooKeeper digest.
        self._server = ServerSecurity.from_file(server_key_file) if server_key_file else None
        digest = read_digest(zk_digest_file) if zk_digest_file else None
        self._security_cache: SecurityCache | None = None
        self._zap: ZapAuthenticator | None = None
        self.zk = zkl.make_client(zk_hosts, session_timeout_s=session_timeout_ms / 1000.0, **secure_zk_kwargs(digest))
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self._renewer: threading.Thread | None = None
        # The Prometheus endpoint (sequencer/metrics.py); -1: none. It binds metrics_host ("": host).
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host or host
        self.metrics = SequencerMetrics(self) if metrics_port >= 0 else None

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.zk.add_listener(self._on_zk_state)
        self.zk.start(timeout=30)
        self.started = True
        try:
            zkl.ensure_path(self.zk, SEQUENCER_ROOT)  # bounded, as every ZooKeeper call here
            if self._server is not None:  # the ZAP handler runs before the CURVE socket binds
                cache = self._security_cache = SecurityCache(self.zk)
                cache.start()
                self._zap = ZapAuthenticator(self.ctx, lambda: cache.authorizer)
                self._zap.start()
                self._server.apply(self.router, DOMAIN_REPLICATION)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.setsockopt(zmq.SNDHWM, SOCKET_HWM)
            self.router.setsockopt(zmq.RCVHWM, SOCKET_HWM)
            self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
            if self.port:
                self.router.bind(f"tcp://{self.host}:{self.port}")
            else:
                self.port = self.router.bind_to_random_port(f"tcp://{self.host}")
            self.address = f"tcp://{self.host}:{self.port}"
            if self.metrics is not None:
                try:
                    self.metrics.endpoint.start(self.metrics_host, self.metrics_port, reachable_host=self.host)
                except OSError as exc:  # name the port: "Address already in use" alone reads like --port
                    raise OSError(f"metrics endpoint {self.metrics_host}:{self.metrics_port}: "
                                  f"{exc.strerror or exc}") from exc
            log.info("sequencer %d listening on %s, standing by", self.sequencer_id, self.address)
            self.zk.DataWatch(SEQUENCER_ACTIVE, self._on_active_znode)
            self._renewer = threading.Thread(target=self._renew_lease, name="lease", daemon=True)
            self._renewer.start()
            self._loop()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        deadline = time.monotonic() + SHUTDOWN_ZK_S
        was_active = self.state == ACTIVE
        self._set_state(STOPPED, "stopping")
        if self._renewer is not None:
            # A daemon thread: one still inside a ZooKeeper call ends when the client closes.
            self._renewer.join(timeout=SHUTDOWN_ZK_S)
        if was_active:
            # hand over at once instead of after the session timeout
            self._delete_own_active_znode(timeout_s=deadline - time.monotonic())
        self.router.close(linger=0)
        if self._zap is not None:
            self._zap.stop()
        if self.metrics is not None:
            self.metrics.endpoint.stop()
        if self._security_cache is not None:
            self._security_cache.close()
        self.ctx.term()
        zkl.close_client_within(self.zk, max(SHUTDOWN_CLOSE_S_MIN, deadline - time.monotonic()))

    # -- ZooKeeper events (kazoo's thread: set flags only) ---------------------------------
    def _on_zk_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost.set()
        self._active_changed.set()

    def _on_active_znode(self, data: bytes | None, _stat: Any, _event: Any = None) -> bool | None:
        self._active_changed.set()
        return False if self._stop.is_set() else None

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        next_standby_try = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if self._session_lost.is_set():
                self._session_lost.clear()
                if self.state == ACTIVE:
                    self._set_state(STANDBY, "ZooKeeper session lost")
            if self.state == STANDBY and (self._active_changed.is_set() or now >= next_standby_try):
                self._active_changed.clear()
                next_standby_try = now + STANDBY_RETRY_S
                self._try_become_active()
            elif self.state == ACTIVE:
                self._reserve_ahead()
            if poller.poll(POLL_INTERVAL_MS):
                self._serve_requests()

    def _serve_requests(self) -> None:
        for _ in range(REQUESTS_PER_TURN_MAX):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) >= 2 and len(frames[1]) == 0:  # REQ peers add an empty delimiter
                envelope, message = frames[:2], frames[2:]
            else:
                envelope, message = frames[:1], frames[1:]
            header: Header | None = None
            started, error_code = time.perf_counter(), 0
            try:
                if len(message) > REQUEST_FRAMES_MAX:
                    raise errors.MalformedRequestError(f"{len(message)} frames exceed {REQUEST_FRAMES_MAX}")
                header = self._served_header(message)
                request = apis.decode_request(message)
                header = request.header
                self._send(envelope, self._answer(request))
            except errors.FabricError as exc:
                header = header or getattr(exc, "header", None)
                correlation_id = exc.fields.get("correlation_id", 0)
                request_header = header or Header(0, 0, correlation_id if isinstance(correlation_id, int) else 0)
                self._send(envelope, apis.encode_error_response(request_header, exc.code, exc.message))
                error_code = exc.code
            except Exception as exc:  # never let one request take the instance down
                log.exception("request failed")
                request_header = header or Header(0, 0, 0)
                self._send(envelope, apis.encode_error_response(
                    request_header, errors.UnknownServerError.code, f"sequencer failed: {exc}"))
                error_code = errors.UnknownServerError.code
            if self.metrics is not None:
                self.metrics.observe(time.perf_counter() - started, error_code)

    @staticmethod
    def _served_header(message: list[Any]) -> Header | None:
        """The request's header when it decodes; UNKNOWN_API for an API this process does not
        serve, before its body is read: a PRODUCE sent here by mistake is told "not served",
        not that its body is short."""
        if not message:
            return None
        header = decode_header(message[0])
        if header.api_key not in SERVED_API_KEYS:
            name = ApiKey(header.api_key).name if header.api_key in ApiKey._value2member_map_ else str(header.api_key)
            refusal = errors.UnknownApiError(f"a sequencer serves API_VERSIONS and ALLOCATE_IDS, not {name}")
            refusal.header = header  # type: ignore[attr-defined]  # echoed, as decode_request does
            raise refusal
        return header

    def _answer(self, request: apis.Message) -> list[Any]:
        api = request.header.api_key
        if api == ApiKey.API_VERSIONS:
            return apis.encode_response(request.header, {"apis": [
                {"api_key": ApiKey.API_VERSIONS, "min_version": 0, "max_version": 0},
                {"api_key": ApiKey.ALLOCATE_IDS, "min_version": 0, "max_version": 0}]})
        if api != ApiKey.ALLOCATE_IDS:
            raise errors.UnknownApiError(f"a sequencer serves API_VERSIONS and ALLOCATE_IDS, not {ApiKey(api).name}")
        count = check_count(request.body["count"], allow_zero=True)
        kind = check_kind(request.body["kind"])
        if not self._may_answer():
            raise errors.NotActiveSequencerError(
                f"sequencer {self.sequencer_id} is {self.state}; the active one is registered at {SEQUENCER_ACTIVE}")
        allocator = self.allocator
        if allocator is None:
            raise errors.NotActiveSequencerError(f"sequencer {self.sequencer_id} has no range")
        reservation = allocator.reservation_for(count)
        if reservation is not None and not self._write_reservation(allocator, reservation):
            raise errors.NotActiveSequencerError(f"sequencer {self.sequencer_id} lost its reservation; deposed")
        grant = allocator.grant(count, kind)
        # Checked again right before the bytes leave: the reservation write above may have
        # taken long enough for the lease to run out.
        if not self.lease.valid(time.monotonic()):
            raise errors.NotActiveSequencerError(f"sequencer {self.sequencer_id}: lease ran out while granting")
        self.granted_requests += 1
        self.granted_ids += count
        return apis.encode_response(request.header, grant.to_body())

    def _send(self, envelope: list[Any], frames: list[Any]) -> None:
        try:
            self.router.send_multipart(envelope + frames, zmq.NOBLOCK)
        except zmq.Again:
            log.warning("reply dropped: peer's queue is full")

    # -- becoming active, staying active -----------------------------------------------------
    def _set_state(self, state: str, why: str) -> None:
        with self._lock:
            if state == self.state:
                return
            log.info("sequencer %d: %s -> %s (%s)", self.sequencer_id, self.state, state, why)
            self.state = state
            if state != ACTIVE:
                self.lease.revoke()
                self.allocator = None

    def _try_become_active(self) -> None:
        me = ActiveSequencer(self.sequencer_id, self.address, os.getpid(), int(time.time() * 1000),
                             self.metrics.endpoint.address if self.metrics is not None else "")
        started = time.monotonic()
        try:
            self.zk.create_async(SEQUENCER_ACTIVE, me.encode(), ephemeral=True).get(timeout=ZK_CALL_TIMEOUT_S)
        except NodeExistsError:
            # Ours, while we stand by? A create of ours timed out (ZooKeeper paused) and was
            # applied afterwards: the znode names us, nobody grants IDs, and the other
            # instances wait for it to go. Remove it; the watch brings everyone back here.
            if self._delete_own_active_znode():
                log.warning("removed an active znode of our own session that a timed-out create left behind")
            return
        except Exception as exc:  # named by type: kazoo's ConnectionLoss and timeouts carry no message
            log.warning("could not register as active: %s: %s", type(exc).__name__, exc)
            return
        # The create succeeded at or after ``started``: our session is alive until at least
        # started + session timeout, so the lease may begin there.
        self.lease.confirmed(started)
        for _ in range(TAKEOVER_ATTEMPTS_MAX):
            try:
                try:
                    raw, stat = self.zk.get_async(SEQUENCER_STATE).get(timeout=ZK_CALL_TIMEOUT_S)
                except NoNodeError:
                    self.zk.create_async(SEQUENCER_STATE, Reservation.decode(None).encode()).get(
                        timeout=ZK_CALL_TIMEOUT_S)
                    continue
                previous = Reservation.decode(raw)
                new, start = takeover(previous, self.block_ids)
                written = self.zk.set_async(SEQUENCER_STATE, new.encode(), version=stat.version).get(
                    timeout=ZK_CALL_TIMEOUT_S)
            except (BadVersionError, NodeExistsError):
                continue  # a deposed instance's last reservation raced ours: read again
            except Exception as exc:
                log.warning("takeover failed: %s: %s", type(exc).__name__, exc)
                break
            with self._lock:
                self.allocator = IdAllocator(new.epoch, start, new.reserved_end, self.block_ids)
                self.state_version = written.version
            self._set_state(ACTIVE, f"epoch {new.epoch}, IDs from {start}")
            return
        self._delete_own_active_znode()
        self.lease.revoke()

    def _write_reservation(self, allocator: IdAllocator, reservation: Reservation) -> bool:
        try:
            written = self.zk.set_async(SEQUENCER_STATE, reservation.encode(), version=self.state_version).get(
                timeout=ZK_CALL_TIMEOUT_S)
        except BadVersionError:
            self._set_state(STANDBY, "reservation znode changed under us: a successor took over")
            return False
        except Exception as exc:
            log.warning("reservation write failed: %s: %s", type(exc).__name__, exc)
            return False
        self.state_version = written.version
        allocator.reserved(reservation)
        return True

    def _reserve_ahead(self) -> None:
        allocator = self.allocator
        if allocator is not None and allocator.remaining < allocator.block_ids // 2:
            reservation = allocator.reservation_for(1)
            if reservation is not None:
                self._write_reservation(allocator, reservation)

    def _confirm(self) -> bool | None:
        """Is our ephemeral still ours? True (lease extended), False (it is not: deposed),
        None (could not tell: connection trouble; the lease just runs down)."""
        started = time.monotonic()
        try:
            self.zk.sync_async(SEQUENCER_ACTIVE).get(timeout=ZK_CALL_TIMEOUT_S)
            stat = self.zk.exists_async(SEQUENCER_ACTIVE).get(timeout=ZK_CALL_TIMEOUT_S)
        except Exception:
            return None
        session_id = self.zk.client_id[0] if self.zk.client_id else None
        if stat is None or stat.ephemeralOwner != session_id:
            return False
        self.lease.confirmed(started)
        return True

    def _may_answer(self) -> bool:
        if self.state != ACTIVE:
            return False
        if self.lease.valid(time.monotonic()):
            return True
        # The lease ran out: typically this process was paused (SIGSTOP, swap) or ZooKeeper
        # was unreachable. Confirm before answering; a deposed instance learns it here.
        confirmed = self._confirm()
        if confirmed is False:
            self._set_state(STANDBY, "the active znode is no longer ours")
        return bool(confirmed) and self.lease.valid(time.monotonic())

    def _renew_lease(self) -> None:
        interval_s = self.lease.length_s / 4
        while not self._stop.wait(interval_s):
            if self.state != ACTIVE:
                continue
            if self._confirm() is False:
                self._session_lost.set()  # the loop steps down; this thread only reports

    def _delete_own_active_znode(self, timeout_s: float = ZK_CALL_TIMEOUT_S) -> bool:
        """Delete the active znode if our session owns it; True if it did. Both ZooKeeper
        calls together wait at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            if timeout_s <= 0:
                return False
            stat = self.zk.exists_async(SEQUENCER_ACTIVE).get(timeout=timeout_s)
            session_id = self.zk.client_id[0] if self.zk.client_id else None
            if stat is not None and stat.ephemeralOwner == session_id:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return False
                self.zk.delete_async(SEQUENCER_ACTIVE, version=stat.version).get(timeout=left_s)
                return True
        except Exception as exc:
            log.debug("could not delete the active znode: %s", exc)
        return False


def main(argv: list[str] | None = None) -> int:
    import argparse
    import signal

    def ranged(low: int, high: int) -> Callable[[str], int]:
        def parse(text: str) -> int:
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
            if not low <= value <= high:
                raise argparse.ArgumentTypeError(f"{value} outside [{low}, {high}]")
            return value
        return parse

    def zk_hosts(text: str) -> str:
        """HOST:PORT[,HOST:PORT...][/chroot], checked here: kazoo's own parse error is a traceback."""
        for part in text.split("/", 1)[0].split(","):
            host, _, port = part.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65_535:
                raise argparse.ArgumentTypeError(f"{part!r} is not HOST:PORT")
        return text

    def bind_host(text: str) -> str:
        problem = config.bind_host_problem(text)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    class Defaults(argparse.ArgumentDefaultsHelpFormatter):
        def _get_help_string(self, action: argparse.Action) -> str | None:
            return action.help if action.default in (None, "") else super()._get_help_string(action)

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line and exit 2, as every fabric command (PROTOCOL.md 13)
            self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    parser = Parser(prog="fabric sequencer", description="Run one sequencer instance (one of them is active).",
                    formatter_class=Defaults)
    parser.add_argument("--zk", required=True, type=zk_hosts, help="ZooKeeper connect string, e.g. 127.0.0.1:2181")
    parser.add_argument("--id", type=ranged(0, 2**31 - 1), default=1, dest="sequencer_id",
                        help="this instance's id, for logs")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind and to register")
    parser.add_argument("--port", type=ranged(0, 65_535), default=0, help="port for ALLOCATE_IDS; 0 picks a free one")
    parser.add_argument("--session-timeout-ms", type=ranged(1_000, 600_000), default=6_000,
                        help="ZooKeeper session timeout: how long a dead active instance holds its place")
    parser.add_argument("--metrics-port", type=ranged(-1, 65_535), default=0,
                        help="Prometheus endpoint port (/metrics); 0 picks a free one, -1 turns it off")
    # No default for argparse to run through bind_host (it refuses ""): unset, it is --host.
    parser.add_argument("--metrics-host", type=bind_host, default=None,
                        help="address the Prometheus endpoint binds (default: --host); 0.0.0.0 for every interface")
    logs.add_arguments(parser)
    parser.add_argument("--server-key-file", default="", help="secure mode: the cluster key pair (docs/SECURITY.md)")
    parser.add_argument("--zk-digest-file", default="", help="secure mode: the ZooKeeper digest user:password file")
    args = parser.parse_args(argv)
    logs.setup(args.log_level, args.log_format, process=f"sequencer{args.sequencer_id}")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        service = SequencerService(args.zk, args.sequencer_id, host=args.host, port=args.port,
                                   session_timeout_ms=args.session_timeout_ms, server_key_file=args.server_key_file,
                                   zk_digest_file=args.zk_digest_file, metrics_port=args.metrics_port,
                                   metrics_host=args.metrics_host or "")
    except Exception as exc:  # a missing key or digest file: one line, as below, not a traceback
        return _cannot_run(args.sequencer_id, f"cannot start: {str(exc) or type(exc).__name__}")

    def on_signal(_signum: int, _frame: Any) -> None:
        if not service.started:
            raise KeyboardInterrupt  # still waiting for ZooKeeper (up to 30 s, or for ever): end the start now
        service.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        service.run()
    except KeyboardInterrupt:
        print(f"fabric sequencer: sequencer {args.sequencer_id}: start interrupted", file=sys.stderr, flush=True)
        logging.shutdown()
        os._exit(130)  # kazoo's threads may be half started; closing them must not hang the exit
    except Exception as exc:  # no traceback for a user: say what failed, in one line
        what = str(exc) or type(exc).__name__
        if isinstance(exc, KazooTimeoutError):
            what = f"ZooKeeper at {args.zk} did not answer within 30 s"
        return _cannot_run(args.sequencer_id, f"stopped: {what}")
    return 0


def _cannot_run(sequencer_id: int, why: str) -> int:
    """The one line an instance that cannot run ends with (docs/OPERATIONS.md), exit 1."""
    log.error("sequencer %d %s", sequencer_id, why)
    print(f"fabric sequencer: error: sequencer {sequencer_id} {why}", file=sys.stderr, flush=True)
    return 1
