"""Percentiles (HdrHistogram), the markdown table and the PNG plots of the peers benchmark.

The JSON the benchmark prints is the source; the table and the plots are drawn from it
alone, so ``python -m bench.peers --replot results.json`` redraws them without a rerun.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

HISTOGRAM_LOWEST_US = 1
HISTOGRAM_HIGHEST_US = 600_000_000  # ten minutes: nothing in a benchmark run waits longer
HISTOGRAM_SIGNIFICANT_DIGITS = 3
PERCENTILES = (("p50_ms", 50.0), ("p99_ms", 99.0), ("p999_ms", 99.9))


def latency_summary(latencies_ns: Sequence[int]) -> dict[str, float]:
    """p50/p99/p99.9/max in milliseconds from an HdrHistogram of microseconds (3 significant
    digits: a reported 2.345 ms is within 0.1% of the sample it stands for)."""
    from hdrh.histogram import HdrHistogram

    histogram = HdrHistogram(HISTOGRAM_LOWEST_US, HISTOGRAM_HIGHEST_US, HISTOGRAM_SIGNIFICANT_DIGITS)
    for value_ns in latencies_ns:
        histogram.record_value(min(HISTOGRAM_HIGHEST_US, max(HISTOGRAM_LOWEST_US, value_ns // 1000)))
    if not latencies_ns:
        return {"samples": 0}
    out: dict[str, float] = {name: round(histogram.get_value_at_percentile(p) / 1000.0, 3) for name, p in PERCENTILES}
    out["max_ms"] = round(histogram.get_max_value() / 1000.0, 3)
    out["samples"] = len(latencies_ns)
    return out


def _fmt_rate(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, (int, float)) else "-"


def _fmt_latency(summary: dict[str, Any] | None) -> str:
    if not summary or not summary.get("samples"):
        return "-"
    return " / ".join(f"{summary[name]:.2f}" for name, _p in PERCENTILES)


def markdown(figures: dict[str, Any]) -> str:
    lines = [
        f"{figures['messages']:,} messages of {figures['message_bytes']} B, median of {figures['repeats']} "
        f"run(s); end to end at {figures['e2e_rate_per_s']:,} msg/s for {figures['e2e_seconds']} s; "
        f"{figures['requests']:,} sequential requests.",
        "",
        "| system | publish msg/s | consume msg/s | end-to-end p50 / p99 / p99.9 ms | durability |",
        "|---|---|---|---|---|",
    ]
    for row in figures["systems"].values():
        if row["status"] != "ok":
            lines.append(f"| {row['label']} | {row['status']} | | | {row.get('durability', '')} |")
            continue
        lines.append(f"| {row['label']} | {_fmt_rate(row.get('publish_msgs_per_s'))} | "
                     f"{_fmt_rate(row.get('consume_msgs_per_s'))} | {_fmt_latency(row.get('e2e'))} | "
                     f"{row['durability']} |")
    lines += ["", "| request-reply | p50 / p99 / p99.9 ms | max ms |", "|---|---|---|"]
    for row in figures["request_reply"].values():
        if row["status"] != "ok":
            lines.append(f"| {row['label']} | {row['status']} | |")
        else:
            lines.append(f"| {row['label']} | {_fmt_latency(row['latency'])} | {row['latency']['max_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def plots(figures: dict[str, Any], out_dir: Path) -> list[Path]:
    """Throughput bars and latency percentiles as two small PNGs."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server or in CI
    import matplotlib.pyplot as plt

    written: list[Path] = []
    rows = [r for r in figures["systems"].values() if r["status"] == "ok"]

    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=90)
    width = 0.38
    xs = range(len(rows))
    ax.bar([x - width / 2 for x in xs], [r["publish_msgs_per_s"] for r in rows], width, label="durable publish")
    ax.bar([x + width / 2 for x in xs], [r["consume_msgs_per_s"] for r in rows], width, label="consume")
    ax.set_xticks(list(xs), [r["label"] for r in rows], fontsize=8)
    ax.set_ylabel("messages per second")
    ax.set_title(f"{figures['message_bytes']}-byte messages, Python clients, one machine", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out_dir / "peers_throughput.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    names = [name for name, _p in PERCENTILES]
    for row in rows:
        if row.get("e2e", {}).get("samples"):
            left.plot(["p50", "p99", "p99.9"], [row["e2e"][n] for n in names], marker="o", label=row["label"])
    left.set_yscale("log")
    left.set_ylabel("milliseconds")
    left.set_title(f"end to end at {figures['e2e_rate_per_s']:,} msg/s", fontsize=9)
    left.legend(fontsize=7)
    left.grid(alpha=0.3, which="both")
    for row in figures["request_reply"].values():
        if row["status"] == "ok":
            right.plot(["p50", "p99", "p99.9"], [row["latency"][n] for n in names], marker="o", label=row["label"])
    right.set_yscale("log")
    right.set_title("request-reply round trip", fontsize=9)
    right.legend(fontsize=7)
    right.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path = out_dir / "peers_latency.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written
