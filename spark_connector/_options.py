"""Option parsing for the ``fabric`` data source: strings in, typed values out.

Nothing here touches Spark or the network, so every rule (which options combine, what an
offsets JSON may contain, how a range is split) is unit-testable in milliseconds. The
option names mirror Spark's Kafka connector so that a Kafka job ports by renaming the
format and the bootstrap option.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fabric.bootstrap import resolve_bootstrap
from fabric.errors import ConfigError
from sdk import TopicPartition

EARLIEST = -2  # in offsets JSON, as in Kafka's connector
LATEST = -1
MAX_RECORDS_PER_PARTITION_DEFAULT = 500_000  # one Spark task reads at most this many records
POLL_TIMEOUT_MS_DEFAULT = 120_000  # a task that gets no record for this long fails

OffsetsSpec = str | dict[str, dict[int, int]]  # "earliest", "latest" or {topic: {partition: offset}}


class FabricOptionError(ValueError):
    """An option of the ``fabric`` data source is missing, unknown in combination, or malformed."""


class DataLossError(RuntimeError):
    """Offsets a query still needed were deleted (retention) or the partition went backwards."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    # Spark hands a case-insensitive dict; plain dicts (unit tests) are matched by lower case too.
    value = options.get(name)
    if value is None:
        lowered = {k.lower(): v for k, v in options.items()}
        value = lowered.get(name.lower())
    return value


READ_OPTIONS = ("bootstrap", "zk", "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets",
                "maxOffsetsPerTrigger", "maxRecordsPerPartition", "minPartitions", "includeHeaders", "includeGlobalId",
                "failOnDataLoss", "pollTimeoutMs")
WRITE_OPTIONS = ("bootstrap", "zk", "topic", "acks", "compression", "lingerMs", "batchBytesMax", "exactlyOnce", "sinkId")
SPARK_OPTIONS = ("path", "checkpointLocation", "queryName")  # Spark passes these itself (load(path), writeStream)


def check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    """Refuse an option this side does not use: a misspelt ``startingOffset`` silently read
    from the default (a stream: latest) instead of failing."""
    allowed = {name.lower(): name for name in (*known, *SPARK_OPTIONS)}
    for name in options:
        lowered = str(name).lower()
        if lowered in allowed or lowered.startswith("__"):  # "__": Spark's internal options
            continue
        if lowered == "kafka.bootstrap.servers":
            hint = "fabric's is option bootstrap ('zk://host:port' or 'tcp://host:port,...')"
        elif lowered.startswith("kafka."):
            hint = "fabric takes no kafka.* client settings"
        else:
            close = difflib.get_close_matches(lowered, list(allowed), n=1, cutoff=0.6)
            hint = f"did you mean {allowed[close[0]]}?" if close else f"the {what} options are {', '.join(known)}"
        raise FabricOptionError(f"unknown {what} option {name!r}: {hint}")


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise FabricOptionError(f"option {name} must be true or false, got {raw!r}")


def parse_int(options: Mapping[str, str], name: str, default: int, *, minimum: int = 1) -> int:
    value = parse_optional_int(options, name, minimum=minimum)
    return default if value is None else value


