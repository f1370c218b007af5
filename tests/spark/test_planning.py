"""Option parsing and offset planning, without Spark or a cluster (fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from sdk import TopicPartition
from spark_connector import _options as opts
from spark_connector._source import FabricBatchReader, FabricDataSource, FabricStreamReader
from spark_connector._writer import producer_id_for

pytestmark = pytest.mark.spark

A0, A1, A2, B0 = (TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("a", 2), TopicPartition("b", 0))


def test_offsets_json_is_sorted_and_round_trips() -> None:
    offsets = {B0: 5, TopicPartition("a", 10): 1, A1: 7, TopicPartition("a", 2): 3}
    text = json.dumps(opts.offsets_to_json(offsets))
    assert text == '{"a": {"1": 7, "10": 1, "2": 3}, "b": {"0": 5}}'
    assert opts.offsets_from_json(json.loads(text)) == offsets


def test_parse_offsets_forms_and_errors() -> None:
    assert opts.parse_offsets({}, "startingOffsets", "latest") == "latest"
    assert opts.parse_offsets({"startingOffsets": " Earliest "}, "startingOffsets", "latest") == "earliest"
    assert opts.parse_offsets({"startingoffsets": '{"t": {"0": 23, "1": -2}}'}, "startingOffsets", "latest") == \
        {"t": {0: 23, 1: -2}}
    for bad, message in (('{"t": {"0": -3}}', "offset -3"), ('{"t": [1]}', "object of partition"),
                         ("{", "not valid JSON"), ('{"t": {"0": true}}', "offset True")):
        with pytest.raises(opts.FabricOptionError, match=message):
            opts.parse_offsets({"startingOffsets": bad}, "startingOffsets", "latest")


def test_selection_needs_exactly_one_form() -> None:
    assert opts.parse_selection({"subscribe": "b, a,b"}).topics == ("b", "a")
    assert opts.parse_selection({"assign": '{"t": [1, 0]}'}).assigned == (TopicPartition("t", 0), TopicPartition("t", 1))
    with pytest.raises(opts.FabricOptionError, match="exactly one"):
        opts.parse_selection({"subscribe": "a", "subscribePattern": "a.*"})
    with pytest.raises(opts.FabricOptionError, match="exactly one"):
        opts.parse_selection({})
    with pytest.raises(opts.FabricOptionError, match="regular expression"):
        opts.parse_selection({"subscribePattern": "("})


def test_bootstrap_and_batch_offset_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRIC_BOOTSTRAP", raising=False)  # nothing to find: no address given is refused
    monkeypatch.setenv("FABRIC_HOME", str(tmp_path))
    assert opts.bootstrap_from({"zk": "h:1/c"}) == "zk://h:1/c"
    with pytest.raises(opts.FabricOptionError, match="bootstrap is required"):
        opts.bootstrap_from({})
    base = {"bootstrap": "zk://h:1", "subscribe": "t"}
    with pytest.raises(opts.FabricOptionError, match="not allowed in a batch"):
        FabricBatchReader({**base, "startingOffsets": "latest"}, None)  # type: ignore[arg-type]
    with pytest.raises(opts.FabricOptionError, match="not allowed in a batch"):
        FabricBatchReader({**base, "endingOffsets": '{"t": {"0": -2}}'}, None)  # type: ignore[arg-type]
    stream_reader = FabricStreamReader({**base, "endingOffsets": "latest"}, None)  # type: ignore[arg-type]
    with pytest.raises(opts.FabricOptionError, match="for batch queries"):  # by its first call (docs/SPARK.md)
        stream_reader.getDefaultReadLimit()
    FabricDataSource({**base, "endingOffsets": "latest"}).schema()  # load() cannot tell a stream from a batch


def test_split_range() -> None:
    assert opts.split_range(0, 10, 4) == [(0, 3), (3, 6), (6, 10)]
    assert opts.split_range(5, 6, 100) == [(5, 6)]
    assert opts.split_range(5, 5, 100) == []


def test_rate_limit_is_proportional_exact_and_deterministic() -> None:
    start = {A0: 0, A1: 100, B0: 0}
    end = {A0: 30, A1: 110, B0: 0}
    limited = opts.rate_limit(start, end, 12)
    assert sum(limited[tp] - start[tp] for tp in start) == 12
    assert limited == {A0: 9, A1: 103, B0: 0}
    assert opts.rate_limit(start, end, 1000) == end
    assert opts.rate_limit({A0: 0, A1: 0}, {A0: 1, A1: 1}, 1) == {A0: 1, A1: 0}  # never stalls


def test_producer_id_is_stable_62_bit_and_distinct() -> None:
    ids = {producer_id_for("sink", b, p) for b in range(50) for p in range(20)}
    assert len(ids) == 1000
    assert all(0 <= i < 2**62 for i in ids)
    assert producer_id_for("sink", 3, 4) == producer_id_for("sink", 3, 4) != producer_id_for("other", 3, 4)


class FakeView:
    """The driver's cluster view, scripted: partitions grow, the log end moves."""

    def __init__(self) -> None:
        self.tps = [A0, A1]
        self.begin = {A0: 0, A1: 0, A2: 4}
        self.end = {A0: 10, A1: 20, A2: 9}

    def partitions(self, selection: Any, *, missing_ok: bool = False) -> list[TopicPartition]:
        return list(self.tps)

    def earliest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.begin[tp] for tp in tps}

    def latest(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end[tp] for tp in tps}

    def node_addresses(self) -> tuple[str, ...]:
        return ("tcp://127.0.0.1:1",)

    def resolve(self, *args: Any) -> Any:
        from spark_connector._reader import _ClusterView

        return _ClusterView.resolve(self, *args)  # type: ignore[arg-type]

    def close(self) -> None:
        pass


