"""Every benchmark refuses a bad argument before it starts anything: a usage error, exit
status 2. ``--messages -5`` used to start a cluster and end in a traceback (bench.bulk,
bench.growth, bench.queues) or in a run that measured nothing and exited 0
(bench.c_client, bench.secure, bench.node_cpu). And the JSON keys of the one benchmark
that needs no cluster match the list in docs/BENCHMARKS.md (it printed no JSON at all).
"""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (module, arguments): each must be refused with exit status 2 and a one-line error.
BAD = [
    ("bench.throughput", ["--messages", "-5"]),
    ("bench.throughput", ["--sizes", "abc"]),
    ("bench.replication", ["--repeats", "0"]),
    ("bench.replication", ["--failovers", "-1"]),
    ("bench.bulk", ["--messages", "-5"]),
    ("bench.bulk", ["--chunk", "0"]),
    ("bench.growth", ["--messages", "-5"]),
    ("bench.growth", ["--retained-mb", "x"]),
    ("bench.growth", ["--producers-nice", "20"]),
    ("bench.storage_layout", ["--partitions", "0"]),
    ("bench.storage_layout", ["--retained-gb", "0.0001"]),
    ("bench.c_client", ["--messages", "-5"]),
    ("bench.spark_read", ["--messages", "-5"]),
    ("bench.groups", ["--rounds", "0"]),
    ("bench.groups", ["--hold-s", "nan"]),
    ("bench.sequencer", ["--seconds", "-1"]),
    ("bench.strict_order", ["--messages", "-5"]),
    ("bench.partitions_scale", ["--partitions", "-1"]),
    ("bench.peers", ["--messages", "-5"]),
    ("bench.direct", ["--requests", "0"]),
    ("bench.queues", ["--messages", "-5"]),
    ("bench.queues", ["--workers", "1,x"]),
    ("bench.secure", ["--messages", "-5"]),
    ("bench.node_cpu", ["--messages", "-5"]),
    ("bench.validate", ["--number", "0"]),
    ("bench.validate", ["--frob"]),
]


@pytest.mark.parametrize(("module", "argv"), BAD, ids=[f"{m}{' '.join(a)}" for m, a in BAD])
def test_a_bad_argument_is_a_usage_error(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    name = "python -m bench" if module == "bench.throughput" else f"python -m {module}"
    assert err.strip().splitlines()[-1].startswith(f"{name}: error: argument {argv[0]}") or "unrecognized" in err


def _expand(pattern: str) -> set[str]:
    """``a_{b,c}_d`` -> {a_b_d, a_c_d}; ``{,s}`` gives the empty form too."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return {pattern}
    out: set[str] = set()
    for choice in match.group(1).split(","):
        out |= _expand(pattern[:match.start()] + choice + pattern[match.end():])
    return out


def documented_keys(command: str, **placeholders: str) -> set[str]:
    """The keys docs/BENCHMARKS.md's "JSON keys" section lists for ``command``."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    section = text[text.index("## JSON keys"):]
    section = section[:section.index("\n## ")]
    bullet = re.search(rf"^\* `{re.escape(command)}`.*?(?=^\* |\Z)", section, re.M | re.S)
    assert bullet is not None, command
    keys: set[str] = set()
    for token in re.findall(r"`([^`]+)`", bullet.group(0))[1:]:
        if not re.fullmatch(r"[a-z0-9_{},.\[\]]+", token):
            continue  # a flag, a command, a value
        for name, value in placeholders.items():
            token = token.replace("{" + name + "}", value)
        keys |= _expand(token)
    return keys


def assert_keys_documented(printed: set[str], documented: set[str]) -> None:
    assert printed - documented == set(), "printed but not documented"
    # A documented token is a key, or (in a remark) the tail of one.
    missing = {k for k in documented if k not in printed and not any(p.endswith("_" + k) for p in printed)}
    assert missing == set(), "documented but not printed"


def test_storage_layout_prints_its_documented_json_last(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import storage_layout

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    assert storage_layout.main(["--retained-gb", "0.01", "--more-gb", "0.01", "--partitions", "2"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert_keys_documented(set(figures), documented_keys("bench.storage_layout"))
    # sequence over partition (the baseline), from the unrounded times: about the rounded ones'
    assert figures["ratio_fill_s_sequence_to_partition"] == pytest.approx(
        figures["sequence_fill_s"] / figures["partition_fill_s"], rel=0.2)
    assert list(tmp_path.iterdir()) == []  # its RocksDB directories are gone


def test_the_docs_key_reader_expands_braces() -> None:
    assert _expand("{single,sixteen}_producer{,s}_msgs_per_s") == {
        "single_producer_msgs_per_s", "single_producers_msgs_per_s",
        "sixteen_producer_msgs_per_s", "sixteen_producers_msgs_per_s"}
    assert "produce_100b_ratio_to_baseline" in documented_keys("bench.throughput", size="100")


def test_a_reader_that_gets_nothing_for_too_long_ends_the_run_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A benchmark's reader waited for ever for a record that never came; past
    READ_STALL_S_MAX without one it ends the run: one line, exit status 1."""
    from bench import _cli

    now = time.perf_counter()
    assert _cli.read_stalled(5, 10, now) and not _cli.read_stalled(10, 10, now - 1_000)
    with pytest.raises(_cli.BenchError, match="read 5 of 10 records"):
        _cli.read_stalled(5, 10, now - _cli.READ_STALL_S_MAX - 1)

    def stalled() -> int:
        _cli.read_stalled(1, 2, time.perf_counter() - _cli.READ_STALL_S_MAX - 1)
        return 0

    with pytest.raises(SystemExit) as exited:
        _cli.run(stalled)
    assert exited.value.code == 1
    assert capsys.readouterr().err.startswith("error: read 1 of 2 records")


def test_failovers_that_never_ended_are_counted_apart() -> None:
    """max() and median() over a list holding a NaN answer by its order: a failover that
    never ended could vanish from both figures."""
    from bench.stats import ended

    assert ended([1.0, float("nan"), 3.0]) == ([1.0, 3.0], 1)
    assert ended([]) == ([], 0)
