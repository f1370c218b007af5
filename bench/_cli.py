"""What every benchmark's command line shares.

* Argument types that refuse a bad count before anything starts: ``--messages -5`` used to
  start a cluster and end in a traceback (or in a run that measured nothing and exited 0).
  argparse turns the ``ArgumentTypeError`` into its one-line usage error, exit status 2.
* ``run(main)``: Ctrl-C ends a benchmark with one line and exit status 130, not a
  traceback. The ``with`` blocks unwind as usual, so clusters stop and temporary
  directories go.
* ``quiet_children()``: helper processes (a spawned consumer, a worker, a sink) started
  inside it ignore SIGINT, so a Ctrl-C at the terminal, which reaches the whole process
  group, does not print one traceback per child; the benchmark's own cleanup stops them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


def _number(text: str, kind: type, minimum: float, exclusive: bool) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if value != value or (value <= minimum if exclusive else value < minimum):  # NaN too
        bound = f"more than {minimum:g}" if exclusive else f"at least {minimum:g}"
        raise argparse.ArgumentTypeError(f"must be {bound}, not {text}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, 1, exclusive=False))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, 0, exclusive=False))


def positive_float(text: str) -> float:
    return float(_number(text, float, 0.0, exclusive=True))


def non_negative_float(text: str) -> float:
    return float(_number(text, float, 0.0, exclusive=False))


def positive_int_list(text: str) -> list[int]:
    """``100,1024``: one or more positive integers, comma-separated."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive integers like 1,4,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive integers like 1,4,16")
    return values


@contextlib.contextmanager
def quiet_children() -> Iterator[None]:
    """Processes started inside inherit SIGINT ignored (a spawned Python keeps it so)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def join_or_kill(procs: Iterable[Any], timeout_s: float = 30.0) -> None:
    """Wait for helper processes to end, then kill what is left. Called from a ``finally``
    while an exception (Ctrl-C) is on its way out, it does not wait: a helper that ignores
    SIGINT may be waiting for something that will not come."""
    wait_s = 0.0 if sys.exc_info()[0] is not None else timeout_s
    for proc in procs:
        proc.join(wait_s)
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def json_line(figures: Any, **kwargs: Any) -> str:
    """``json.dumps`` of the last line, with NaN and infinities (a failover that never
    finished, a peak not read) as null: ``NaN`` is not JSON, and strict readers (jq,
    JSON.parse) refuse the whole line."""
    def clean(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(item) for item in value]
        return value

    return json.dumps(clean(figures), allow_nan=False, **kwargs)


# How long a benchmark's reader waits for the records it expects, after the last one came:
# past it the run has no figure to give (a record was lost, or the cluster stalled).
READ_STALL_S_MAX = 120.0


class BenchError(Exception):
    """A run that cannot give its figure: one line on stderr, exit status 1."""


def read_stalled(count: int, want: int, last_progress_s: float) -> bool:
    """Whether a reader that has ``count`` of ``want`` records, the last of them at
    ``last_progress_s`` (``time.perf_counter()``, the clock the readers time with), must
    give up; raises BenchError if so."""
    if count < want and time.perf_counter() - last_progress_s > READ_STALL_S_MAX:
        raise BenchError(f"read {count:,} of {want:,} records, none for {READ_STALL_S_MAX:.0f} s")
    return count < want


def run(main: Callable[[], int | None]) -> None:
    """``sys.exit(main())``, with Ctrl-C reported in one line (exit status 130) and a run
    that cannot give its figure (BenchError) in one line (exit status 1)."""
    try:
        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = 130
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    sys.exit(code)
