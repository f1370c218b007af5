"""Argument checks of the SDK's public calls (Consumer, QueueConsumer, Admin).

Bad input is refused before anything is sent or opened, with TypeError (wrong type) or
ValueError (or the Fabric error the node would answer) naming the argument and its bound.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import SupportsIndex

from fabric.limits import I32_MAX, I64_MAX

__all__ = ["I32_MAX", "I64_MAX", "int_arg", "names_arg", "optional_str_arg", "str_arg"]



def int_arg(name: str, value: object, low: int, high: int, *, high_name: str = "",
            error: type[Exception] = ValueError) -> int:
    """``value`` as an int within [low, high]. bool is refused: ``partitions=True`` is a
    bug, not 1. ``high_name`` names the constant behind ``high`` in the message."""
    if type(value) is int:  # the common case, without the Protocol check below (~10 us)
        number = value
    elif isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    elif not isinstance(value, SupportsIndex):  # int and int-likes (numpy); not float or str
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.60}")
    else:
        number = operator.index(value)
    if not low <= number <= high:
        bound = f"{high_name} ({high})" if high_name else str(high)
        raise error(f"{name}={number} outside [{low}, {bound}]")
    return number


def str_arg(name: str, value: object, *, or_none: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str{' or None' if or_none else ''}, got {type(value).__name__} {value!r:.60}")
    return value


def optional_str_arg(name: str, value: object) -> str | None:
    return None if value is None else str_arg(name, value, or_none=True)


def names_arg(name: str, value: object) -> list[str]:
    """A list of names. A lone str is refused: iterating it would ask for each character."""
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a list of names, not a single {type(value).__name__} (write [{value!r:.60}])")
    if not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a list of names, got {type(value).__name__} {value!r:.60}")
    names = list(value)
    for item in names:
        str_arg(f"each of {name}", item)
    return names
