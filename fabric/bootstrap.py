"""Which cluster to talk to when the caller names none: one rule for the ``fabric``
commands, the Python SDK and the Spark connector.

The order: the address given, else ``$FABRIC_BOOTSTRAP`` (unset or empty counts as not
set), else the cluster ``fabric up`` recorded as ``"bootstrap"`` in
``$FABRIC_HOME/local.json`` (``~/.fabric/local.json`` without ``FABRIC_HOME``), as long as
the process that recorded it (its ``"pid"``) is alive. Nothing found is a ``ConfigError``
(fabric/errors.py). The form of the address is not checked here: the SDK's ``Bootstrap``
and the CLI each check it and say where it came from.

The environment is read at each call, not at import, so a program (or a test) that sets
``FABRIC_BOOTSTRAP`` or ``FABRIC_HOME`` before making a client is heard.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from fabric.errors import ConfigError

__all__ = ["BOOTSTRAP_ENV", "HOME_ENV", "recorded_cluster", "resolve_bootstrap", "state_file"]

BOOTSTRAP_ENV: Final[str] = "FABRIC_BOOTSTRAP"
HOME_ENV: Final[str] = "FABRIC_HOME"
STATE_FILE_NAME: Final[str] = "local.json"  # written by `fabric up` (fabric/cli/cluster.py)

GIVEN_ORIGIN: Final[str] = "the bootstrap argument"
ENV_ORIGIN: Final[str] = "$FABRIC_BOOTSTRAP"

NO_CLUSTER_MESSAGE: Final[str] = (
    "no cluster given: pass --bootstrap zk://HOST:PORT (or node addresses), set FABRIC_BOOTSTRAP, "
    "or start one with `fabric up`"
)


def state_file() -> Path:
    """Where ``fabric up`` records the cluster it runs: ``$FABRIC_HOME/local.json``, else
    ``~/.fabric/local.json``."""
    return Path(os.environ.get(HOME_ENV, Path.home() / ".fabric")) / STATE_FILE_NAME


def resolve_bootstrap(given: str | None = None) -> tuple[str, str]:
    """(bootstrap, where it came from) for a client: ``given`` when it is not None (even
    empty: an empty address is the caller's mistake, refused where it is parsed, never
    "find one for me"), else ``$FABRIC_BOOTSTRAP``, else ``fabric up``'s record.

    The origin is ``"the bootstrap argument"``, ``"$FABRIC_BOOTSTRAP"`` or ``"the cluster
    recorded in PATH"``, for messages about a malformed address. Raises ``ConfigError``
    when there is neither a variable nor a record, and when the recording ``fabric up``
    is no longer running (its fields: ``state_file``, and ``pid`` in the second case)."""
    if given is not None:
        return given, GIVEN_ORIGIN
    from_env = os.environ.get(BOOTSTRAP_ENV)
    if from_env:  # empty counts as unset: `FABRIC_BOOTSTRAP= cmd` is how a shell clears it for one command
        return from_env, ENV_ORIGIN
    path = state_file()
    return recorded_cluster(path), f"the cluster recorded in {path}"


def recorded_cluster(path: Path) -> str:
    """The ``"bootstrap"`` of the record at ``path``, if the ``fabric up`` that wrote it
    (``"pid"``) is alive: a record left by one that was killed would name ports nobody
    listens on, or that another program has taken since."""
    try:
        state = json.loads(path.read_text())
        spec = str(state["bootstrap"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(NO_CLUSTER_MESSAGE, state_file=str(path)) from None
    pid = state.get("pid")
    if isinstance(pid, int) and not _process_alive(pid):
        raise ConfigError(
            f"the cluster recorded in {path} (`fabric up`, pid {pid}) is not running: "
            "start it with `fabric up`, or pass --bootstrap",
            state_file=str(path), pid=pid,
        )
    return spec


def _process_alive(pid: int) -> bool:
    if pid <= 0:  # 0 and below name process groups, never the process that wrote the record
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond any pid the kernel gives
        return False
    except PermissionError:  # it exists, run by another user
        return True
    return True
