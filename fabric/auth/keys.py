"""CURVE key pairs on disk, in the certificate format of ``zmq.auth.load_certificate``.

``generate_key_pair(directory, name)`` writes two files:

* ``NAME.key``         the public key (share it: ``fabric principal add NAME --key NAME.key``)
* ``NAME.key_secret``  the public and the secret key (keep it: mode 0600)

Both are created with mode 0600 from the start (``os.open`` with the mode, never a chmod
after the fact, so the secret is never readable by others even for a moment) and never
overwrite an existing file unless asked.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth
from zmq.utils import z85

from fabric.errors import InvalidRequestError

log = logging.getLogger("fabric.auth")

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
KEY_FILE_MODE = 0o600
Z85_KEY_CHARS = 40  # a 32-byte CURVE key in Z85 text
NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,100}$")

_BANNER = """#   ****  Generated on {now} by fabric keys generate  ****
#   ZeroMQ CURVE {kind} Certificate
#   {warning}

"""


class KeyPair(NamedTuple):
    public_key: bytes  # Z85, 40 bytes: what zmq's CURVE_PUBLICKEY/CURVE_SERVERKEY take
    secret_key: bytes | None  # Z85, or None when only the public file was loaded


def validate_name(name: str, what: str = "principal") -> str:
    if not NAME_PATTERN.match(name) or name in (".", ".."):  # "." and "..": not a ZooKeeper node name
        raise InvalidRequestError(f"{what} name {name!r}: use 1 to 100 characters of [A-Za-z0-9._-], not . or ..")
    return name


def validate_public_key(key: str | bytes) -> bytes:
    """A Z85 CURVE public key as bytes, or InvalidRequestError saying what is wrong."""
    raw = key.encode("ascii", "replace") if isinstance(key, str) else bytes(key)
    raw = raw.strip()
    if len(raw) != Z85_KEY_CHARS:
        raise InvalidRequestError(f"a CURVE public key is {Z85_KEY_CHARS} Z85 characters, got {len(raw)}")
    try:
        decoded = z85.decode(raw)
    except (ValueError, KeyError, IndexError) as exc:
        raise InvalidRequestError(f"public key is not valid Z85: {exc}") from None
    if len(decoded) != 32:
        raise InvalidRequestError("a CURVE public key decodes to 32 bytes")
    return raw


def _write_exclusive(path: Path, text: str, overwrite: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, KEY_FILE_MODE)
    except FileExistsError:
        raise InvalidRequestError(f"{path} exists; remove it or pass --force") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, KEY_FILE_MODE)  # an overwritten file keeps its old mode otherwise


def _certificate(kind: str, warning: str, public_key: bytes, secret_key: bytes | None) -> str:
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    text = _BANNER.format(now=now, kind=kind, warning=warning)
    text += "metadata\ncurve\n"
    text += f'    public-key = "{public_key.decode("ascii")}"\n'
    if secret_key is not None:
        text += f'    secret-key = "{secret_key.decode("ascii")}"\n'
    return text


def generate_key_pair(directory: str | os.PathLike[str], name: str, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` (both 0600); return their paths."""
    validate_name(name, "key")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public_key, secret_key = zmq.curve_keypair()
    public_path = folder / f"{name}{PUBLIC_SUFFIX}"
    secret_path = folder / f"{name}{SECRET_SUFFIX}"
    _write_exclusive(secret_path, _certificate("**Secret**", "DO NOT PROVIDE THIS FILE TO OTHER USERS.",
                                               public_key, secret_key), overwrite)
    _write_exclusive(public_path, _certificate("Public", "Share this file with the cluster operator.",
                                               public_key, None), overwrite)
    return public_path, secret_path


def load_key_pair(path: str | os.PathLike[str]) -> KeyPair:
    """Load ``NAME.key_secret`` (both keys) or ``NAME.key`` (public only)."""
    target = Path(path)
    if not target.exists():
        raise InvalidRequestError(f"key file {target} does not exist")
    try:
        public_key, secret_key = zmq.auth.load_certificate(target)
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(f"cannot read key file {target}: {exc}") from None
    if public_key is None:
        raise InvalidRequestError(f"key file {target} holds no public key")
    if secret_key is not None:
        warn_if_others_may_read(target, "secret key")
    return KeyPair(validate_public_key(public_key), secret_key)


def warn_if_others_may_read(path: Path, what: str) -> None:
    """Warn when a file holding a secret may be read or written by other
    users, as ssh does for a private key; a warning, not a refusal, so a key mounted with
    another mode into a container still works."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # its read said why already
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s file %s has mode %o: other users may read it; chmod 600 %s", what, path,
                    stat.S_IMODE(mode), path)


def read_public_key(value: str) -> bytes:
    """``--key`` takes a Z85 key or a path to a ``.key``/``.key_secret`` file."""
    if len(value) == Z85_KEY_CHARS and not Path(value).exists():
        return validate_public_key(value)
    return load_key_pair(value).public_key
