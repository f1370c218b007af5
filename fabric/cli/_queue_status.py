"""The queues section of ``fabric status``: each queue's depth per consuming group."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from fabric.wording import plural

if TYPE_CHECKING:
    from fabric.cli.status import Status

QUEUES_DESCRIBED_MAX: Final[int] = 50  # more are counted, not described (one request per leader each)


def add_queues(status: Status, bootstrap_value: str, timeout_ms: int) -> None:
    """Depth is shown, not judged: a backlog is not a cluster fault."""
    from fabric import errors
    from sdk import Admin

    if not any(n["up"] for n in status.nodes):
        return
    try:
        with Admin(bootstrap_value, request_timeout_ms=timeout_ms) as admin:
            names = admin.list_queues()
            status.queues = []
            for name in names[:QUEUES_DESCRIBED_MAX]:
                try:
                    for group, desc in admin.describe_queue_groups(name, timeout_s=timeout_ms / 1000.0).items():
                        status.queues.append({
                            "queue": name, "group": group, "visible": desc.total("visible"),
                            "in_flight": desc.total("in_flight"), "delayed": desc.total("delayed"),
                            "dead_lettered": desc.total("dead_lettered"), "oldest_age_ms": desc.oldest_age_ms})
                except errors.FabricError as exc:
                    status.queues.append({"queue": name, "group": None, "error": exc.message})
            if len(names) > QUEUES_DESCRIBED_MAX:
                status.queues_error = f"{plural(len(names) - QUEUES_DESCRIBED_MAX, 'more queue')} not described"
    except errors.FabricError as exc:
        status.queues_error = f"queues unavailable: {exc.message}"


def queue_lines(status: Status) -> list[str]:
    if status.queues is None:
        return []
    count = len({q["queue"] for q in status.queues})
    lines = [f"queues      {count}" + (f" ({status.queues_error})" if status.queues_error else "")]
    for q in status.queues:
        lines.append(_line(q))
    return lines


def _line(q: dict[str, Any]) -> str:
    if q.get("error"):
        return f"  {q['queue']:<28}  ({q['error']})"
    age = f"{q['oldest_age_ms'] / 1000:.1f}s" if q["oldest_age_ms"] >= 0 else "-"
    group = q["group"] or "(no consumer yet)"
    return (f"  {q['queue']:<28}  group {group:<18}  visible {q['visible']:>7,}  in flight {q['in_flight']:>6,}  "
            f"delayed {q['delayed']:>6,}  dead {q['dead_lettered']:>5,}  oldest {age}")
