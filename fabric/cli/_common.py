"""What several command groups share: finding the cluster, and a progress line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

STATE_FILE = Path(os.environ.get("FABRIC_HOME", Path.home() / ".fabric")) / "local.json"
PROGRESS_INTERVAL_S = 1.0


def with_bootstrap(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``--bootstrap`` option every cluster-talking command takes."""
    parser.add_argument("--bootstrap", "-b", help="zk://host:port or tcp://node,tcp://node")
    return parser


def bootstrap(args: argparse.Namespace) -> str:
    """The cluster to talk to: ``--bootstrap``, else ``$FABRIC_BOOTSTRAP``, else ``fabric up``'s record."""
    if getattr(args, "bootstrap", None):
        return str(args.bootstrap)
    env = os.environ.get("FABRIC_BOOTSTRAP")
    if env:
        return env
    try:
        return str(json.loads(STATE_FILE.read_text())["bootstrap"])
    except (OSError, ValueError, KeyError):
        raise SystemExit(
            "no cluster given: pass --bootstrap zk://HOST:PORT (or node addresses), set FABRIC_BOOTSTRAP, "
            "or start one with `fabric up`"
        ) from None


class Progress:
    """A one-line progress report on stderr, at most once a second."""

    def __init__(self, label: str, total: int | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.count = 0
        self.started = time.monotonic()
        self._last = 0.0

    def add(self, n: int) -> None:
        self.count += n
        now = time.monotonic()
        if self.enabled and now - self._last >= PROGRESS_INTERVAL_S:
            self._last = now
            self._print(now)

    def _print(self, now: float, end: str = "\r") -> None:
        rate = self.count / max(now - self.started, 1e-9)
        of = f"/{self.total:,}" if self.total else ""
        sys.stderr.write(f"{self.label}: {self.count:,}{of} messages, {rate:,.0f} msg/s   {end}")
        sys.stderr.flush()

    def done(self) -> float:
        elapsed = time.monotonic() - self.started
        if self.enabled:
            self._print(time.monotonic(), end="\n")
        return elapsed
