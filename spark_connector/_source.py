"""The ``fabric`` DataSource: batch and streaming readers, batch and streaming writers."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from sdk import TopicPartition
from spark_connector import _options as opts
from spark_connector._reader import (
    DataLossError,
    FabricInputPartition,
    _ClusterView,
    plan_partitions,
    read_partition,
    read_schema,
)

log = logging.getLogger("fabric.spark")


class _ReadConfig:
    """The read options, parsed and checked once on the driver."""

    def __init__(self, options: Mapping[str, str], *, streaming: bool | None) -> None:
        """``streaming=None``: only the rules batch and stream reads share (load() checks
        them before it knows which kind of query it serves)."""
        opts.check_known(options, opts.READ_OPTIONS, "read")
        self.bootstrap = opts.bootstrap_from(options)
        self.selection = opts.parse_selection(options)
        self.starting = opts.parse_offsets(options, "startingOffsets", "latest" if streaming else "earliest")
        self.ending = opts.parse_offsets(options, "endingOffsets", "latest")
        if streaming and opts._get(options, "endingOffsets") is not None:
            raise opts.FabricOptionError("option endingOffsets is for batch queries; a stream has no end")
        if streaming is False:
            if self.starting == "latest" or (isinstance(self.starting, dict) and _has(self.starting, opts.LATEST)):
                raise opts.FabricOptionError("startingOffsets latest (-1) is not allowed in a batch query: it would read nothing")
            if self.ending == "earliest" or (isinstance(self.ending, dict) and _has(self.ending, opts.EARLIEST)):
                raise opts.FabricOptionError("endingOffsets earliest (-2) is not allowed in a batch query: it would read nothing")
        self.include_headers = opts.parse_bool(options, "includeHeaders", False)
        self.include_global_id = opts.parse_bool(options, "includeGlobalId", False)
        self.fail_on_data_loss = opts.parse_bool(options, "failOnDataLoss", True)
        self.max_offsets_per_trigger = opts.parse_optional_int(options, "maxOffsetsPerTrigger")
        self.max_records_per_partition = opts.parse_int(
            options, "maxRecordsPerPartition", opts.MAX_RECORDS_PER_PARTITION_DEFAULT)
        self.min_partitions = opts.parse_optional_int(options, "minPartitions")
        self.poll_timeout_ms = opts.parse_int(options, "pollTimeoutMs", opts.POLL_TIMEOUT_MS_DEFAULT)

    def plan(self, view: _ClusterView, ranges: dict[TopicPartition, tuple[int, int]]) -> list[FabricInputPartition]:
        return plan_partitions(
            ranges, bootstrap=self.bootstrap, node_addresses=view.node_addresses() if ranges else (),
            include_headers=self.include_headers, fail_on_data_loss=self.fail_on_data_loss,
            poll_timeout_ms=self.poll_timeout_ms, max_records_per_partition=self.max_records_per_partition,
            min_partitions=self.min_partitions, include_global_id=self.include_global_id,
        )


def _has(spec: dict[str, dict[int, int]], value: int) -> bool:
    return any(v == value for parts in spec.values() for v in parts.values())


class FabricDataSource(DataSource):
    """``spark.read.format("fabric")`` and friends; see docs/SPARK.md for the options."""

    @classmethod
    def name(cls) -> str:
        return "fabric"

    def schema(self) -> StructType:
        # Spark asks for the schema in load(), for batch and stream reads alike: checking the
        # options here refuses a bad one at load(), as Kafka's source does. A stream's reader
        # is only made once the query runs, and PySpark's stream runner reports an exception
        # from its constructor under an UnboundLocalError of its own.
        config = _ReadConfig(self.options, streaming=None)
        return read_schema(config.include_headers, config.include_global_id)

    def reader(self, schema: StructType) -> DataSourceReader:
        self._check_schema(schema)
        return FabricBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self._check_schema(schema)
        return FabricStreamReader(self.options, schema)

    def _check_schema(self, schema: StructType) -> None:
        # A schema given with .schema(...) reaches the reader instead of ours; the tasks
        # return our columns anyway, and Spark's complaint ("Return schema mismatch")
        # does not say why. The Kafka source refuses it the same way.
        fixed = self.schema()
        if schema is not None and schema != fixed:
            raise opts.FabricOptionError(
                f"the fabric source has a fixed schema ({fixed.simpleString()}); drop .schema(...) "
                "and select or cast the columns after load()")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from spark_connector._writer import FabricBatchWriter

        if overwrite:  # a topic is append-only; "overwrite" used to append silently
            raise opts.FabricOptionError(
                "save mode overwrite is not supported: a fabric topic is append-only; use mode('append')")
        return FabricBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from spark_connector._writer import FabricStreamWriter

        return FabricStreamWriter(self.options, schema)


class FabricBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = _ReadConfig(options, streaming=False)

    def partitions(self) -> list[InputPartition]:
        config = self.config
        view = _ClusterView(config.bootstrap)
        try:
            tps = view.partitions(config.selection)
            opts.check_spec_covers("startingOffsets", config.starting, tps)
            opts.check_spec_covers("endingOffsets", config.ending, tps)
            earliest, latest = view.earliest(tps), view.latest(tps)
            start = view.resolve("startingOffsets", config.starting, tps, earliest, latest)
            end = view.resolve("endingOffsets", config.ending, tps, earliest, latest)
            for tp in tps:
                if start[tp] > end[tp]:
                    raise opts.FabricOptionError(
                        f"startingOffsets {start[tp]} is after endingOffsets {end[tp]} for {tp}")
            return list(config.plan(view, {tp: (start[tp], end[tp]) for tp in tps}))
        finally:
            view.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)


class FabricStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch offsets are ``{topic: {"partition": next offset}}`` in sorted key order.

    The instance runs in one long-lived Python process on the driver; its cluster view is
    created on first use and dropped when pickled, so nothing driver-only reaches a task.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        # load() has checked the options (FabricDataSource.schema); what is left is the rule
        # only a stream has (no endingOffsets). PySpark's stream runner cannot report an
        # exception raised here (its cleanup calls stop() on a reader that was never made, and
        # the user reads PySpark's UnboundLocalError last), so it is raised by the first call.
        try:
            self._config: _ReadConfig | str = _ReadConfig(options, streaming=True)
        except opts.FabricOptionError as exc:
            self._config = str(exc)
        self._view: _ClusterView | None = None
        self._available_now: dict[TopicPartition, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_view"] = None
        return state

    @property
    def config(self) -> _ReadConfig:
        if isinstance(self._config, str):
            raise opts.FabricOptionError(self._config)
        return self._config

    @property
    def view(self) -> _ClusterView:
        if self._view is None:
            self._view = _ClusterView(self.config.bootstrap)
        return self._view

    def initialOffset(self) -> dict:
        config = self.config
        tps = self.view.partitions(config.selection)
        opts.check_spec_covers("startingOffsets", config.starting, tps)
        earliest, latest = self.view.earliest(tps), self.view.latest(tps)
        return opts.offsets_to_json(self.view.resolve("startingOffsets", config.starting, tps, earliest, latest))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.config.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self.view.partitions(self.config.selection, missing_ok=True)
        self._available_now = self.view.latest(tps)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = opts.offsets_from_json(start)
        tps = self.view.partitions(self.config.selection, missing_ok=True)
        new = [tp for tp in tps if tp not in begin]
        if new:
            log.info("new partitions %s: reading them from earliest", ", ".join(map(str, new)))
        earliest = self.view.earliest(new)
        begin.update(earliest)
        latest = self.view.latest(tps)
        if self._available_now is not None:
            latest = {tp: min(off, self._available_now.get(tp, begin[tp])) for tp, off in latest.items()}
        for tp, off in latest.items():
            if off < begin[tp]:
                # Lenient: the batch ends at the new log end; partitions() reads what the
                # partition holds now, from its earliest offset.
                self._data_loss(f"{tp} went back from offset {begin[tp]} to {off} (was the topic recreated?)")
        gone = [tp for tp in begin if tp not in latest]
        if gone:
            self._data_loss(f"partitions {', '.join(map(str, gone))} disappeared (topic deleted?)")
        if isinstance(limit, ReadMaxRows):
            latest = opts.rate_limit(begin, latest, limit.max_rows)
        return opts.offsets_to_json(latest)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin = opts.offsets_from_json(start)
        stop = opts.offsets_from_json(end)
        went_back = [tp for tp, off in stop.items() if tp in begin and off < begin[tp]]
        for tp in went_back:
            self._data_loss(f"{tp}: the batch ends at {stop[tp]}, before its start {begin[tp]}")
        begin.update(self.view.earliest([tp for tp in stop if tp not in begin or tp in went_back]))
        ranges = {tp: (begin[tp], off) for tp, off in stop.items() if off > begin[tp]}
        return list(self.config.plan(self.view, ranges))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition)

    def _data_loss(self, message: str) -> None:
        if self.config.fail_on_data_loss:
            raise DataLossError(f"{message}. Set the option failOnDataLoss to false to log a warning and continue instead.")
        log.warning("%s; continuing because failOnDataLoss=false", message)

    def commit(self, end: dict) -> None:
        pass  # fabric keeps no consumer-group offsets for Spark: the checkpoint is the truth

    def stop(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None
