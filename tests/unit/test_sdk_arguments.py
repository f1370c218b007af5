"""Bad arguments to the SDK's Consumer, QueueConsumer and Admin: a clear TypeError,
ValueError or documented Fabric error, raised before anything is sent, changing nothing.

No cluster is needed: the objects are made against an address nobody listens on (they
connect lazily), and every check here fires before the first request. Where a call needs
a partition to be known, the routing map is filled in by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fabric import errors
from fabric.limits import FETCH_WAIT_MS_MAX, PARTITIONS_MAX, REPLICATION_FACTOR_MAX
from sdk import Admin, Consumer, QueueConsumer, TopicPartition
from sdk._client import PartitionMetadata, TopicMetadata
from sdk.consumer import I32_MAX, I64_MAX

NOBODY = "tcp://127.0.0.1:1"  # nothing listens here: any request would fail, slowly
TP = TopicPartition("t1", 0)


@pytest.fixture
def consumer() -> Iterator[Consumer]:
    c = Consumer(NOBODY)
    # Known partitions without a metadata request: t1 has partitions 0 and 1.
    c._meta.metadata.topics["t1"] = TopicMetadata(
        "t1", tuple(PartitionMetadata(p, 1, 0, (1,), (1,)) for p in range(2)), 1024)
    c.assign([TP], refresh=False)
    yield c
    c.close()


@pytest.fixture
def admin() -> Iterator[Admin]:
    a = Admin(NOBODY)
    yield a
    a.close()


@pytest.fixture
def queue_consumer() -> Iterator[QueueConsumer]:
    q = QueueConsumer(NOBODY, "q")
    yield q
    q.close()


# -- Consumer options --------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "value", "bound"), [
    ("fetch_max_wait_ms", FETCH_WAIT_MS_MAX + 1, "FETCH_WAIT_MS_MAX"),
    ("fetch_max_wait_ms", 100_000, "FETCH_WAIT_MS_MAX"),
    ("fetch_max_wait_ms", -1, "FETCH_WAIT_MS_MAX"),
    ("fetch_max_bytes", 0, str(I32_MAX)),
    ("fetch_max_bytes", 2**40, str(I32_MAX)),
    ("fetch_min_bytes", -1, str(I32_MAX)),
    ("partition_fetch_bytes_max", 0, str(I32_MAX)),
    ("request_timeout_ms", 0, str(I32_MAX)),
    ("auto_commit_interval_ms", -1, str(I32_MAX)),
    ("session_timeout_ms", 2**31, str(I32_MAX)),
    ("heartbeat_interval_ms", 0, str(I32_MAX)),
])
def test_consumer_refuses_out_of_range_options_naming_the_bound(option: str, value: int, bound: str) -> None:
    with pytest.raises(ValueError, match=rf"{option}={value} outside \[.*{bound}"):
        Consumer(NOBODY, **{option: value})


@pytest.mark.parametrize(("option", "value"), [
    ("fetch_max_wait_ms", "500"), ("fetch_max_bytes", 1.5), ("fetch_min_bytes", True),
    ("request_timeout_ms", None), ("tag_filter", 5), ("group_id", 5), ("group_instance_id", 5),
])
def test_consumer_refuses_options_of_the_wrong_type(option: str, value: Any) -> None:
    with pytest.raises(TypeError, match=option):
        Consumer(NOBODY, **{option: value})


def test_consumer_accepts_the_bounds_themselves() -> None:
    Consumer(NOBODY, fetch_max_wait_ms=FETCH_WAIT_MS_MAX, fetch_min_bytes=0, fetch_max_bytes=I32_MAX,
             partition_fetch_bytes_max=1, auto_commit_interval_ms=0).close()
    Consumer(NOBODY, fetch_max_wait_ms=0).close()


@pytest.mark.parametrize("bootstrap", ["garbage", "h:", "tcp://h", "h:0", "h:99999", "tcp://h:port",
                                       "zk://h", "zk://h:1,tcp://n:2"])
def test_malformed_bootstrap_is_refused_as_not_host_port(bootstrap: str) -> None:
    for make in (lambda: Consumer(bootstrap), lambda: Admin(bootstrap), lambda: QueueConsumer(bootstrap, "q")):
        with pytest.raises(ValueError, match=r"HOST:PORT|not both"):
            make()


@pytest.mark.parametrize("bootstrap", [5, b"h:1", ["h:1", 5]])  # None: found by itself
def test_bootstrap_of_the_wrong_type_is_a_type_error(bootstrap: Any) -> None:
    with pytest.raises(TypeError, match="bootstrap"):
        Consumer(bootstrap)


@pytest.mark.parametrize("bootstrap", ["h:1", "tcp://h:1,h2:2", "tcp://[::1]:5", "zk://h:2181",
                                       "zk://a:1,b:2/chroot", "ipc:///tmp/node.sock", ["tcp://h:1"]])
def test_well_formed_bootstraps_still_accepted(bootstrap: Any) -> None:
    Consumer(bootstrap).close()


# -- Consumer calls ----------------------------------------------------------------------------
@pytest.mark.parametrize(("partitions", "message"), [
    ("t1", "list of TopicPartition"),
    ([(5, 0)], "topic must be a str"),
    ([("t1", "0")], "partition must be an int"),
    ([("t1", True)], "partition must be an int"),
    ([TopicPartition("t1", "0")], "partition must be an int"),  # type: ignore[arg-type]
    (["t1"], "TopicPartition or a"),
    (TP, "list of TopicPartition"),
    (5, "list of TopicPartition"),
])
def test_assign_refuses_bad_partitions_and_keeps_the_assignment(consumer: Consumer, partitions: Any,
                                                                message: str) -> None:
    with pytest.raises(TypeError, match=message):
        consumer.assign(partitions)
    assert consumer.assignment() == [TP]


def test_assign_of_a_negative_or_huge_partition_is_unknown(consumer: Consumer) -> None:
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="no partition -1"):
        consumer.assign([("t1", -1)])
    with pytest.raises(ValueError, match="partition"):
        consumer.assign([("t1", 2**31)])
    assert consumer.assignment() == [TP]


@pytest.mark.parametrize("offset", [-5, -1, 2**63, 2**64])
def test_seek_refuses_offsets_outside_zero_to_i64(consumer: Consumer, offset: int) -> None:
    consumer.seek(TP, 7)
    with pytest.raises(ValueError, match=rf"offset={offset} outside \[0, {I64_MAX}\]"):
        consumer.seek(TP, offset)
    assert consumer.position(TP) == 7  # unchanged


@pytest.mark.parametrize("offset", ["7", 7.0, None, True])
def test_seek_refuses_offsets_that_are_not_ints(consumer: Consumer, offset: Any) -> None:
    with pytest.raises(TypeError, match="offset must be an int"):
        consumer.seek(TP, offset)


def test_seek_accepts_zero_and_the_i64_maximum(consumer: Consumer) -> None:
    consumer.seek(TP, I64_MAX)
    assert consumer.position(TP) == I64_MAX
    consumer.seek(TP, 0)
    assert consumer.position(TP) == 0


def test_position_and_seek_of_an_unassigned_partition_are_refused(consumer: Consumer) -> None:
    other = TopicPartition("t1", 1)
    with pytest.raises(errors.InvalidRequestError, match="t1/1 is not assigned"):
        consumer.position(other)
    with pytest.raises(errors.InvalidRequestError, match="not assigned"):
        consumer.seek(other, 0)
    with pytest.raises(errors.InvalidRequestError, match="not assigned"):
        consumer.seek_to_beginning(other)  # before any LIST_OFFSETS goes out


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"timeout_ms": "5"}, TypeError), ({"timeout_ms": float("nan")}, TypeError), ({"timeout_ms": True}, TypeError),
    ({"max_records": 0}, ValueError), ({"max_records": -1}, ValueError), ({"max_records": "10"}, TypeError),
])
def test_poll_refuses_bad_arguments(consumer: Consumer, kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=r"timeout_ms|max_records"):
        consumer.poll(**kwargs)
    with pytest.raises(error, match=r"timeout_ms|max_records"):
        consumer.poll_batches(**kwargs)


def test_poll_takes_a_float_timeout(consumer: Consumer) -> None:
    """A wait given as a float (``0.5 * 1000``) is a wait, as it always was."""
    assert consumer.poll(timeout_ms=0.0) == []
    assert consumer.poll_batches(timeout_ms=1.5) == []


def test_tag_filter_of_the_wrong_type(consumer: Consumer) -> None:
    with pytest.raises(TypeError, match="tag_filter must be a str or None"):
        consumer.set_tag_filter(5)  # type: ignore[arg-type]


def test_offsets_for_times_checks_before_asking(consumer: Consumer) -> None:
    with pytest.raises(TypeError, match="timestamps must be a dict"):
        consumer.offsets_for_times([TP])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timestamp=-1"):
        consumer.offsets_for_times({TP: -1})
    with pytest.raises(TypeError, match="list of TopicPartition"):
        consumer.beginning_offsets("t1")  # type: ignore[arg-type]


def test_commit_checks_offsets_before_anything_is_sent() -> None:
    c = Consumer(NOBODY, group_id="g1")
    try:
        with pytest.raises(ValueError, match="offset=-7"):
            c.commit({TP: -7})
        with pytest.raises(TypeError, match="offset must be an int"):
            c.commit({TP: "7"})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="commit metadata must be a str"):
            c.commit({TP: (7, 5)})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match="offsets must be a dict"):
            c.commit([TP])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="each of topics must be a str"):
            c.subscribe([5])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="pattern must be a str"):
            c.subscribe(pattern=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="listener"):
            c.subscribe(["t1"], listener=object())  # type: ignore[arg-type]
    finally:
        c.close()


# -- Admin -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"partitions": "3"}, TypeError, "partitions must be an int, got str"),
    ({"partitions": 2.5}, TypeError, "partitions must be an int, got float"),
    ({"partitions": True}, TypeError, "partitions must be an int, got bool"),
    ({"partitions": 2**31}, errors.InvalidPartitionsError, "PARTITIONS_MAX"),
    ({"partitions": PARTITIONS_MAX + 1}, errors.InvalidPartitionsError, "PARTITIONS_MAX"),
    ({"partitions": 0}, errors.InvalidPartitionsError, r"outside \[1"),
    ({"replication_factor": 2**15}, errors.InvalidReplicationFactorError, "REPLICATION_FACTOR_MAX"),
    ({"replication_factor": REPLICATION_FACTOR_MAX + 1}, errors.InvalidReplicationFactorError, "REPLICATION"),
    ({"replication_factor": -1}, errors.InvalidReplicationFactorError, r"outside \[1"),
    ({"replication_factor": "3"}, TypeError, "replication_factor must be an int"),
    ({"config": ["a"]}, TypeError, "config must be a dict"),
    ({"config": {5: "x"}}, TypeError, "each config name must be a str"),
    ({"config": {"retention_ms": None}}, TypeError, "config value is an int, bool, float or str, not NoneType"),
    ({"strict_order": True, "config": {"strict_order": "false"}}, errors.InvalidConfigError, "disagree"),
])
def test_create_topic_refuses_bad_arguments(admin: Admin, kwargs: dict[str, Any], error: type[Exception],
                                            message: str) -> None:
    with pytest.raises(error, match=message):
        admin.create_topic("t", **kwargs)


def test_topic_names_must_be_strings(admin: Admin) -> None:
    with pytest.raises(TypeError, match="name must be a str, got int"):
        admin.create_topic(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a str, got int"):
        admin.delete_topic(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name must be a str"):
        admin.create_partitions(5, 3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("total", "error"), [
    (2**31, errors.InvalidPartitionsError), (-1, errors.InvalidPartitionsError),
    (PARTITIONS_MAX + 1, errors.InvalidPartitionsError), ("4", TypeError), (4.0, TypeError),
])
def test_create_partitions_refuses_bad_totals(admin: Admin, total: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="total"):
        admin.create_partitions("t1", total)


@pytest.mark.parametrize(("names", "message"), [
    ("t1", "not a single str"), ([None], "each of names must be a str, got NoneType"), (5, "list of names"),
])
def test_describe_topics_wants_a_list_of_names(admin: Admin, names: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        admin.describe_topics(names)


def test_admin_request_timeout_must_be_positive() -> None:
    for value in (0, -1):
        with pytest.raises(ValueError, match="request_timeout_ms"):
            Admin(NOBODY, request_timeout_ms=value)


def test_other_admin_calls_check_their_arguments(admin: Admin) -> None:
    with pytest.raises(TypeError, match="replicas"):
        admin.reassign_partition("t1", 0, "12")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="node id"):
        admin.reassign_partition("t1", 0, [None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="topics"):
        admin.describe_replicas("t1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="group_id must be a str"):
        admin.describe_group(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offset=-1"):
        admin.reset_offsets("g1", "t1", to="offset", offset=-1)
    with pytest.raises(TypeError, match="each of partitions"):
        admin.reset_offsets("g1", "t1", to="earliest", partitions=["0"])  # type: ignore[list-item]


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"visibility_timeout_ms": -1}, errors.InvalidQueueConfigError),
    ({"max_deliveries": 0}, errors.InvalidQueueConfigError),
    ({"max_message_bytes": 10}, errors.InvalidConfigError),
    ({"visibility_timeout_ms": "5"}, TypeError),
    ({"partitions": 0}, errors.InvalidPartitionsError),
])
def test_create_queue_refuses_bad_settings_before_making_its_dead_letter_queue(
        admin: Admin, kwargs: dict[str, Any], error: type[Exception]) -> None:
    # Nothing is sent (no node listens at NOBODY): the dead-letter queue is not made either.
    with pytest.raises(error):
        admin.create_queue("jobs", dead_letter="jobs_dlq", **kwargs)
    with pytest.raises(errors.InvalidTopicError):
        admin.create_queue("bad name", dead_letter="jobs_dlq")


# -- QueueConsumer ------------------------------------------------------------------------------
def test_queue_settle_wants_queue_messages(queue_consumer: QueueConsumer) -> None:
    with pytest.raises(TypeError, match="QueueMessage"):
        queue_consumer.ack([1, 2])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="QueueMessage"):
        queue_consumer.ack("m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="QueueMessage"):
        queue_consumer.nack(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="QueueMessage"):
        queue_consumer.extend([], 1000)  # type: ignore[arg-type]


def test_queue_numbers_must_be_ints(queue_consumer: QueueConsumer) -> None:
    with pytest.raises(TypeError, match="max_messages"):
        queue_consumer.receive("5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="wait_ms"):
        queue_consumer.receive(5, 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay_ms"):
        queue_consumer.nack([], delay_ms="5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason"):
        queue_consumer.nack([], reason=5)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidReceiveWaitError):
        queue_consumer.receive(5, -1)  # the documented error, as before


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"queue": 5}, "queue must be a str"), ({"group": None}, "group must be a str"),
    ({"consumer_id": 5}, "consumer_id must be a str"), ({"visibility_timeout_ms": "5"}, "visibility_timeout_ms"),
])
def test_queue_consumer_options_of_the_wrong_type(kwargs: dict[str, Any], message: str) -> None:
    options: dict[str, Any] = {"queue": "q", **kwargs}
    with pytest.raises(TypeError, match=message):
        QueueConsumer(NOBODY, **options)
