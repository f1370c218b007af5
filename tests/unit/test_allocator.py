"""The allocator settings apply once and can be turned off (fabric/allocator.py)."""

from __future__ import annotations

import subprocess
import sys


def test_tune_applies_and_env_turns_it_off() -> None:
    code = "from fabric import allocator; print(allocator.tune(), allocator.tune())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert on.stdout.split() in (["True", "True"], ["False", "False"])  # False only without glibc's mallopt
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**__import__("os").environ, "FABRIC_MALLOC_TUNING": "0"})
    assert off.stdout.split() == ["False", "False"]
