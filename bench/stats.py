"""Summaries that survive noisy machines: medians and percentiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in [0, 1]) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def latency_summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in samples_s]
    return {
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "p999_ms": round(percentile(ms, 0.999), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
        "samples": len(ms),
    }


def ended(times_s: Sequence[float]) -> tuple[list[float], int]:
    """The failover times that ended, and how many did not (NaN: no acknowledgement within
    the wait). Apart, because ``statistics.median`` and ``max`` over values holding a NaN
    answer by the order of the values (``max([3.0, nan])`` is 3.0): a failover that never
    ended could vanish from both figures."""
    done = [t for t in times_s if not math.isnan(t)]
    return done, len(times_s) - len(done)

