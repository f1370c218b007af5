"""The C client against a live local cluster, both directions, checked record by record.

C producer -> Python consumer and Python producer -> C consumer, 100,000 records each way
with keys, headers and lz4; every record is compared by content, every partition by
order, and every key's partition with Python's choice. Smaller runs cover acks 0 and -1,
no compression, and the examples under valgrind.
"""

from __future__ import annotations

import random
import re
import shutil
import string
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabric.local import LocalCluster, free_port
from fabric.protocol.keyhash import partition_for_key
from sdk import Admin, Consumer, Producer, TopicPartition
from tests.interop.conftest import CClient

pytestmark = pytest.mark.interop

BIG_RUN_RECORDS = 100_000
SMALL_RUN_RECORDS = 5_000
VALGRIND_RECORDS = 300
PARTITIONS = 4
CONSUME_TIMEOUT_S = 120.0
PROCESS_TIMEOUT_S = 300.0

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Expected:
    key: bytes
    value: bytes
    headers: Headers


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    client = Admin(cluster.bootstrap)
    yield client
    close = getattr(client, "close", None)
    if close is not None:
        close()


@pytest.fixture(scope="module")
def node_addresses(admin: Admin) -> str:
    """The C client bootstraps from node addresses, not ZooKeeper."""
    return ",".join(admin.nodes().values())


def make_records(seed: int, count: int) -> list[Expected]:
    """Deterministic records. Values avoid tab and newline (the fabric-produce line format)."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "=,;:-_ "
    out = []
    for i in range(count):
        key = f"user-{rng.randrange(997)}".encode()
        value = f"v{i:07d}|".encode() + "".join(rng.choices(alphabet, k=rng.randrange(0, 80))).encode()
        headers: Headers = [("seq", str(i).encode()), ("src", b"c")]
        if i % 10 == 0:
            headers.append(("flag", None))
        if i % 7 == 0:
            headers.append(("empty", b""))
        out.append(Expected(key, value, headers))
    return out


def produce_lines(records: list[Expected]) -> bytes:
    """fabric-produce --key-sep TAB --line-headers: key, value, then name=value headers."""
    lines = []
    for r in records:
        fields = [r.key, r.value]
        fields += [n.encode() if v is None else n.encode() + b"=" + v for n, v in r.headers]
        lines.append(b"\t".join(fields))
    return b"\n".join(lines) + b"\n"


def seq_of(headers: Headers) -> int:
    for name, value in headers:
        if name == "seq" and value is not None:
            return int(value)
    raise AssertionError(f"record without a seq header: {headers}")


def consume_all_python(bootstrap: str, topic: str, partitions: int, count: int) -> list:
    consumer = Consumer(bootstrap)
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        records: list = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(records) < count and time.monotonic() < deadline:
            records += consumer.poll(500, 50_000)
        # A short extra poll: anything beyond `count` would be a duplicate.
        records += consumer.poll(200, 50_000)
        return records
    finally:
        consumer.close()


def check_c_produced(records: list, expected: list[Expected], partitions: int) -> None:
    assert len(records) == len(expected), f"got {len(records)} records, produced {len(expected)}"
    seen: set[int] = set()
    last_seq: dict[int, int] = defaultdict(lambda: -1)
    last_offset: dict[int, int] = defaultdict(lambda: -1)
    for rec in records:
        headers = [(n, None if v is None else bytes(v)) for n, v in rec.headers]
        seq = seq_of(headers)
        assert seq not in seen, f"duplicate record seq={seq}"
        seen.add(seq)
        want = expected[seq]
        assert bytes(rec.key) == want.key, seq
        assert bytes(rec.value) == want.value, seq
        assert headers == want.headers, seq
        # Same key, same partition as Python's partitioner.
        assert rec.partition == partition_for_key(want.key, partitions), seq
        # Per-partition order: the order of the input lines.
        assert rec.offset > last_offset[rec.partition]
        assert seq > last_seq[rec.partition], f"partition {rec.partition}: seq {seq} after {last_seq[rec.partition]}"
        last_offset[rec.partition] = rec.offset
        last_seq[rec.partition] = seq


def run_c_producer(c_client: CClient, bootstrap: str, topic: str, lines: bytes, *args: str,
                   wrapper: list[str] | None = None) -> subprocess.CompletedProcess[bytes]:
    argv = [*(wrapper or []), str(c_client.produce), "-b", bootstrap, "-t", topic,
            "--key-sep", "\t", "--line-headers", "-q", *args]
    return subprocess.run(argv, input=lines, capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)


def test_c_producer_to_python_consumer_100k(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                            node_addresses: str, topic_name: str) -> None:
    admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=2)
    expected = make_records(seed=1, count=BIG_RUN_RECORDS)
    run = run_c_producer(c_client, node_addresses, topic_name, produce_lines(expected),
                         "--acks", "1", "--compression", "lz4", "--linger-ms", "5")
    assert run.returncode == 0, run.stderr.decode()
    assert f"{BIG_RUN_RECORDS} acknowledged".encode() in run.stderr
    records = consume_all_python(cluster.bootstrap, topic_name, PARTITIONS, BIG_RUN_RECORDS)
    check_c_produced(records, expected, PARTITIONS)


@pytest.mark.parametrize(
    ("acks", "compression", "extra"),
    [
        ("-1", "none", ["--batch-bytes", "4096", "--linger-ms", "0"]),
        ("0", "lz4", ["--batch-bytes", "16384"]),
        ("all", "lz4", ["--linger-ms", "50"]),
    ],
)
def test_c_producer_settings(c_client: CClient, cluster: LocalCluster, admin: Admin, node_addresses: str,
                             topic_name: str, acks: str, compression: str, extra: list[str]) -> None:
    admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=2)
    expected = make_records(seed=2, count=SMALL_RUN_RECORDS)
    run = run_c_producer(c_client, node_addresses, topic_name, produce_lines(expected),
                         "--acks", acks, "--compression", compression, *extra)
    assert run.returncode == 0, run.stderr.decode()
    records = consume_all_python(cluster.bootstrap, topic_name, PARTITIONS, SMALL_RUN_RECORDS)
    check_c_produced(records, expected, PARTITIONS)


def test_c_producer_to_a_topic_smaller_than_its_batches(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                                        node_addresses: str, topic_name: str) -> None:
    """message_bytes_max 4096 against the default 256 KiB batches, uncompressed: every batch
    was refused as MESSAGE_TOO_LARGE; now they close at the topic's limit (as in Python)."""
    admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=2, config={"message_bytes_max": 4096})
    expected = make_records(seed=3, count=SMALL_RUN_RECORDS)
    run = run_c_producer(c_client, node_addresses, topic_name, produce_lines(expected),
                         "--compression", "none", "--linger-ms", "20")
    assert run.returncode == 0, run.stderr.decode()
    records = consume_all_python(cluster.bootstrap, topic_name, PARTITIONS, SMALL_RUN_RECORDS)
    check_c_produced(records, expected, PARTITIONS)