def parse_optional_int(options: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise FabricOptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise FabricOptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def bootstrap_from(options: Mapping[str, str]) -> str:
    """``bootstrap`` (``zk://h:p/chroot`` or ``tcp://h:p,...``) or ``zk`` (``h:p/chroot``);
    neither: ``$FABRIC_BOOTSTRAP``, else the cluster ``fabric up`` recorded, as the SDK does
    (fabric/bootstrap.py). Read on the driver, where the options are parsed: the tasks get
    the address it found, never their own machine's environment."""
    bootstrap = _get(options, "bootstrap")
    zk = _get(options, "zk")
    for name, value in (("bootstrap", bootstrap), ("zk", zk)):
        # Given but empty (an unset variable in the job's code) is a mistake, not "find one":
        # the job would quietly reach whatever cluster the driver's environment names.
        if value is not None and not str(value).strip():
            raise FabricOptionError(f"option {name} is empty: give an address, or leave the option out "
                                    "for $FABRIC_BOOTSTRAP, else the cluster `fabric up` recorded")
    if bootstrap and zk:
        raise FabricOptionError("give either option bootstrap or option zk, not both")
    if bootstrap:
        return bootstrap.strip()
    if zk:
        zk = zk.strip()
        return zk if zk.startswith("zk://") else f"zk://{zk}"
    try:
        return resolve_bootstrap(None)[0].strip()
    except ConfigError as exc:
        # The SDK's message names the CLI's --bootstrap: say it in this connector's terms.
        path, pid = exc.fields.get("state_file"), exc.fields.get("pid")
        found = (f"the cluster `fabric up` recorded in {path} (pid {pid}) is not running" if pid is not None
                 else f"the driver has no $FABRIC_BOOTSTRAP, and no `fabric up` record in {path}")
        raise FabricOptionError(
            "option bootstrap is required, e.g. .option('bootstrap', 'zk://127.0.0.1:2181') "
            f"or .option('zk', '127.0.0.1:2181/chroot'): {found}"
        ) from None


@dataclass(frozen=True)
class TopicSelection:
    """Exactly one of subscribe, subscribePattern, assign."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def describe(self) -> str:
        if self.pattern is not None:
            return f"subscribePattern={self.pattern!r}"
        if self.assigned:
            return "assign=" + ",".join(str(tp) for tp in self.assigned)
        return "subscribe=" + ",".join(self.topics)


def parse_selection(options: Mapping[str, str]) -> TopicSelection:
    given = {name: _get(options, name) for name in ("subscribe", "subscribePattern", "assign")}
    present = [name for name, value in given.items() if value is not None]
    if len(present) != 1:
        raise FabricOptionError(
            "give exactly one of the options subscribe, subscribePattern, assign"
            + (f" (got {', '.join(present)})" if present else "")
        )
    name = present[0]
    raw = str(given[name])
    if name == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise FabricOptionError("option subscribe names no topic")
        return TopicSelection(topics=topics)
    if name == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise FabricOptionError(f"option subscribePattern is not a valid regular expression: {exc}") from None
        return TopicSelection(pattern=raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise FabricOptionError(f'option assign is not valid JSON ({exc}); expected {{"topic": [0, 1]}}') from None
    if not isinstance(data, dict) or not data:
        raise FabricOptionError(f'option assign must be a JSON object like {{"topic": [0, 1]}}, got {raw!r}')
    tps: list[TopicPartition] = []
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not all(isinstance(p, int) and p >= 0 for p in partitions):
            raise FabricOptionError(f"option assign: topic {topic!r} needs a list of partition numbers, got {partitions!r}")
        tps.extend(TopicPartition(topic, p) for p in partitions)
    return TopicSelection(assigned=tuple(sorted(set(tps), key=lambda tp: (tp.topic, tp.partition))))


def parse_offsets(options: Mapping[str, str], name: str, default: str) -> OffsetsSpec:
    """``earliest``, ``latest`` or JSON ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)."""
    raw = _get(options, name)
    if raw is None:
        return default
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FabricOptionError(
            f"option {name} must be earliest, latest or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}; it is not valid JSON ({exc}): {raw!r}'
        ) from None
    if not isinstance(data, dict) or not data:
        raise FabricOptionError(f'option {name} must be a JSON object like {{"topic": {{"0": 23}}}}, got {raw!r}')
    out: dict[str, dict[int, int]] = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, dict):
            raise FabricOptionError(f"option {name}: topic {topic!r} needs an object of partition: offset, got {partitions!r}")
        parsed: dict[int, int] = {}
        for key, offset in partitions.items():
            try:
                partition = int(key)
            except (TypeError, ValueError):
                raise FabricOptionError(f"option {name}: {topic!r} has partition {key!r}, not a number") from None
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST or partition < 0:
                raise FabricOptionError(
                    f"option {name}: {topic}/{key} has offset {offset!r}; use an offset >= 0, -2 (earliest) or -1 (latest)"
                )
            parsed[partition] = offset
        out[topic] = parsed
    return out


def check_spec_covers(name: str, spec: OffsetsSpec, tps: list[TopicPartition]) -> None:
    """A JSON spec must name every selected partition and nothing else (as Kafka's connector)."""
    if isinstance(spec, str):
        return
    named = {TopicPartition(t, p) for t, parts in spec.items() for p in parts}
    selected = set(tps)
    missing = sorted(selected - named, key=lambda tp: (tp.topic, tp.partition))
    extra = sorted(named - selected, key=lambda tp: (tp.topic, tp.partition))
    if extra:
        raise FabricOptionError(f"option {name} names partitions that are not selected: {', '.join(map(str, extra))}")
    if missing:
        raise FabricOptionError(
            f"option {name} gives specific offsets, so it must name every selected partition; "
            f"missing: {', '.join(map(str, missing))}"
        )


def spec_offset(spec: OffsetsSpec, tp: TopicPartition) -> int:
    """The offset a spec asks for (EARLIEST or LATEST for the named forms)."""
    if spec == "earliest":
        return EARLIEST
    if spec == "latest":
        return LATEST
    if isinstance(spec, dict):
        return spec[tp.topic][tp.partition]
    raise FabricOptionError(f"bad offsets spec {spec!r}")


# -- streaming offsets as JSON-able dicts ------------------------------------------------------
def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """{topic: {"partition": offset}}, topics and partitions in sorted (string) order.

    Spark compares offsets by their JSON text, so the same positions must always serialise
    to the same string: the dicts are built in sorted key order.
    """
    by_topic: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets, key=lambda tp: (tp.topic, str(tp.partition))):
        by_topic.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return by_topic


def offsets_from_json(data: Mapping[str, Any]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for topic, partitions in data.items():
        for partition, offset in partitions.items():
            out[TopicPartition(topic, int(partition))] = int(offset)
    return out


# -- planning -------------------------------------------------------------------------------
def split_range(start: int, end: int, max_records: int) -> list[tuple[int, int]]:
    """[start, end) cut into nearly equal pieces of at most ``max_records`` records."""
    if end <= start:
        return []
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    total = end - start
    pieces = -(-total // max_records)
    return [(start + total * i // pieces, start + total * (i + 1) // pieces) for i in range(pieces)]


def rate_limit(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int], max_records: int
) -> dict[TopicPartition, int]:
    """End offsets that advance at most ``max_records`` in total, split across partitions in
    proportion to what each has available (Kafka's rule), in a deterministic way.

    Every partition with data gets its proportional share rounded down; the records left
    over by rounding go one each to partitions in sorted order, so the sum is exactly
    ``min(max_records, available)`` and progress never stalls.
    """
    available = {tp: max(0, end[tp] - start.get(tp, end[tp])) for tp in end}
    total = sum(available.values())
    if total <= max_records:
        return dict(end)
    order = sorted(end, key=lambda tp: (tp.topic, tp.partition))
    share = {tp: available[tp] * max_records // total for tp in order}
    left = max_records - sum(share.values())
    for tp in order:
        if left == 0:
            break
        if share[tp] < available[tp]:
            share[tp] += 1
            left -= 1
    return {tp: start.get(tp, end[tp]) + share[tp] for tp in order}
