"""Fixtures every fault test shares."""

from __future__ import annotations

import pytest

from tests.fault.harness import seed_from_env


@pytest.fixture
def seed() -> int:
    """The run's seed, printed so that FABRIC_FAULT_SEED=<seed> reproduces the run."""
    value = seed_from_env()
    print(f"fault test seed={value} (reproduce with FABRIC_FAULT_SEED={value})")
    return value
