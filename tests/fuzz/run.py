"""Coverage-guided fuzzing of the protocol decoders with atheris (libFuzzer for Python).

    python3 -m tests.fuzz.run TARGET [libFuzzer options...]
    python3 -m tests.fuzz.run batch -max_total_time=3600 -jobs=2   # a long run
    python3 -m tests.fuzz.run all -runs=20000 -seed=1              # every target, bounded

TARGET is one of tests.fuzz.targets.TARGETS or ``all``. The seed corpus (valid inputs of
every schema and both batch codecs) is written to ``.fuzz/corpus/TARGET`` and grows as the
fuzzer finds new coverage; crash inputs go to ``.fuzz/crashes/`` (``-artifact_prefix``).
A crash becomes a regression vector: copy it to ``tests/vectors/fuzz/TARGET-NAME.bin`` and
``tests/unit/test_fuzz_vectors.py`` replays it for ever after.

The RSS cap (``-rss_limit_mb``, default here 1024) is the allocation property: a decoder
that believed a length or an lz4 size claim would blow through it and count as a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["fabric"]):
    from tests.fuzz import targets

ROOT = Path(os.environ.get("FABRIC_FUZZ_DIR", ".fuzz"))
DEFAULT_OPTIONS = ["-rss_limit_mb=1024", "-max_len=65536", "-timeout=10"]


def prepare_corpus(target: str) -> Path:
    corpus = ROOT / "corpus" / target
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(targets.seeds(target)):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    (ROOT / "crashes").mkdir(parents=True, exist_ok=True)
    return corpus


def run_one(target: str, options: list[str]) -> None:
    """Runs libFuzzer in this process; atheris exits the process when the run ends."""
    corpus = prepare_corpus(target)
    argv = [sys.argv[0], *DEFAULT_OPTIONS, f"-artifact_prefix={ROOT / 'crashes'}/{target}-", *options, str(corpus)]
    atheris.Setup(argv, targets.TARGETS[target])
    atheris.Fuzz()


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in {*targets.TARGETS, "all"}:
        print(f"usage: python3 -m tests.fuzz.run TARGET|all [libFuzzer options]; targets: {', '.join(targets.TARGETS)}",
              file=sys.stderr)
        return 2
    target, options = sys.argv[1], sys.argv[2:]
    if target != "all":
        run_one(target, options)
        return 0
    # libFuzzer runs once per process, so "all" runs each target in a child process.
    failed = []
    for name in targets.TARGETS:
        code = subprocess.call([sys.executable, "-m", "tests.fuzz.run", name, *options])
        print(f"fuzz target {name}: exit {code}", file=sys.stderr)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"fuzz targets with crashes: {', '.join(failed)} (inputs in {ROOT / 'crashes'})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
