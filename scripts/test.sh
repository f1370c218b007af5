#!/usr/bin/env bash
# Install everything, lint and type-check, then run the whole test suite
# (unit, integration, fault, spark, interop). Arguments go to pytest, e.g.
#   scripts/test.sh -m "not slow"        the quick set while developing
set -euo pipefail
cd "$(dirname "$0")/.."
FABRIC_EXTRAS="spark,dev,bench" scripts/install.sh
export PYSPARK_PYTHON="$(command -v python3)"
# Node processes and Spark workers import this checkout, whatever else is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python3 -m ruff check .
python3 -m mypy
if [ $# -eq 0 ]; then
  # The producer's and the batch checks' tests once more on the pure-Python paths: the
  # compiled fast paths (sdk/_speedups.pyx, fabric/protocol/_columns.pyx) must behave the
  # same, and machines without a compiler run these.
  FABRIC_PURE_PYTHON=1 python3 -m pytest -q -p no:cacheprovider tests/unit/test_speedups.py tests/unit/test_sticky_partitioner.py tests/unit/test_producer_inputs.py \
    tests/unit/test_record_columns.py tests/unit/test_produce_validation.py tests/integration/test_produce_validation.py \
    tests/integration/test_roundtrip.py tests/integration/test_producer_exit.py tests/integration/test_send_batch.py
fi
# The slowest tests at the end of the log: CI's budget is 30 minutes, and this says where it goes.
exec python3 -m pytest -q --durations=25 "$@"