def test_c_producer_follows_a_lowered_message_bytes_max(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                                        node_addresses: str, topic_name: str) -> None:
    """The topic's limit lowered while fabric-produce runs: the batch on its way is refused
    (MESSAGE_TOO_LARGE), which makes the producer ask for metadata again, and its later
    batches close at the new limit. Before, every later batch was refused as well."""
    admin.create_topic(topic_name, partitions=1, replication_factor=2)
    argv = [str(c_client.produce), "-b", node_addresses, "-t", topic_name, "--compression", "none", "-l", "20", "-q"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        def feed(count: int) -> None:
            assert proc.stdin is not None
            proc.stdin.write(b"".join(random.randbytes(40).hex().encode() + b"\n" for _ in range(count)))
            proc.stdin.flush()
            time.sleep(1.0)  # sent and answered

        feed(2_000)
        admin.alter_topic_config(topic_name, {"message_bytes_max": 4096})
        time.sleep(0.5)
        for _ in range(3):
            feed(2_000)
        proc.stdin.close()
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        proc.wait(PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # At most the batch in flight at the change fails (one linger's worth of records).
    acknowledged = int(stderr.split(" acknowledged")[0].rsplit(" ", 1)[1])
    assert acknowledged >= 6_000, stderr
    with Consumer(cluster.bootstrap) as consumer:
        tp = TopicPartition(topic_name, 0)
        assert consumer.end_offsets([tp])[tp] == acknowledged


def parse_c_line(line: str) -> tuple[int, int, bytes | None, bytes | None, Headers]:
    """One fabric-consume --hex line: offset, timestamp, key, value, headers."""
    offset, timestamp, key, value, header_text = line.split("\t")
    headers: Headers = []
    if header_text:
        for item in header_text.split(","):
            name, eq, hex_value = item.partition("=")
            headers.append((name, bytes.fromhex(hex_value) if eq else None))
    return (int(offset), int(timestamp), None if key == "-" else bytes.fromhex(key),
            None if value == "-" else bytes.fromhex(value), headers)


def test_python_producer_to_c_consumer_100k(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                            node_addresses: str, topic_name: str) -> None:
    admin.create_topic(topic_name, partitions=PARTITIONS, replication_factor=2)
    expected = make_records(seed=3, count=BIG_RUN_RECORDS)
    base_ts = 1_700_000_000_000
    producer = Producer(cluster.bootstrap, acks=1, linger_ms=5, compression="lz4")
    try:
        futures = [producer.send(topic_name, r.value, key=r.key, headers=r.headers, timestamp_ms=base_ts + i)
                   for i, r in enumerate(expected)]
        producer.flush()
        metas = [f.result(60) for f in futures]
    finally:
        producer.close()
    by_partition: dict[int, dict[int, int]] = defaultdict(dict)  # partition -> offset -> seq
    for seq, meta in enumerate(metas):
        by_partition[meta.partition][meta.offset] = seq

    procs = {
        p: subprocess.Popen(
            [str(c_client.consume), "-b", node_addresses, "-t", topic_name, "-p", str(p),
             "-o", "beginning", "-c", str(len(by_partition[p])), "-i", "20000",
             "-F", "offset,timestamp,key,value,headers", "--hex"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for p in range(PARTITIONS)
    }
    for p, proc in procs.items():
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
        assert proc.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        offsets = by_partition[p]
        assert len(lines) == len(offsets), f"partition {p}: {len(lines)} lines, {len(offsets)} produced"
        for want_offset, line in enumerate(lines):
            offset, timestamp, key, value, headers = parse_c_line(line)
            assert offset == want_offset, f"partition {p}: offset {offset}, expected {want_offset}"
            seq = offsets[offset]
            want = expected[seq]
            assert (key, value, headers) == (want.key, want.value, want.headers), (p, offset)
            assert timestamp == base_ts + seq
            # Python's key hash put it here; the C hash (checked by the vectors) agrees.
            assert partition_for_key(want.key, PARTITIONS) == p

    # Start in the middle of a partition: the first batch may begin earlier; C skips ahead.
    middle = len(by_partition[0]) // 2 + 1
    run = subprocess.run([str(c_client.consume), "-b", node_addresses, "-t", topic_name, "-p", "0",
                          "-o", str(middle), "-c", "5", "-F", "offset"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert [int(x) for x in run.stdout.split()] == list(range(middle, middle + 5))


def test_bootstrap_skips_dead_address(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                      node_addresses: str, topic_name: str) -> None:
    admin.create_topic(topic_name, partitions=1, replication_factor=1)
    dead = f"tcp://127.0.0.1:{free_port()}"
    expected = make_records(seed=4, count=10)
    run = run_c_producer(c_client, f"{dead},{node_addresses}", topic_name, produce_lines(expected))
    assert run.returncode == 0, run.stderr.decode()
    check_c_produced(consume_all_python(cluster.bootstrap, topic_name, 1, 10), expected, 1)


def test_unknown_topic_is_a_clean_error(c_client: CClient, node_addresses: str, topic_name: str) -> None:
    run = run_c_producer(c_client, node_addresses, topic_name + "-missing", b"x\ty\n")
    assert run.returncode == 1
    assert b"UNKNOWN_TOPIC_OR_PARTITION" in run.stderr
    run = subprocess.run([str(c_client.consume), "-b", node_addresses, "-t", topic_name + "-missing",
                          "-p", "0", "-i", "1000"], capture_output=True, timeout=60, check=False)
    assert run.returncode == 1
    assert b"UNKNOWN_TOPIC_OR_PARTITION" in run.stderr


def test_c_clients_wait_for_a_partition_being_added(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                                     node_addresses: str, topic_name: str) -> None:
    """A partition past the topic's count is asked about again for up to
    PARTITION_LEARN_WAIT_MS (sdk/c/src/internal.h) before it is called unknown, in the C
    producer and consumer as in Python: one added a moment later is written and read."""
    admin.create_topic(topic_name, partitions=1, replication_factor=1)
    producer = subprocess.Popen([str(c_client.produce), "-b", node_addresses, "-t", topic_name, "-p", "2", "-q"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    consumer = subprocess.Popen([str(c_client.consume), "-b", node_addresses, "-t", topic_name, "-p", "2",
                                 "-o", "beginning", "-c", "1", "-i", "20000"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert producer.stdin is not None
        producer.stdin.write(b"late\n")  # sent at once: the producer finds one partition
        producer.stdin.flush()
        time.sleep(0.5)  # both have asked and found one partition
        admin.create_partitions(topic_name, 3)
        out, err = producer.communicate(timeout=PROCESS_TIMEOUT_S)
        assert producer.returncode == 0, err.decode()
        out, err = consumer.communicate(timeout=PROCESS_TIMEOUT_S)
        assert (consumer.returncode, out) == (0, b"late\n"), err.decode()
    finally:
        for process in (producer, consumer):
            if process.poll() is None:
                process.kill()
                process.wait()
    # A partition that does not come is still refused, after the wait.
    run = run_c_producer(c_client, node_addresses, topic_name, b"x\n", "-p", "3")
    assert run.returncode == 1 and b"UNKNOWN_TOPIC_OR_PARTITION" in run.stderr, run.stderr.decode()


def test_examples_clean_under_valgrind(c_client: CClient, cluster: LocalCluster, admin: Admin,
                                       node_addresses: str, topic_name: str) -> None:
    if c_client.sanitized:
        pytest.skip("FABRIC_C_SANITIZE: valgrind cannot run AddressSanitizer binaries (the sanitizers check them instead)")
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed (apt-get install -y valgrind)")
    wrapper = [valgrind, "-q", "--leak-check=full", "--show-leak-kinds=definite,indirect,possible",
               "--errors-for-leak-kinds=definite,indirect,possible", "--error-exitcode=99"]
    admin.create_topic(topic_name, partitions=2, replication_factor=1)
    expected = make_records(seed=5, count=VALGRIND_RECORDS)
    run = run_c_producer(c_client, node_addresses, topic_name, produce_lines(expected),
                         "--acks", "1", "--batch-bytes", "2048", wrapper=wrapper)
    assert run.returncode == 0, run.stderr.decode()
    total = 0
    for p in range(2):
        consumed = subprocess.run([*wrapper, str(c_client.consume), "-b", node_addresses, "-t", topic_name,
                                   "-p", str(p), "-i", "3000", "-F", "offset,key,value,headers", "--hex"],
                                  capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S, check=False)
        assert consumed.returncode == 0, consumed.stderr
        total += len(consumed.stdout.splitlines())
    assert total == VALGRIND_RECORDS


def test_short_lived_producers_start_keyless_records_on_random_partitions(
        c_client: CClient, cluster: LocalCluster, admin: Admin, node_addresses: str, topic_name: str) -> None:
    """Each producer, C or Python, starts a topic's keyless records on a partition drawn
    at random (as Kafka's sticky partitioner): six one-record producers of each kind all
    landing on one of 16 partitions would happen by chance once in about a million runs."""
    partitions, runs = 16, 6
    admin.create_topic(topic_name, partitions=partitions, replication_factor=1)
    for n in range(runs):
        run = subprocess.run([str(c_client.produce), "-b", node_addresses, "-t", topic_name, "-q", "--acks", "1"],
                             input=f"c{n}\n".encode(), capture_output=True, timeout=PROCESS_TIMEOUT_S, check=False)
        assert run.returncode == 0, run.stderr.decode()
        with Producer(cluster.bootstrap, acks=1) as producer:
            producer.send(topic_name, f"py{n}".encode()).result(30)
    records = consume_all_python(cluster.bootstrap, topic_name, partitions, 2 * runs)
    by_kind: dict[str, set[int]] = defaultdict(set)
    for record in records:
        by_kind[bytes(record.value)[:1].decode()].add(record.partition)
    assert len(records) == 2 * runs
    assert len(by_kind["c"]) > 1 and len(by_kind["p"]) > 1, dict(by_kind)


_FLUSH_THEN_PRODUCE_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fabric.h>

static int failed, acknowledged;

static void on_delivery(const fabric_delivery_t *d, void *opaque) {
    (void)opaque;
    if (d->error) failed += (int)d->record_count;
    else acknowledged += (int)d->record_count;
}

/* argv: bootstrap topic. Round 1 is refused (the topic's limit was lowered after this
 * producer read it); round 2, produced right after the flush, must be batched by the new
 * limit. */
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.compression = FABRIC_CODEC_NONE;
    cfg.linger_ms = 1000;
    cfg.on_delivery = on_delivery;
    fabric_producer_t *p;
    if (fabric_producer_new(&p, argv[1], &cfg)) return 3;
    char value[1000];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 60; i++) {
            for (size_t j = 0; j < sizeof value; j++) value[j] = (char)rand();
            if (fabric_produce(p, argv[2], 0, NULL, -1, value, sizeof value, NULL, 0, -1)) return 4;
        }
        if (fabric_producer_flush(p, 30000)) return 5;
        printf("round %d: acknowledged %d failed %d\n", round, acknowledged, failed);
        fflush(stdout);
        if (round == 0) {  /* the first batch read the old limit: wait for the lower one */
            char line[16];
            if (fgets(line, sizeof line, stdin) == NULL) return 6;
        }
    }
    fabric_producer_destroy(p);
    return 0;
}
"""


def test_c_producer_batches_by_a_lowered_limit_right_after_a_flush(c_client: CClient, cluster: LocalCluster,
                                                                   admin: Admin, node_addresses: str,
                                                                   topic_name: str, tmp_path: Path) -> None:
    """A refusal (MESSAGE_TOO_LARGE) among a flush's last answers asks for METADATA; the
    flush now asks before it returns. Records produced right after it were batched by the
    old limit and refused again, until some later poll had refreshed (found writing a
    program from docs/C_CLIENT.md)."""
    admin.create_topic(topic_name, partitions=1, replication_factor=1)
    source = tmp_path / "flush_then_produce.c"
    source.write_text(_FLUSH_THEN_PRODUCE_C)
    binary = tmp_path / "flush_then_produce"
    subprocess.run(["gcc", "-Wall", "-Werror", *c_client.cflags, f"-I{c_client.root}", str(source), str(c_client.static_lib),
                    "-lzmq", "-llz4", "-lz", "-o", str(binary)], check=True, timeout=120)
    proc = subprocess.Popen([str(binary), node_addresses, topic_name], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "round 0: acknowledged 60 failed 0"
        admin.alter_topic_config(topic_name, {"message_bytes_max": 15_000})
        time.sleep(0.5)  # every node has the new limit
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "round 1: acknowledged 60 failed 60"  # sized by the old limit
        assert proc.stdout.readline().strip() == "round 2: acknowledged 120 failed 60"
        assert proc.wait(PROCESS_TIMEOUT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _c_blocks(name: str) -> list[str]:
    text = (Path(__file__).resolve().parents[2] / name).read_text()
    return [m.group(1) for m in re.finditer(r"^```c\n(.*?)^```", text, re.S | re.M)]


def test_the_c_programs_of_the_docs_build_and_run_as_written(c_client: CClient, admin: Admin, node_addresses: str,
                                                             topic_name: str, tmp_path: Path) -> None:
    """docs/C_CLIENT.md's producer and consumer, read from the file at test time (only the
    address and topic replaced): a reader who copied them found that they did not compile
    (statements outside any function, no includes, no main). On 6 partitions, as a reader
    ran them: the producer's key "user-42" goes to partition 1, and the consumer, which
    read partition 0 alone, printed nothing; it reads every partition now."""
    producer, consumer = _c_blocks("docs/C_CLIENT.md")
    admin.create_topic(topic_name, partitions=6, replication_factor=3)
    outputs = []
    for name, source in (("producer", producer), ("consumer", consumer)):
        path = tmp_path / f"{name}.c"
        path.write_text(source.replace("tcp://127.0.0.1:9092", node_addresses).replace('"events"', f'"{topic_name}"'))
        subprocess.run(["gcc", "-Wall", "-Wextra", "-Werror", *c_client.cflags, f"-I{c_client.root}", str(path),
                        str(c_client.static_lib), "-lzmq", "-llz4", "-lz", "-o", str(tmp_path / name)],
                       check=True, timeout=120)
        run = subprocess.run([str(tmp_path / name)], capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
        assert run.returncode == 0, run.stderr
        outputs.append(run.stdout)
    assert outputs[1] == "1/0: hello\n"
    (record,) = consume_all_python(node_addresses, topic_name, 6, 1)
    assert (record.key, record.value, [(n, bytes(v)) for n, v in record.headers]) == (
        b"user-42", b"hello", [("trace", b"abc")])
