"""The node's metrics: event counters, the snapshot collector, and the HTTP endpoint
(a real HTTP server on a free loopback port, scraped with urllib)."""

from __future__ import annotations

import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fabric import errors
from fabric.protocol.apis import ApiKey
from nodes.metrics import NodeMetrics, PartitionSample, Snapshot


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_endpoint_serves_events_and_state(tmp_path: object) -> None:
    metrics = NodeMetrics(node_id=2)
    metrics.client_address = "tcp://127.0.0.1:9092"
    url = metrics.start_http("127.0.0.1", 0)
    try:
        for _ in range(3):
            metrics.observe_request(ApiKey.PRODUCE, 0.002, 1_000)
            metrics.observe_response(ApiKey.PRODUCE, [], 40)
        metrics.observe_request(ApiKey.PRODUCE, 0.001, 500)
        metrics.observe_response(ApiKey.PRODUCE, [errors.NotEnoughReplicasError.code], 30)  # a refusal
        metrics.latest = Snapshot(
            partitions=(
                PartitionSample("events", 0, True, 3, 10, 110, 100, 4096, replicas=3, isr_size=2, min_insync=2,
                                follower_lag=((1, 0), (3, 37))),
                PartitionSample("events", 1, False, 1, 0, 50, 50, 2048),
            ),
            offline_partitions=0, parked_fetches=4, pending_produces=1, is_controller=True)
        with urllib.request.urlopen(url, timeout=10) as response:
            got = samples(response.read().decode())
    finally:
        metrics.stop()
    produce = (("api", "PRODUCE"),)
    assert got[("fabric_requests_total", produce)] == 4
    assert got[("fabric_request_duration_seconds_count", produce)] == 4
    assert got[("fabric_request_errors_total", (("api", "PRODUCE"), ("error", "NOT_ENOUGH_REPLICAS")))] == 1
    assert got[("fabric_received_bytes_total", ())] == 3_500 and got[("fabric_sent_bytes_total", ())] == 150
    p0, p1 = (("partition", "0"), ("topic", "events")), (("partition", "1"), ("topic", "events"))
    assert got[("fabric_partition_log_end_offset", p0)] == 110 and got[("fabric_partition_high_watermark", p0)] == 100
    assert got[("fabric_partition_log_start_offset", p0)] == 10 and got[("fabric_partition_size_bytes", p1)] == 2048
    assert got[("fabric_partition_leader", p0)] == 1 and got[("fabric_partition_leader", p1)] == 0
    assert got[("fabric_partition_under_replicated", p0)] == 1 and ("fabric_partition_isr_size", p1) not in got
    assert got[("fabric_partition_below_min_insync", p0)] == 0
    assert got[("fabric_replica_lag_messages", (("follower", "3"), *p0))] == 37
    assert got[("fabric_leader_partitions", ())] == 1 and got[("fabric_under_replicated_partitions", ())] == 1
    assert got[("fabric_offline_partitions", ())] == 0 and got[("fabric_controller", ())] == 1
    assert got[("fabric_parked_fetches", ())] == 4
    assert got[("fabric_node_info", (("address", "tcp://127.0.0.1:9092"), ("node", "2")))] == 1


def test_stop_frees_the_port() -> None:
    metrics = NodeMetrics(node_id=1)
    url = metrics.start_http("127.0.0.1", 0)
    metrics.stop()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    again = NodeMetrics(node_id=1)
    try:
        again.start_http("127.0.0.1", port)  # would raise EADDRINUSE if the first still held it
    finally:
        again.stop()


def test_errors_of_every_item_shape_are_counted() -> None:
    """PRODUCE answers per partition in ``results``, which was not read: a produce refused
    with NOT_ENOUGH_REPLICAS never showed in fabric_request_errors_total."""
    from nodes.metrics import response_error_codes

    refused = errors.NotEnoughReplicasError.code
    assert response_error_codes({"results": [{"error": refused}, {"error": 0}]}) == [refused]
    assert response_error_codes({"partitions": [{"error": 3}], "error": 0}) == [3]
    assert response_error_codes({"error": 5, "topics": [{"error": 7}]}) == [5, 7]


def test_the_snapshot_takes_each_partitions_size_from_its_log_without_walking_its_batches() -> None:
    """Once a second for every partition: a walk of the batches cost in proportion to all
    the data a node holds (docs/BENCHMARKS.md, "Many partitions")."""
    from collections.abc import Iterator
    from types import SimpleNamespace

    from nodes.metrics import snapshot

    class Unwalkable(list[object]):
        def __iter__(self) -> Iterator[object]:
            raise AssertionError("walked every batch")

    plog = SimpleNamespace(log_start_offset=0, log_end_offset=90, high_watermark=90, total_bytes=12_345,
                           entries=Unwalkable([object()] * 3))
    node = SimpleNamespace(logs={("t", 0): plog}, states={}, leaders={}, configs={}, is_controller=False, queues=None,
                           groups=None, parked={}, pending={})
    assert [sample.size_bytes for sample in snapshot(node).partitions] == [12_345]


def test_a_queue_nobody_reads_has_depth_series_with_group_empty_and_no_finished_counters() -> None:
    metrics = NodeMetrics(node_id=1)
    metrics.latest = Snapshot(queues=(("dlq", 0, "", (("visible", 7),)), ("q", 0, "g", (("visible", 3),))))
    got = samples(generate_latest(metrics.registry).decode())
    dlq = [(name, dict(labels)) for name, labels in got if dict(labels).get("queue") == "dlq"]
    assert sorted((name, labels["state"]) for name, labels in dlq) == [
        ("fabric_queue_messages", "delayed"), ("fabric_queue_messages", "in_flight"), ("fabric_queue_messages", "visible")]
    assert got[("fabric_queue_messages", (("group", ""), ("partition", "0"), ("queue", "dlq"), ("state", "visible")))] == 7
    assert ("fabric_queue_finished_total", (("group", "g"), ("outcome", "dropped"), ("partition", "0"),
                                            ("queue", "q"))) in got