def test_stream_reader_plans_new_partitions_from_earliest() -> None:
    reader = FabricStreamReader({"bootstrap": "zk://h:1", "subscribe": "a", "startingOffsets": "earliest",
                                 "maxOffsetsPerTrigger": "1000"}, None)  # type: ignore[arg-type]
    view = FakeView()
    reader._view = view  # type: ignore[assignment]
    assert reader.getDefaultReadLimit() == ReadMaxRows(1000)
    start = reader.initialOffset()
    assert start == {"a": {"0": 0, "1": 0}}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert json.dumps(end) == '{"a": {"0": 10, "1": 20}}'
    view.tps = [A0, A1, A2]  # a partition was added
    later = reader.latestOffset(end, ReadAllAvailable())
    assert later == {"a": {"0": 10, "1": 20, "2": 9}}
    parts = reader.partitions(end, later)
    assert [(p.partition, p.start, p.end) for p in parts] == [(2, 4, 9)]  # the new one, from its earliest
    assert "_view" in reader.__getstate__() and reader.__getstate__()["_view"] is None


def test_stream_reader_data_loss_when_a_partition_goes_back() -> None:
    reader = FabricStreamReader({"bootstrap": "zk://h:1", "subscribe": "a"}, None)  # type: ignore[arg-type]
    view = FakeView()
    reader._view = view  # type: ignore[assignment]
    with pytest.raises(opts.DataLossError, match="went back"):
        reader.latestOffset({"a": {"0": 50, "1": 0}}, ReadAllAvailable())
    lenient = FabricStreamReader({"bootstrap": "zk://h:1", "subscribe": "a", "failOnDataLoss": "false"},
                                 None)  # type: ignore[arg-type]
    lenient._view = view  # type: ignore[assignment]
    went_back = {"a": {"0": 50, "1": 0}}
    end = lenient.latestOffset(went_back, ReadAllAvailable())
    assert end == {"a": {"0": 10, "1": 20}}
    # What the recreated partition holds now is read from its earliest offset.
    assert [(p.partition, p.start, p.end) for p in lenient.partitions(went_back, end)] == [(0, 0, 10), (1, 0, 20)]


def test_unknown_and_misspelt_options_are_refused() -> None:
    """A misspelt option used to be ignored: ``startingOffset`` on a stream read from latest."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from spark_connector._writer import _WriteConfig

    base = {"bootstrap": "zk://h:1", "subscribe": "t"}
    with pytest.raises(opts.FabricOptionError, match="unknown read option 'startingOffset': did you mean startingOffsets"):
        FabricDataSource({**base, "startingOffset": "earliest"}).schema()  # load(), batch or stream
    with pytest.raises(opts.FabricOptionError, match="did you mean failOnDataLoss"):
        FabricBatchReader({**base, "failondatalos": "false"}, None)  # type: ignore[arg-type]
    with pytest.raises(opts.FabricOptionError, match="option bootstrap"):
        FabricBatchReader({"kafka.bootstrap.servers": "h:9092", "subscribe": "t"}, None)  # type: ignore[arg-type]
    with pytest.raises(opts.FabricOptionError, match="unknown read option 'topic'"):
        FabricBatchReader({**base, "topic": "t"}, None)  # type: ignore[arg-type]
    FabricBatchReader({**base, "path": "t", "__internal": "x"}, None)  # type: ignore[arg-type]  # Spark's own

    schema = StructType([StructField("value", BinaryType())])
    write = {"bootstrap": "zk://h:1", "topic": "t"}
    _WriteConfig({**write, "checkpointLocation": "/cp", "queryName": "q", "acks": "1", "compression": "none"}, schema)
    for bad, message in (({"kafka.acks": "all"}, "no kafka"), ({"subscribe": "t"}, "unknown write option 'subscribe'"),
                         ({"lingerMS": "5", "exactly_once": "true"}, "did you mean exactlyOnce"),
                         ({"acks": "2"}, "acks must be 0, 1 or all"), ({"compression": "gzip"}, "lz4 or none")):
        with pytest.raises(opts.FabricOptionError, match=message):
            _WriteConfig({**write, **bad}, schema)
